package read

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
)

// wait is how long a test waits for an event that should come.
const wait = 15 * time.Second

// TestVerdictsReplayAndFilters: from=start replays a session's verdicts
// as the stream holds them, each with its sequence and type; the session
// and kind filters exclude the rest.
func TestVerdictsReplayAndFilters(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	e.play(t, "s", chainStory("s"), 4)
	e.play(t, "t", chainStory("t"), 8)

	s, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s&from=start")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	assert.Equal(t, ContentTypeEventStream, resp.Header.Get("Content-Type"))
	var ids []uint64
	wantTypes := []string{events.TypeTranscriptSpilled, events.TypeCompactionRefused, events.TypeTranscriptSpilled, events.TypeCompactionRefused}
	for i, typ := range wantTypes {
		ev := s.next(t, wait)
		seq, err := strconv.ParseUint(ev.ID, 10, 64)
		require.NoError(t, err, "event %d: id %q", i, ev.ID)
		m := e.stored(t, seq)
		assert.Equal(t, string(m.Data), ev.Data, "event %d: the bytes the stream holds", i)
		assert.Equal(t, "seamguard.verdicts.s."+events.Output{Type: typ}.Kind(), m.Subject)
		assert.Equal(t, typ, ev.Event)
		assert.NotContains(t, ev.Data, "\n")
		ids = append(ids, seq)
	}
	s.none(t, 300*time.Millisecond)
	assert.IsIncreasing(t, ids)

	// Without from, the same.
	s2, _ := openSSE(t, e.http.URL, "/v1/verdicts?session=s")
	require.NotNil(t, s2)
	assert.Equal(t, strconv.FormatUint(ids[0], 10), s2.next(t, wait).ID)

	// from=SEQ starts at that sequence.
	s3, _ := openSSE(t, e.http.URL, "/v1/verdicts?session=s&from="+strconv.FormatUint(ids[2], 10))
	require.NotNil(t, s3)
	assert.Equal(t, strconv.FormatUint(ids[2], 10), s3.next(t, wait).ID)
	assert.Equal(t, strconv.FormatUint(ids[3], 10), s3.next(t, wait).ID)
	s3.none(t, 200*time.Millisecond)

	// One kind; several kinds; every session.
	for _, c := range []struct {
		query string
		n     int
		check func(ev sseEvent)
	}{
		{"session=t&kind=refused", 2, func(ev sseEvent) {
			assert.Equal(t, events.TypeCompactionRefused, ev.Event)
			assert.Contains(t, ev.Data, `"subject":"t"`)
		}},
		{"kind=spilled", 4, func(ev sseEvent) { assert.Equal(t, events.TypeTranscriptSpilled, ev.Event) }},
		{"session=t&kind=refused,spilled,refused", 4, func(ev sseEvent) { assert.Contains(t, ev.Data, `"subject":"t"`) }},
		{"session=s&kind=allowed,halted", 0, nil},
		{"", 8, nil},
	} {
		s, resp := openSSE(t, e.http.URL, "/v1/verdicts?from=start&"+c.query)
		require.NotNil(t, s, "%s: status %d", c.query, resp.StatusCode)
		for range c.n {
			ev := s.next(t, wait)
			if c.check != nil {
				c.check(ev)
			}
		}
		s.none(t, 300*time.Millisecond)
		s.Close()
	}
}

// TestVerdictsLiveAndResume: verdicts come as they are decided, and a
// client that lost its connection resumes with Last-Event-ID exactly
// after the last event it got: nothing missed, nothing twice.
func TestVerdictsLiveAndResume(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	e.play(t, "old", chainStory("old")[:5], 2)

	s, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s&from=new")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	all, _ := openSSE(t, e.http.URL, "/v1/verdicts?from=new")
	require.NotNil(t, all)
	lines := chainStory("s")
	e.play(t, "s", lines[:5], 4) // the first refusal: 2 verdicts
	first := []sseEvent{s.next(t, wait), s.next(t, wait)}
	assert.Equal(t, events.TypeTranscriptSpilled, first[0].Event)
	assert.Equal(t, events.TypeCompactionRefused, first[1].Event)
	assert.Equal(t, first[0].ID, all.next(t, wait).ID, "from=new: nothing of session old")

	// The connection drops after the first event; the client resumes from
	// it while the second refusal is decided.
	s.Close()
	e.play(t, "s", lines[5:], 6)
	r, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s&from=new", "Last-Event-ID", first[0].ID)
	require.NotNil(t, r, "status %d", resp.StatusCode)
	got := []sseEvent{r.next(t, wait), r.next(t, wait), r.next(t, wait)}
	assert.Equal(t, first[1], got[0], "the event after Last-Event-ID, not from=new")
	assert.Equal(t, events.TypeTranscriptSpilled, got[1].Event)
	assert.Equal(t, events.TypeCompactionRefused, got[2].Event)
	r.none(t, 300*time.Millisecond)
	for i := 1; i < len(got); i++ {
		a, _ := strconv.ParseUint(got[i-1].ID, 10, 64)
		b, _ := strconv.ParseUint(got[i].ID, 10, 64)
		assert.Equal(t, a+1, b, "consecutive verdicts of the only session deciding")
	}
}

