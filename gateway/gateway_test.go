package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/gateway"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

const eventsStream = "SEAMGUARD_EVENTS"

// env is a real embedded NATS server, a real processor (running unless
// asked not to) and the gateway on an httptest server.
type env struct {
	*embedded.Test
	ctx context.Context
	gw  *gateway.Server
	url string
}

type opts struct {
	noProcessor bool
	tokens      *gateway.Tokens
	cfg         func(*gateway.Config)
}

func newEnv(t testing.TB, o opts) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := &env{Test: embedded.StartTest(t), ctx: ctx}
	p, err := processor.New(ctx, e.JS, processor.Config{Source: "urn:seamguard:test", Partitions: 1, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	if !o.noProcessor {
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(rctx) }()
		t.Cleanup(func() {
			stop()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("the processor did not stop within 30s")
			}
		})
	}
	cfg := gateway.Config{Agent: e.NC, Operator: e.NC, Reader: e.JS, Verdicts: e.JS, Auth: &gateway.Auth{Tokens: o.tokens},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	e.gw, err = gateway.New(cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(e.gw)
	t.Cleanup(hs.Close)
	e.url = hs.URL
	return e
}

// testWriter writes the gateway's log lines to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// storedMsgs is how many messages the events stream holds.
func (e *env) storedMsgs(t *testing.T) uint64 {
	t.Helper()
	s, err := e.JS.Stream(e.ctx, eventsStream)
	require.NoError(t, err)
	info, err := s.Info(e.ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// ev is a structured event of session with the given type and data.
func ev(session, source, id, typ, data string) string {
	return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":%q,"type":"io.seamguard.%s","subject":%q,"datacontenttype":"application/json","data":%s}`, id, source, typ, session, data)
}

func opened(session string) string {
	return ev(session, "urn:agent:a", session+"-open", "session.opened", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`)
}

func turn(session string, off int) string {
	return ev(session, "urn:agent:a", fmt.Sprintf("%s-t%d", session, off), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"content":"turn %d"}`, off, off))
}

func request(session, id string) string {
	return ev(session, "urn:agent:a", id, "compaction.requested", `{"request_id":"c1","summarizer_input":{"start":0,"end":8},"summary_range":{"start":0,"end":6},"tail_start":6}`)
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(a.body, &m), "%s", a.body)
	return m
}

// post sends body to path with the given headers ("Content-Type" and ce-*,
// "Authorization").
func (e *env) post(t *testing.T, path string, hdr map[string]string, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, e.url+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return answer{status: res.StatusCode, header: res.Header, body: b}
}

var structured = map[string]string{"Content-Type": "application/cloudevents+json"}

func batchOf(evs ...string) string { return "[" + strings.Join(evs, ",") + "]" }

var batchCT = map[string]string{"Content-Type": "application/cloudevents-batch+json"}

func TestPostModes(t *testing.T) {
	e := newEnv(t, opts{})
	a := e.post(t, "/v1/events", structured, opened("s1"))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "structured", a.header.Get(gateway.HeaderMode))

	bin := map[string]string{
		"Content-Type": "application/json", "Ce-Specversion": "1.0", "Ce-Id": "s1-t0", "Ce-Source": "urn:agent:a",
		"Ce-Type": events.TypeTurnAppended, "Ce-Subject": "s1", "Authorization": "Bearer not-stored",
	}
	a = e.post(t, "/v1/events", bin, `{"offset":0,"size":1,"content":"turn 0"}`)
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "binary", a.header.Get(gateway.HeaderMode))
	require.Equal(t, "0", a.header.Get(gateway.HeaderDuplicates))

	a = e.post(t, "/v1/events", batchCT, batchOf(turn("s1", 1), turn("s1", 2), turn("s1", 3)))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "batch", a.header.Get(gateway.HeaderMode))
	require.Len(t, a.json(t)["events"], 3)
	require.Equal(t, uint64(5), e.storedMsgs(t))

	// The binary event is stored as the NATS binary message, on the
	// session's subject, with Nats-Msg-Id from (source, id) and nothing
	// else of the HTTP request.
	s, err := e.JS.Stream(e.ctx, eventsStream)
	require.NoError(t, err)
	m, err := s.GetMsg(e.ctx, 2)
	require.NoError(t, err)
	require.Equal(t, "seamguard.partitioned.0.events.s1", m.Subject)
	require.Equal(t, events.MsgID("urn:agent:a", "s1-t0"), m.Header.Get("Nats-Msg-Id"))
	require.Equal(t, "s1-t0", m.Header.Get("ce-id"))
	require.Empty(t, m.Header.Get("Authorization"))
	got, err := events.DecodeMsg(m.Subject, m.Header, m.Data, events.Subjects{Partitions: 1})
	require.NoError(t, err)
	require.Equal(t, "s1", got.Subject)
}

