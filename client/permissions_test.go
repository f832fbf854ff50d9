package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// TestAgentPermissions runs the client as the agent identity of the shipped
// deploy/nats/standalone.conf, against a processor running as the processor
// identity: the whole refuse-spill-retry flow, and reading the spill back
// through the processor's recover service, work without one permissions
// violation, so the client needs no JetStream API access. The operator
// identity finds the service with micro's discovery and reads the same
// spill from the object store. The agent hears the rejection of its own
// event (OnRejected) with the same permissions.
func TestAgentPermissions(t *testing.T) {
	srv := embedded.StartShippedTest(t, "../deploy/nats/standalone.conf")

	var mu sync.Mutex
	var violations []error
	// Each identity with its own inbox prefix (deploy/nats/permissions.conf):
	// agents keep NATS's default.
	inboxes := map[string]string{"processor": "_INBOX_processor", "operator": "_INBOX_operator"}
	connect := func(user, password string) *nats.Conn {
		opts := []nats.Option{nats.UserInfo(user, password),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				defer mu.Unlock()
				violations = append(violations, err)
			})}
		if p := inboxes[user]; p != "" {
			opts = append(opts, nats.CustomInboxPrefix(p))
		}
		nc, err := nats.Connect(srv.ClientURL(), opts...)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}

	ctx := testContext(t)
	pjs, err := jetstream.New(connect("processor", "processor-test"))
	require.NoError(t, err)
	// The recover service answers as the responder, which may publish to
	// inboxes alone.
	p, err := processor.New(ctx, pjs, processorConfig(), processor.WithResponder(connect("responder", "responder-test")))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	c, err := client.New(connect("agent", "agent-test"), client.Config{})
	require.NoError(t, err)
	rejected := make(rejections, 4)
	s, err := c.Open(ctx, client.SessionConfig{ID: "least-privilege", Span: 4, OnRejected: rejected.handler})
	require.NoError(t, err)
	for range 12 {
		_, err := s.Append(ctx, client.Turn{Content: "turn"})
		require.NoError(t, err)
	}
	require.NoError(t, s.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget"))
	v, err := s.Compact(ctx, events.CompactionRequested{
		RequestID:       "c1",
		SummarizerInput: events.Range{Start: 3, End: 12},
		SummaryRange:    events.Range{Start: 3, End: 8},
		TailStart:       8,
	})
	require.NoError(t, err)
	require.NotNil(t, v.Allowed())
	require.NotNil(t, v.Previous)
	require.NotNil(t, v.Previous.Refused().Spill)
	require.NoError(t, s.Commit(ctx, "c1"))

	h := *v.Previous.Refused().Spill
	var got bytes.Buffer
	chain, err := s.Recover(ctx, h, &got)
	require.NoError(t, err)
	require.Equal(t, []events.SpillHandle{h}, chain)
	_, err = s.Recover(ctx, events.SpillHandle{Name: "someone-else/1.jsonl"}, &bytes.Buffer{})
	require.ErrorIs(t, err, client.ErrSpillForbidden)
	// The agent hears its rejections: a second open with another floor.
	other := make(rejections, 4)
	_, err = c.Open(ctx, client.SessionConfig{ID: "least-privilege", Span: 9, Head: 12, OnRejected: other.handler})
	require.NoError(t, err)
	assert.Equal(t, events.CodeAlreadyOpen, other.next(t, 10*time.Second).Rejection.Code)
	rejected.none(t, 0)
	require.NoError(t, s.Close(ctx))

	op := connect("operator", "operator-test")
	ojs, err := jetstream.New(op)
	require.NoError(t, err)
	var want bytes.Buffer
	_, err = (&spill.Store{JS: ojs, Stream: "SEAMGUARD_EVENTS", Bucket: h.Bucket}).GetChain(ctx, h.Name, &want)
	require.NoError(t, err)
	require.Equal(t, want.String(), got.String())
	m, err := op.RequestWithContext(ctx, "$SRV.INFO.seamguard", nil)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(m.Data, &info))
	require.Len(t, info.Endpoints, 1)
	require.Equal(t, "seamguard.recover.*", info.Endpoints[0].Subject)

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations)
}