// TestVerdictsRelease: a client that goes away releases its stream: the
// handler's slot, its subscriptions, and no consumer is ever made.
func TestVerdictsRelease(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{MaxStreams: 2, Heartbeat: 50 * time.Millisecond})
	e.play(t, "s", chainStory("s")[:5], 2)
	nc := e.srv.JS.Conn()
	subs := nc.NumSubscriptions()
	open := func() int { return e.h.OpenStreams() }

	var streams []*sseStream
	for range 2 {
		s, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s")
		require.NotNil(t, s, "status %d", resp.StatusCode)
		s.next(t, wait)
		streams = append(streams, s)
	}
	assert.Equal(t, 2, e.h.OpenStreams())
	assert.Greater(t, nc.NumSubscriptions(), subs)
	resp := get(t, e.http.URL, http.MethodGet, "/v1/verdicts?session=s")
	b := body(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	// An idle stream sends heartbeats.
	for {
		ev, ok := <-streams[0].events
		require.True(t, ok)
		if ev.Comment == "ping" {
			break
		}
	}

	for _, s := range streams {
		s.Close()
	}
	eventually(t, "the streams are released", func() bool { return open() == 0 })
	eventually(t, "the subscriptions are gone", func() bool { return nc.NumSubscriptions() == subs })
	str, err := e.srv.JS.Stream(e.ctx, e.cfg.Names().Verdicts)
	require.NoError(t, err)
	info, err := str.Info(e.ctx)
	require.NoError(t, err)
	assert.Zero(t, info.State.Consumers, "no consumer on the verdict stream")

	s, resp2 := openSSE(t, e.http.URL, "/v1/verdicts?session=s")
	require.NotNil(t, s, "a slot is free again: status %d", resp2.StatusCode)
}

// TestVerdictsUnverified: a message on a verdict subject that the
// processor did not sign (or that a key not trusted signed) comes as an
// "unverified" event saying why, never as a verdict.
func TestVerdictsUnverified(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	e.play(t, "s", chainStory("s")[:5], 2)
	genuine := e.stored(t, 2)

	// Unsigned: the genuine bytes without their headers.
	e.forge(t, genuine.Subject, nats.Header{}, genuine.Data)
	// Signed by another key.
	other, err := attest.Generate()
	require.NoError(t, err)
	h := nats.Header{}
	other.SignMsg(h, genuine.Data)
	e.forge(t, genuine.Subject, h, genuine.Data)
	// Genuine, but copied onto another session's subject.
	copied := nats.Header{}
	for _, k := range []string{attest.HeaderSigner, attest.HeaderSignature} {
		copied.Set(k, genuine.Header.Get(k))
	}
	e.forge(t, "seamguard.verdicts.t.refused", copied, genuine.Data)
	// Not JSON, with a line break.
	e.forge(t, "seamguard.verdicts.s.refused", nats.Header{}, []byte("not\njson"))

	s, resp := openSSE(t, e.http.URL, "/v1/verdicts?from=start")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	assert.Equal(t, events.TypeTranscriptSpilled, s.next(t, wait).Event)
	assert.Equal(t, events.TypeCompactionRefused, s.next(t, wait).Event)
	for _, want := range []struct {
		reason, subject string
		claims          bool
	}{
		{attest.ReasonUnsigned, genuine.Subject, true},
		{attest.ReasonUntrusted, genuine.Subject, true},
		{attest.ReasonMisrouted, "seamguard.verdicts.t.refused", true},
		{attest.ReasonUnsigned, "seamguard.verdicts.s.refused", false},
	} {
		ev := s.next(t, wait)
		require.Equal(t, EventUnverified, ev.Event, "%+v", ev)
		var u struct {
			Reason  string          `json:"reason"`
			Message string          `json:"message"`
			Subject string          `json:"subject"`
			Seq     uint64          `json:"stream_seq"`
			Claims  json.RawMessage `json:"claims"`
		}
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &u), ev.Data)
		assert.Equal(t, want.reason, u.Reason, u.Message)
		assert.Equal(t, want.subject, u.Subject)
		assert.Equal(t, ev.ID, strconv.FormatUint(u.Seq, 10))
		assert.Equal(t, want.claims, len(u.Claims) > 0)
	}

	// A handler that trusts no key in particular passes the one signed by
	// another key, and still not the unsigned one.
	e.serve(t, Loopback{}, Config{Trust: mustTrust(t, other.PublicKey())})
	s2, _ := openSSE(t, e.last.URL, "/v1/verdicts?from=start&session=s&kind=refused")
	require.NotNil(t, s2)
	assert.Equal(t, EventUnverified, s2.next(t, wait).Event, "the processor's key is not trusted here")
	assert.Equal(t, EventUnverified, s2.next(t, wait).Event, "unsigned")
	assert.Equal(t, events.TypeCompactionRefused, s2.next(t, wait).Event, "signed by the key trusted here")
}

