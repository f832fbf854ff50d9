package read

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// TestOperatorPermissions: both endpoints work on a connection with the
// shipped operator identity (deploy/nats/permissions.conf): read only, no
// consumer API at all, verdicts woken by its subscription to them. (The
// shipped processor identity cannot read the verdict stream: it has no
// direct get on it.)
func TestOperatorPermissions(t *testing.T) {
	srv := embedded.StartShippedTest(t, "../../deploy/nats/standalone.conf")

	var mu sync.Mutex
	var violations []string
	connect := func(user, inbox string) jetstream.JetStream {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user+"-test"), nats.CustomInboxPrefix(inbox),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				defer mu.Unlock()
				violations = append(violations, user+": "+err.Error())
			}))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return js
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pjs := connect("processor", "_INBOX_processor")
	cfg := processor.Config{Partitions: 1, LeaseTTL: 2 * time.Second}
	p, err := processor.New(ctx, pjs, cfg, processor.WithResponder(connect("responder", "_INBOX_responder").Conn()))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	// The agent publishes the session's events.
	ajs := connect("agent", "_INBOX")
	for _, l := range chainStory("s")[:5] {
		_, err := ajs.Publish(ctx, cfg.Subjects().Events("s"), []byte(l))
		require.NoError(t, err)
	}

	h, err := New(connect("operator", "_INBOX_operator"), Loopback{}, Config{Trust: mustTrust(t, p.SigningPublicKey())})
	require.NoError(t, err)
	mux := http.NewServeMux()
	h.Register(mux)
	hs := httptest.NewServer(mux)
	defer hs.Close()

	s, resp := openSSE(t, hs.URL, "/v1/verdicts?session=s")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	assert.Equal(t, "io.seamguard.transcript.spilled", s.next(t, wait).Event)
	assert.Equal(t, "io.seamguard.compaction.refused", s.next(t, wait).Event)

	resp = get(t, hs.URL, http.MethodGet, "/v1/sessions/s/spills/1")
	b := body(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	assert.Equal(t, 5, strings.Count(string(b), "\n"))
	s.Close()
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, violations)
}