// TestPostRejects: the answer to a bad event is the rejection the NATS
// decoder gives for the same message (code, field, message), and nothing
// is stored.
func TestPostRejects(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true})
	for _, c := range []struct {
		name  string
		hdr   map[string]string
		body  string
		field string
	}{
		{"structured no id", structured, `{"specversion":"1.0","source":"urn:a","type":"io.seamguard.turn.appended","subject":"s","data":{"offset":0,"size":1}}`, "id"},
		{"structured bad offset", structured, ev("s", "urn:a", "x", "turn.appended", `{"offset":-1,"size":1}`), "data.offset"},
		{"structured bad session", structured, ev("bad.session", "urn:a", "x", "turn.appended", `{"offset":0,"size":1}`), "subject"},
		{"structured unknown type", structured, ev("s", "urn:a", "x", "turn.deleted", `{"offset":0,"size":1}`), "type"},
		{"binary bad size", map[string]string{"Content-Type": "application/json", "Ce-Specversion": "1.0", "Ce-Id": "x", "Ce-Source": "urn:a", "Ce-Type": events.TypeTurnAppended, "Ce-Subject": "s"}, `{"offset":0,"size":"one"}`, "data.size"},
		{"binary old specversion", map[string]string{"Content-Type": "application/json", "Ce-Specversion": "0.3", "Ce-Id": "x", "Ce-Source": "urn:a", "Ce-Type": events.TypeTurnAppended, "Ce-Subject": "s"}, `{"offset":0,"size":1}`, "specversion"},
		{"not json", structured, `this is not json`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := e.post(t, "/v1/events", c.hdr, c.body)
			require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
			var rej gateway.Rejection
			require.NoError(t, json.Unmarshal(a.body, &rej), "%s", a.body)
			require.Equal(t, events.TypeEventRejected, rej.Type)
			require.Equal(t, c.field, rej.Data.Field, "%s", a.body)
			require.NotEmpty(t, rej.Data.Message)

			// The same message on NATS: the same rejection.
			h := nats.Header{}
			for k, v := range c.hdr {
				if k == "Content-Type" {
					h.Set(k, v)
				} else {
					h[strings.ToLower(k)] = []string{v}
				}
			}
			session := "s"
			if strings.Contains(c.body, "bad.session") {
				session = "_invalid"
			}
			_, err := events.DecodeMsg("seamguard.events."+session, h, []byte(c.body), events.Subjects{})
			var want *events.Error
			require.ErrorAs(t, err, &want)
			require.Equal(t, want.Code, rej.Data.Code)
			require.Equal(t, want.Field, rej.Data.Field)
			require.Equal(t, want.Message, rej.Data.Message)
		})
	}
	require.Equal(t, uint64(0), e.storedMsgs(t), "nothing of a rejected request is stored")
}

func TestBatchAllOrNothing(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true})
	bad := ev("s", "urn:agent:a", "bad", "turn.appended", `{"offset":2,"size":"x"}`)
	a := e.post(t, "/v1/events", batchCT, batchOf(opened("s"), turn("s", 0), bad, turn("s", 1)))
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	var rej gateway.Rejection
	require.NoError(t, json.Unmarshal(a.body, &rej))
	require.Equal(t, 2, rej.BatchIndex)
	require.Equal(t, "data.size", rej.Data.Field)
	require.Equal(t, "bad", rej.CausationID)
	require.Equal(t, uint64(0), e.storedMsgs(t))

	// The same (source, id) twice in a batch with different content.
	a = e.post(t, "/v1/events", batchCT, batchOf(turn("s", 0), strings.Replace(turn("s", 1), `"s-t1"`, `"s-t0"`, 1)))
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	require.NoError(t, json.Unmarshal(a.body, &rej))
	require.Equal(t, 1, rej.BatchIndex)
	require.Equal(t, "id", rej.Data.Field)

	for _, body := range []string{`[]`, `{"not":"an array"}`} {
		a = e.post(t, "/v1/events", batchCT, body)
		require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	}
	require.Equal(t, uint64(0), e.storedMsgs(t))
}