func mustTrust(t *testing.T, keys ...string) attest.Trust {
	t.Helper()
	tr, err := attest.ParseKeys(keys...)
	require.NoError(t, err)
	return tr
}

// TestVerdictsAccessAndQuery: all sessions only for operators, one
// session for those Access allows; malformed queries are 400.
func TestVerdictsAccessAndQuery(t *testing.T) {
	e := newEnv(t, onlySession("t"), Config{})
	auth := []string{"Authorization", "Bearer x"}
	for _, c := range []struct {
		query  string
		header []string
		status int
	}{
		{"", auth, http.StatusForbidden},
		{"?kind=refused", auth, http.StatusForbidden},
		{"?session=s", auth, http.StatusForbidden},
		{"?session=t", nil, http.StatusUnauthorized},
		{"?session=t&kind=bogus", auth, http.StatusBadRequest},
		{"?session=t&kind=refused,", auth, http.StatusBadRequest},
		{"?session=t&from=abc", auth, http.StatusBadRequest},
		{"?session=t&from=0", auth, http.StatusBadRequest},
		{"?session=t&from=-1", auth, http.StatusBadRequest},
		{"?session=t.u", auth, http.StatusBadRequest},
		{"?session=", auth, http.StatusBadRequest},
		{"?session=t&session=u", auth, http.StatusBadRequest},
		{"?session=t&since=1", auth, http.StatusBadRequest},
		{"?session=t", append([]string{"Last-Event-ID", "x"}, auth...), http.StatusBadRequest},
		{"?session=t", append([]string{"Last-Event-ID", "0"}, auth...), http.StatusBadRequest},
		{"?session=t", auth, http.StatusOK},
		{"?session=t&kind=refused&from=new", auth, http.StatusOK},
		{"?session=t", append([]string{"Last-Event-ID", "7"}, auth...), http.StatusOK},
	} {
		s, resp := openSSE(t, e.http.URL, "/v1/verdicts"+c.query, c.header...)
		assert.Equal(t, c.status, resp.StatusCode, c.query)
		if s != nil {
			s.Close()
			continue
		}
		b := body(t, resp)
		assert.Equal(t, ContentTypeProblem, resp.Header.Get("Content-Type"), c.query)
		assert.True(t, strings.Contains(string(b), `"status":`+strconv.Itoa(c.status)), "%s: %s", c.query, b)
	}
}

// TestVerdictsResumeAfterRetention: a Last-Event-ID older than the
// stream's first verdict resumes at that first verdict.
func TestVerdictsResumeAfterRetention(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	e.play(t, "s", chainStory("s"), 4)
	str, err := e.srv.JS.Stream(e.ctx, e.cfg.Names().Verdicts)
	require.NoError(t, err)
	require.NoError(t, str.Purge(e.ctx, jetstream.WithPurgeSequence(3))) // keeps 3 and 4
	s, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s", "Last-Event-ID", "1")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	assert.Equal(t, "3", s.next(t, wait).ID)
	assert.Equal(t, "4", s.next(t, wait).ID)
	s.none(t, 200*time.Millisecond)
}

// TestVerdictsSessionBound: one session's readers cannot take every
// stream.
func TestVerdictsSessionBound(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{SessionStreams: 1})
	s, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	_, resp = openSSE(t, e.http.URL, "/v1/verdicts?session=s&kind=refused")
	b := body(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "session s")
	for _, q := range []string{"session=t", ""} {
		o, resp := openSSE(t, e.http.URL, "/v1/verdicts?"+q)
		require.NotNil(t, o, "%s: status %d", q, resp.StatusCode)
	}
	s.Close()
	eventually(t, "session s has a stream free", func() bool {
		o, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s")
		if o == nil {
			body(t, resp)
			return false
		}
		o.Close()
		return true
	})
}

// TestVerdictsClose: Close ends the open streams, so that
// http.Server.Shutdown does not wait for them, and refuses new ones.
func TestVerdictsClose(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	s, resp := openSSE(t, e.http.URL, "/v1/verdicts?session=s")
	require.NotNil(t, s, "status %d", resp.StatusCode)
	e.h.Close()
	e.h.Close()
	var last sseEvent
	for ev := range s.events {
		last = ev
	}
	assert.Contains(t, last.Comment, "shutting down")
	assert.Equal(t, 0, e.h.OpenStreams())
	_, resp = openSSE(t, e.http.URL, "/v1/verdicts?session=s")
	b := body(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
}
