package read

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// env is a real deployment in one process: an embedded nats-server with
// JetStream on loopback, a processor deciding, and the handler of this
// package on an httptest server.
type env struct {
	srv    *embedded.Test
	ctx    context.Context
	cfg    processor.Config
	signer *attest.Signer
	h      *Handler
	http   *httptest.Server // the first server
	last   *httptest.Server // the latest server
}

// newEnv starts the server and the processor (signing with a key of its
// own, which the handler trusts), and serves h with access and cfg.
func newEnv(t *testing.T, access Access, cfg Config) *env {
	t.Helper()
	e := &env{srv: embedded.StartTest(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	var err error
	e.signer, err = attest.Generate()
	require.NoError(t, err)
	e.cfg = processor.Config{Partitions: 1, LeaseTTL: 2 * time.Second, SigningKey: string(e.signer.Seed())}
	proc, err := processor.New(ctx, e.srv.JS, e.cfg)
	require.NoError(t, err)
	pctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- proc.Run(pctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("processor: %v", err)
			}
		case <-time.After(30 * time.Second):
			proc.Abort()
			<-done
			t.Errorf("the processor did not drain within 30s")
		}
	})
	if cfg.Trust.Empty() {
		cfg.Trust, err = attest.ParseKeys(e.signer.PublicKey())
		require.NoError(t, err)
	}
	e.h = e.serve(t, access, cfg)
	return e
}

// serve starts another httptest server with a handler of its own.
func (e *env) serve(t *testing.T, access Access, cfg Config) *Handler {
	t.Helper()
	h, err := New(e.srv.JS, access, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	h.Register(mux)
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	if e.http == nil {
		e.http = s
	}
	e.last = s
	return h
}

// chainStory is session s: opened, three turns, an unsafe compaction
// (refused, spill s/1.jsonl), two turns and another (refused, spill
// s/2.jsonl after s/1.jsonl): four verdicts.
func chainStory(s string) []string {
	ev := func(n int, typ, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"%s-%d","source":"urn:test","type":"io.seamguard.%s","subject":"%s","data":%s}`, s, n, typ, s, data)
	}
	turn := func(n, off int) string {
		return ev(n, "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"content":"turn %d of %s"}`, off, off, s))
	}
	req := func(n, head int) string {
		return ev(n, "compaction.requested", fmt.Sprintf(`{"request_id":"r%d","summarizer_input":{"start":0,"end":%d},"summary_range":{"start":0,"end":0},"tail_start":%d}`, n, head, head))
	}
	return []string{
		ev(1, "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`),
		turn(2, 0), turn(3, 1), turn(4, 2), req(5, 3), turn(6, 3), turn(7, 4), req(8, 5),
	}
}

// play publishes lines on their session's subject (structured mode) and
// waits until the verdict stream holds at least want verdicts in all.
func (e *env) play(t *testing.T, session string, lines []string, want uint64) {
	t.Helper()
	for _, l := range lines {
		_, err := e.srv.JS.Publish(e.ctx, e.cfg.Subjects().Events(session), []byte(l))
		require.NoError(t, err)
	}
	e.waitVerdicts(t, want)
}

// waitVerdicts polls the verdict stream until it holds want messages.
func (e *env) waitVerdicts(t *testing.T, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		str, err := e.srv.JS.Stream(e.ctx, e.cfg.Names().Verdicts)
		if err == nil && str.CachedInfo().State.Msgs >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the verdict stream does not hold %d verdicts after 30s (%v)", want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stored returns the verdict stream's message at seq.
func (e *env) stored(t *testing.T, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	str, err := e.srv.JS.Stream(e.ctx, e.cfg.Names().Verdicts)
	require.NoError(t, err)
	m, err := str.GetMsg(e.ctx, seq)
	require.NoError(t, err)
	return m
}

// get sends a GET (or another method) to path on server base, with header
// pairs.
func get(t *testing.T, base, method, path string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, base+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

func body(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// sseEvent is one event, or one comment (Comment set), as a client
// parses it.
type sseEvent struct {
	ID, Event, Data string
	Comment         string
}

// sseStream is an open event stream.
type sseStream struct {
	resp   *http.Response
	cancel context.CancelFunc
	events chan sseEvent
}

// openSSE opens path on base and parses its events (and comments) into a
// channel until the stream ends or Close.
func openSSE(t *testing.T, base, path string, header ...string) (*sseStream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		cancel()
		return nil, resp
	}
	s := &sseStream{resp: resp, cancel: cancel, events: make(chan sseEvent, 100)}
	go func() {
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		var ev sseEvent
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Comment != "" || data != nil || ev.ID != "" {
					ev.Data = strings.Join(data, "\n")
					s.events <- ev
				}
				ev, data = sseEvent{}, nil
			case strings.HasPrefix(line, ":"):
				ev.Comment = strings.TrimPrefix(line, ": ")
			default:
				k, v, _ := strings.Cut(line, ":")
				v = strings.TrimPrefix(v, " ")
				switch k {
				case "id":
					ev.ID = v
				case "event":
					ev.Event = v
				case "data":
					data = append(data, v)
				}
			}
		}
	}()
	t.Cleanup(s.Close)
	return s, resp
}

// Close ends the client's side of the stream.
func (s *sseStream) Close() {
	s.cancel()
	s.resp.Body.Close()
}

// next returns the next event, skipping comments, or fails the test after
// within.
func (s *sseStream) next(t *testing.T, within time.Duration) sseEvent {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("the event stream ended")
			}
			if ev.Comment != "" && ev.ID == "" {
				continue
			}
			return ev
		case <-timer.C:
			t.Fatalf("no event within %s", within)
		}
	}
}

// none fails the test if an event (not a comment) comes within d.
func (s *sseStream) none(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				return
			}
			if ev.Comment != "" && ev.ID == "" {
				continue
			}
			t.Fatalf("unexpected event %+v", ev)
		case <-timer.C:
			return
		}
	}
}

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// onlySession is an Access that lets the caller read one session, and
// denies with 401 a request without an Authorization header.
type onlySession string

func (a onlySession) Session(r *http.Request, s string) error {
	if r.Header.Get("Authorization") == "" {
		return Deny(http.StatusUnauthorized, "a bearer token is required")
	}
	if s != string(a) {
		return fmt.Errorf("token for %s: %w", a, Deny(http.StatusForbidden, "this token may not read session %s", s))
	}
	return nil
}

func (a onlySession) Operator(r *http.Request) error {
	if r.Header.Get("Authorization") == "" {
		return Deny(http.StatusUnauthorized, "a bearer token is required")
	}
	return errors.New("only operators may read every session")
}

// forge publishes body on a verdict subject with headers h, as a
// misconfigured permission would let anyone.
func (e *env) forge(t *testing.T, subject string, h nats.Header, body []byte) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Header = h
	m.Data = body
	_, err := e.srv.JS.PublishMsg(e.ctx, m)
	require.NoError(t, err)
}