func TestOversize(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true, cfg: func(c *gateway.Config) { c.MaxEventBytes = 2048; c.MaxBatchBytes = 4096 }})
	big := ev("s", "urn:a", "x", "turn.appended", fmt.Sprintf(`{"offset":0,"size":1,"content":%q}`, strings.Repeat("x", 3000)))
	a := e.post(t, "/v1/events", structured, big)
	require.Equal(t, http.StatusRequestEntityTooLarge, a.status, "%s", a.body)
	require.Contains(t, a.json(t)["detail"], "2048 bytes")

	a = e.post(t, "/v1/events", batchCT, batchOf(big, big))
	require.Equal(t, http.StatusRequestEntityTooLarge, a.status, "%s", a.body)

	// One event of a batch over the bound of one event: too_large, with
	// its index.
	a = e.post(t, "/v1/events", batchCT, batchOf(turn("s", 0), big))
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	var rej gateway.Rejection
	require.NoError(t, json.Unmarshal(a.body, &rej))
	require.Equal(t, events.CodeTooLarge, rej.Data.Code)
	require.Equal(t, 1, rej.BatchIndex)
	require.Equal(t, uint64(0), e.storedMsgs(t))
}

func TestWaitVerdict(t *testing.T) {
	e := newEnv(t, opts{})
	evs := []string{opened("w")}
	for i := range 8 {
		evs = append(evs, turn("w", i))
	}
	a := e.post(t, "/v1/events", batchCT, batchOf(evs...))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)

	a = e.post(t, "/v1/events?wait=20s", structured, request("w", "w-req"))
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, events.ContentTypeCloudEventsJSON, a.header.Get("Content-Type"))
	require.Equal(t, "verdict", a.header.Get(gateway.HeaderWait))
	require.NotEmpty(t, a.header.Get("Seamguard-Signature"))

	// The very bytes the processor published on NATS.
	v, err := events.DecodeVerdict(a.body)
	require.NoError(t, err, "%s", a.body)
	// The answer is the verdict as heard on NATS; the verdict stream
	// stores it a fsync later.
	s, err := e.JS.Stream(e.ctx, "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	var m *jetstream.RawStreamMsg
	require.Eventually(t, func() bool {
		m, err = s.GetLastMsgForSubject(e.ctx, "seamguard.verdicts.w."+kindOf(t, a.body))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "the verdict answered is not stored")
	require.Equal(t, string(m.Data), string(a.body))
	require.Equal(t, events.OutputID(events.Cause{ID: "w-req", Source: "urn:agent:a"}, v.Type), v.ID)

	// The same request again is stored once; its earlier verdict answers.
	a = e.post(t, "/v1/events?wait=5s", structured, request("w", "w-req"))
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "1", a.header.Get(gateway.HeaderDuplicates))
	require.Equal(t, string(m.Data), string(a.body))
}

func kindOf(t *testing.T, verdict []byte) string {
	var v struct{ Type string }
	require.NoError(t, json.Unmarshal(verdict, &v))
	return events.Output{Type: v.Type}.Kind()
}

func TestWaitTimeoutAndBadWait(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true})
	start := time.Now()
	a := e.post(t, "/v1/events?wait=300ms", structured, request("t", "t-req"))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "timeout", a.header.Get(gateway.HeaderWait))
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.Equal(t, uint64(1), e.storedMsgs(t))

	for _, q := range []string{"wait=abc", "wait=61s", "wait=0", "wait=-1s"} {
		a = e.post(t, "/v1/events?"+q, structured, request("t", "t-req2"))
		require.Equal(t, http.StatusBadRequest, a.status, "%s: %s", q, a.body)
	}
	a = e.post(t, "/v1/events?wait=1s", structured, turn("t", 0))
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	require.Equal(t, uint64(1), e.storedMsgs(t))
}

