package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// TestAgentPermissions runs the client as the agent identity of the shipped
// deploy/nats/standalone.conf, against a processor running as the processor
// identity: the whole refuse-spill-retry flow works without one permissions
// violation, so the client needs no JetStream API access.
func TestAgentPermissions(t *testing.T) {
	for k, v := range map[string]string{
		"NATS_AGENT_PASSWORD":     "agent-test",
		"NATS_PROCESSOR_PASSWORD": "processor-test",
		"NATS_OPERATOR_PASSWORD":  "operator-test",
	} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile("../deploy/nats/standalone.conf")
	require.NoError(t, err)
	opts.Port = server.RANDOM_PORT
	opts.HTTPPort = 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(10*time.Second))

	var mu sync.Mutex
	var violations []error
	connect := func(user, password string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, password),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				defer mu.Unlock()
				violations = append(violations, err)
			}))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}

	ctx := testContext(t)
	pjs, err := jetstream.New(connect("processor", "processor-test"))
	require.NoError(t, err)
	p, err := processor.New(ctx, pjs, processorConfig())
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
	s, err := c.Open(ctx, "least-privilege", events.UnitTurns, 4)
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
	require.NoError(t, s.Close(ctx))

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations)
}
