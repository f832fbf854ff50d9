package forward_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/forward"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// env is an embedded server with the deployment's streams, a processor
// key to sign verdicts with, and a verifier that trusts it.
type env struct {
	*embedded.Test
	key *attest.Signer
	ver *attest.Verifier
	n   int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := processor.Provision(ctx, srv.JS, processor.Config{})
	require.NoError(t, err)
	key, err := attest.Generate()
	require.NoError(t, err)
	ver, err := attest.NewVerifier(events.Subjects{}, key.PublicKey())
	require.NoError(t, err)
	return &env{Test: srv, key: key, ver: ver}
}

// verdict publishes a signed verdict of kind about session, as the
// processor does, and returns its id and stream sequence.
func (e *env) verdict(t *testing.T, session, kind string) (string, uint64) {
	t.Helper()
	return e.publish(t, e.key, session, kind)
}

func (e *env) publish(t *testing.T, key *attest.Signer, session, kind string) (string, uint64) {
	t.Helper()
	e.n++
	o := events.Output{Session: session, Cause: events.Cause{ID: fmt.Sprintf("in-%d", e.n), Source: "urn:agent:test"}}
	switch kind {
	case events.KindAllowed:
		o.Type, o.Data = events.TypeCompactionAllowed, &events.CompactionAllowed{RequestID: fmt.Sprintf("r%d", e.n)}
	case events.KindRefused:
		o.Type, o.Data = events.TypeCompactionRefused, &events.CompactionRefused{RequestID: fmt.Sprintf("r%d", e.n), Next: events.NextRetry,
			Reasons: []events.Reason{{Code: "floor_not_in_tail", Message: "offsets 0 to 8 are at risk", AtRisk: []events.Range{{Start: 0, End: 8}}}}}
	case events.KindHalted:
		o.Type, o.Data = events.TypeSessionHalted, &events.SessionHalted{RequestID: fmt.Sprintf("r%d", e.n), Message: "halted"}
	case events.KindViolation:
		o.Type, o.Data = events.TypeCompactionViolation, &events.CompactionViolation{RequestID: fmt.Sprintf("r%d", e.n), Message: "violation"}
	default:
		t.Fatalf("no test verdict of kind %s", kind)
	}
	enc := events.Encoder{Source: "urn:seamguard:test", Now: func() time.Time { return time.Date(2026, 12, 3, 7, 0, 0, e.n, time.UTC) }}
	id, subject, body, err := enc.Encode(o)
	require.NoError(t, err)
	m := nats.NewMsg(subject)
	m.Data = body
	m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	if key != nil {
		key.SignMsg(m.Header, body)
	}
	ack, err := e.JS.PublishMsg(context.Background(), m, jetstream.WithMsgID(id))
	require.NoError(t, err)
	return id, ack.Sequence
}

// stored returns the verdict of sequence seq as the stream holds it.
func (e *env) stored(t *testing.T, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := e.JS.Stream(context.Background(), "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	m, err := s.GetMsg(context.Background(), seq)
	require.NoError(t, err)
	return m
}

// received is one request a receiver got, decoded with sdk-go.
type received struct {
	event  event.Event
	header http.Header
	body   []byte
	status int
	at     time.Time
}

// receiver is an httptest server that decodes each request with sdk-go's
// HTTP binding and answers what answer says (200 when nil).
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []received
	answer func(n int, ev event.Event) (status int, delay time.Duration)
}

func newReceiver(t *testing.T, answer func(n int, ev event.Event) (int, time.Duration)) *receiver {
	r := &receiver{answer: answer}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		ev, err := binding.ToEvent(req.Context(), cehttp.NewMessageFromHttpRequest(req))
		if err != nil {
			http.Error(w, "not a CloudEvent: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		n := len(r.got)
		status, delay := http.StatusOK, time.Duration(0)
		if r.answer != nil {
			status, delay = r.answer(n, *ev)
		}
		r.got = append(r.got, received{event: *ev, header: req.Header.Clone(), body: body, status: status, at: time.Now()})
		r.mu.Unlock()
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-req.Context().Done():
			}
		}
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

// delivered returns the ids of the events answered 2xx, in order.
func (r *receiver) delivered() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for _, g := range r.got {
		if g.status/100 == 2 {
			ids = append(ids, g.event.ID())
		}
	}
	return ids
}

func (r *receiver) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// run starts f and returns a function that stops it and returns Run's error.
func run(t *testing.T, f *forward.Forwarder) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	stopped := false
	var err error
	stop := func() error {
		if stopped {
			return err
		}
		stopped = true
		cancel()
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Error("the forwarder did not stop")
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fast is a config for tests: short backoffs.
func fast(to string) forward.Config {
	return forward.Config{To: to, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Timeout: 2 * time.Second}
}

func (e *env) forwarder(t *testing.T, cfg forward.Config) *forward.Forwarder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := forward.New(ctx, e.JS, cfg, forward.WithLogger(quiet()), forward.WithVerifier(e.ver))
	require.NoError(t, err)
	return f
}

// consumerIdle reports whether the consumer has nothing pending or unacknowledged.
func (e *env) consumerIdle(t *testing.T, name string) bool {
	c, err := e.JS.Consumer(context.Background(), "SEAMGUARD_VERDICTS", name)
	if err != nil {
		return false
	}
	info, err := c.Info(context.Background())
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

func mustJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}
