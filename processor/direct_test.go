package processor

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestDirectLookups: a batch's first lookups, sent as direct gets, keep
// exactly what the leader answers for every session that has a message
// past its state, whatever headers the message carries of its own (one
// naming another sequence, subject, stream and status, as a hostile
// publisher may); a session with nothing past its state gets no answer
// from them (its lookup is asked of the leader); and a stream that does
// not answer direct gets turns them off.
func TestDirectLookups(t *testing.T) {
	e, p, ctx := testProcessor(t, "dl")
	pub := func(session string, forge bool) uint64 {
		t.Helper()
		m := nats.NewMsg(p.subj.Events(session))
		m.Header.Set("ce-id", session+strconv.Itoa(len(session)))
		if forge {
			m.Header.Set("Nats-Sequence", "1")
			m.Header.Set("Nats-Subject", "elsewhere")
			m.Header.Set("Nats-Stream", "OTHER")
			m.Header.Set("Nats-Time-Stamp", "2001-01-01T00:00:00Z")
			m.Header.Set("Status", "404")
		}
		m.Data = []byte("body of " + session)
		ack, err := e.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		return ack.Sequence
	}
	const n = 40
	first := map[string]uint64{}
	for i := range n {
		id := "s" + strconv.Itoa(i)
		first[id] = pub(id, false)
	}
	for i := range n {
		if i%4 != 3 { // every fourth has nothing past its first message
			pub("s"+strconv.Itoa(i), i%2 == 0)
		}
	}
	s := &shard{p: p}
	s.pre.states = map[string]prefetched{}
	s.pre.lookups = map[string][]span{}
	var tasks []prefetchTask
	for i := range n {
		id := "s" + strconv.Itoa(i)
		st := &State{Seq: first[id]}
		s.pre.states[id] = prefetched{rev: 1, state: st}
		tasks = append(tasks, prefetchTask{id: id})
	}
	require.Equal(t, 32, directWindow(e.JS.Conn()), "32 MiB of 1 MiB messages: fewer than the sessions here")
	s.directLookups(ctx, tasks)
	require.Zero(t, p.directOffUntil.Load(), "on")
	for i := range n {
		id := "s" + strconv.Itoa(i)
		filter := p.subj.SessionFilters(id)[0]
		got, position, ok := s.pre.lookup(lookupKey{filter: filter, seq: first[id] + 1})
		if i%4 == 3 {
			require.False(t, ok, "%s: nothing past its state is not taken from a direct get", id)
			continue
		}
		require.True(t, ok, id)
		require.False(t, position)
		want, _, err := p.findNext(ctx, first[id]+1, filter, wantAll)
		require.NoError(t, err)
		require.Equal(t, want.Sequence, got.Sequence, id)
		require.Equal(t, want.Subject, got.Subject, id)
		require.Equal(t, want.Data, got.Data, id)
		require.Equal(t, want.Header, got.Header, id)
		require.True(t, want.Time.Equal(got.Time), id)
	}

	// A stream that does not allow direct gets answers "no responders".
	info, err := p.res.Events.Info(ctx)
	require.NoError(t, err)
	cfg := info.Config
	cfg.AllowDirect = false
	_, err = e.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	s.pre.lookups = map[string][]span{}
	pause := 300 * time.Millisecond
	defer func(d time.Duration) { directPause = d }(directPause)
	directPause = pause
	off := time.Now()
	s.directLookups(ctx, tasks)
	require.NotZero(t, p.directOffUntil.Load(), "turned off")
	require.Empty(t, s.pre.lookups)

	// Off for the pause, even once the stream answers again; then one
	// batch tries again, and they are on.
	cfg.AllowDirect = true
	_, err = e.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	s.directLookups(ctx, tasks)
	if time.Since(off) < pause {
		require.Empty(t, s.pre.lookups, "not tried during the pause")
	}
	time.Sleep(time.Until(time.Unix(0, p.directOffUntil.Load())))
	s.directLookups(ctx, tasks)
	require.Zero(t, p.directOffUntil.Load(), "on again")
	require.Len(t, s.pre.lookups, n-n/4)
}