// TestDuplicates: the same event again is a duplicate (202, stored once);
// another event under the same (source, id) is a 409; the same id from
// two sources is two events.
func TestDuplicates(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true})
	a := e.post(t, "/v1/events", structured, turn("d", 0))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	a = e.post(t, "/v1/events", structured, turn("d", 0))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "1", a.header.Get(gateway.HeaderDuplicates))
	require.Equal(t, true, a.json(t)["events"].([]any)[0].(map[string]any)["duplicate"])

	other := strings.Replace(turn("d", 0), `"content":"turn 0"`, `"content":"something else"`, 1)
	a = e.post(t, "/v1/events", structured, other)
	require.Equal(t, http.StatusConflict, a.status, "%s", a.body)
	require.Contains(t, a.json(t)["detail"], "differs in data")

	// Same id, another source: both stored.
	a = e.post(t, "/v1/events", structured, strings.Replace(turn("d", 0), "urn:agent:a", "urn:agent:b", 1))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "0", a.header.Get(gateway.HeaderDuplicates))
	require.Equal(t, uint64(2), e.storedMsgs(t))
}

func writeTokens(t *testing.T, path string, lines ...string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
}

func bearer(tok string) map[string]string {
	return map[string]string{"Content-Type": "application/cloudevents+json", "Authorization": "Bearer " + tok}
}

func TestTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path,
		"# test tokens",
		gateway.HashToken("agent-secret")+" agent team-a-* solo # agent A",
		gateway.HashToken("op-secret")+" operator # ops",
	)
	tokens, err := gateway.LoadTokens(path)
	require.NoError(t, err)
	require.Equal(t, 2, tokens.Len())
	e := newEnv(t, opts{noProcessor: true, tokens: tokens})

	a := e.post(t, "/v1/events", bearer("agent-secret"), turn("team-a-1", 0))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	a = e.post(t, "/v1/events", bearer("agent-secret"), turn("solo", 0))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)

	// An agent token on another session, in a batch too: nothing stored.
	a = e.post(t, "/v1/events", bearer("agent-secret"), turn("team-b-1", 0))
	require.Equal(t, http.StatusForbidden, a.status, "%s", a.body)
	require.Contains(t, a.json(t)["detail"], "team-b-1")
	h := bearer("agent-secret")
	h["Content-Type"] = "application/cloudevents-batch+json"
	a = e.post(t, "/v1/events", h, batchOf(turn("team-a-1", 1), turn("solo-2", 0)))
	require.Equal(t, http.StatusForbidden, a.status, "%s", a.body)

	// A control event: never with an agent token, with an operator's yes.
	resume := ev("team-a-1", "urn:op", "r1", "session.resumed", `{"note":"checked"}`)
	a = e.post(t, "/v1/events", bearer("agent-secret"), resume)
	require.Equal(t, http.StatusForbidden, a.status, "%s", a.body)
	require.Contains(t, a.json(t)["detail"], "control event")
	a = e.post(t, "/v1/events", bearer("op-secret"), resume)
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	require.Equal(t, "seamguard.control.team-a-1", a.json(t)["events"].([]any)[0].(map[string]any)["nats_subject"])

	// No token, a wrong one, another scheme: 401 with WWW-Authenticate.
	for _, hdr := range []map[string]string{structured, bearer("agent-secreT"), {"Content-Type": "application/cloudevents+json", "Authorization": "Basic YTpi"}} {
		a = e.post(t, "/v1/events", hdr, turn("solo", 1))
		require.Equal(t, http.StatusUnauthorized, a.status, "%s", a.body)
		require.Contains(t, a.header.Get("WWW-Authenticate"), "Bearer")
	}
	require.Equal(t, uint64(3), e.storedMsgs(t))

	// Reloading the file without the agent's token revokes it.
	writeTokens(t, path, gateway.HashToken("op-secret")+" operator")
	require.NoError(t, tokens.Reload())
	a = e.post(t, "/v1/events", bearer("agent-secret"), turn("solo", 1))
	require.Equal(t, http.StatusUnauthorized, a.status, "%s", a.body)

	// A file that does not parse keeps the tokens in use.
	writeTokens(t, path, "not-a-hash agent x")
	require.Error(t, tokens.Reload())
	a = e.post(t, "/v1/events", bearer("op-secret"), turn("solo", 1))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
}