// TestDirectRetryIsOneShard: when the pause is over, one batch tries
// direct lookups again, not every shard's at once.
func TestDirectRetryIsOneShard(t *testing.T) {
	p := &Processor{}
	p.directOffUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
	tried := 0
	for range 8 {
		if p.directOn() {
			tried++
		}
	}
	require.Equal(t, 1, tried)
	p.directOffUntil.Store(0)
	require.True(t, p.directOn())
	require.True(t, p.directOn())
}

// TestDirectAnswerTakesTheServersHeaders: of headers a message carries
// twice, the server's are the last; those are read and removed, the
// message's own kept.
func TestDirectAnswerTakesTheServersHeaders(t *testing.T) {
	m := nats.NewMsg("_INBOX.x.0")
	m.Header = nats.Header{
		"Nats-Stream":     {"OTHER", "EV"},
		"Nats-Subject":    {"elsewhere", "a.b"},
		"Nats-Sequence":   {"1", "7"},
		"Nats-Time-Stamp": {"2001-01-01T00:00:00Z", "2026-01-01T00:00:00Z"},
		"ce-id":           {"x"},
	}
	got := directAnswer("EV", lookupKey{filter: "a.b", seq: 5}, m)
	require.NotNil(t, got)
	require.Equal(t, uint64(7), got.Sequence)
	require.Equal(t, "a.b", got.Subject)
	require.Equal(t, nats.Header{"Nats-Stream": {"OTHER"}, "Nats-Subject": {"elsewhere"}, "Nats-Sequence": {"1"}, "Nats-Time-Stamp": {"2001-01-01T00:00:00Z"}, "ce-id": {"x"}}, got.Header)
	for _, bad := range []struct {
		stream string
		k      lookupKey
	}{{"OTHER", lookupKey{filter: "a.b", seq: 5}}, {"EV", lookupKey{filter: "a.c", seq: 5}}, {"EV", lookupKey{filter: "a.b", seq: 8}}} {
		m.Header = nats.Header{"Nats-Stream": {"EV"}, "Nats-Subject": {"a.b"}, "Nats-Sequence": {"7"}, "Nats-Time-Stamp": {"2026-01-01T00:00:00Z"}}
		require.Nil(t, directAnswer(bad.stream, bad.k, m), "%+v", bad)
	}
	m.Header = nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}}
	require.Nil(t, directAnswer("EV", lookupKey{filter: "a.b", seq: 5}, m))
}

// TestDirectLookupDenied: a server refuses a direct get the identity may
// not make by answering nothing, and tells the connection; the batch's
// lookups end as soon as the connection hears of it, with the violation as
// their error (which turns them off), rather than after directWait.
func TestDirectLookupDenied(t *testing.T) {
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "proc", Password: "proc", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.DIRECT.GET.DD_EVENTS"}},
			}},
		},
	}
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	require.True(t, srv.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(connect("admin"))
	require.NoError(t, err)
	p, err := New(ctx, js, Config{Prefix: "dd", Partitions: 2})
	require.NoError(t, err)
	require.Equal(t, "DD_EVENTS", p.cfg.Names().Events)
	m := nats.NewMsg(p.subj.Events("a"))
	m.Data = []byte("x")
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
	keys := []lookupKey{{filter: p.subj.SessionFilters("a")[0], seq: 1}}

	found, answered, _, err := p.lookDirect(ctx, connect("admin"), keys)
	require.NoError(t, err)
	require.Equal(t, 1, answered)
	require.NotNil(t, found[0], "the admin may")

	proc := connect("proc")
	start := time.Now()
	found, answered, _, err = p.lookDirect(ctx, proc, keys)
	took := time.Since(start)
	require.ErrorIs(t, err, nats.ErrPermissionViolation)
	require.Zero(t, answered)
	require.Nil(t, found[0])
	require.Less(t, took, directWait, "ended when the violation was reported, not after the wait")
	t.Logf("denied after %s: %v", took, err)
}