func TestAuthForMountedHandlers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, gateway.HashToken("a")+" agent s1", gateway.HashToken("o")+" operator")
	tokens, err := gateway.LoadTokens(path)
	require.NoError(t, err)
	e := newEnv(t, opts{noProcessor: true, tokens: tokens})
	e.gw.Mount("GET /v1/sessions/{session}/probe", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := e.gw.Auth().Session(r, r.PathValue("session")); err != nil {
			gateway.WriteError(w, 0, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	get := func(tok, session string) int {
		req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/sessions/"+session+"/probe", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusNoContent, get("a", "s1"))
	require.Equal(t, http.StatusForbidden, get("a", "s2"))
	require.Equal(t, http.StatusNoContent, get("o", "s2"))
	require.Equal(t, http.StatusUnauthorized, get("", "s1"))
}

func TestParseTokens(t *testing.T) {
	h := gateway.HashToken("x")
	for _, c := range []struct{ file, want string }{
		{"x agent s", "64 hex digits"},
		{h + " agent", "needs the sessions"},
		{h + " operator s1", "list no sessions"},
		{h + " admin", `role "admin"`},
		{h + " agent a*b", "not a session id"},
		{h + " agent s\n" + h + " operator", "same token hash as line 1"},
	} {
		_, err := gateway.ParseTokens([]byte(c.file))
		require.ErrorIs(t, err, gateway.ErrTokenFile, c.file)
		require.ErrorContains(t, err, c.want)
	}
	got, err := gateway.ParseTokens([]byte("\n# c\n" + h + " agent * # all\n"))
	require.NoError(t, err)
	require.Len(t, got, 1)
	// The same hash as sha256sum prints.
	require.Equal(t, "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881", h)
}

func TestCheckListen(t *testing.T) {
	require.NoError(t, gateway.CheckListen("127.0.0.1:0", false))
	require.NoError(t, gateway.CheckListen("[::1]:8480", false))
	require.NoError(t, gateway.CheckListen("localhost:8480", false))
	for _, a := range []string{"0.0.0.0:8480", ":8480", "10.0.0.1:80", "example.com:80"} {
		require.ErrorIs(t, gateway.CheckListen(a, false), gateway.ErrNotLoopback, a)
		require.NoError(t, gateway.CheckListen(a, true), a)
	}
	require.Error(t, gateway.CheckListen("nonsense", true))
}

func TestMethodsAndPaths(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true})
	res, err := http.Get(e.url + "/v1/events")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
	a := e.post(t, "/v1/nothing", structured, "{}")
	require.Equal(t, http.StatusNotFound, a.status)
	_ = bytes.MinRead
	_ = jetstream.ErrStreamNotFound
}

// TestMaxWaiting: past MaxWaiting requests waiting for verdicts, another
// ?wait= request is a 503 and stores nothing.
func TestMaxWaiting(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true, cfg: func(c *gateway.Config) { c.MaxWaiting = 1 }})
	first := make(chan int, 1)
	go func() { // no require off the test's goroutine
		res, err := http.Post(e.url+"/v1/events?wait=3s", "application/cloudevents+json", strings.NewReader(request("m", "m-1")))
		if err != nil {
			first <- 0
			return
		}
		res.Body.Close()
		first <- res.StatusCode
	}()
	require.Eventually(t, func() bool { return e.storedMsgs(t) == 1 }, 5*time.Second, 10*time.Millisecond)
	a := e.post(t, "/v1/events?wait=1s", structured, request("m", "m-2"))
	require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	require.Equal(t, "1", a.header.Get("Retry-After"))
	require.Equal(t, uint64(1), e.storedMsgs(t))
	require.Equal(t, http.StatusAccepted, <-first)
	// The slot is free again.
	a = e.post(t, "/v1/events?wait=100ms", structured, request("m", "m-2"))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
}
