package processor_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// stuckScripts are a session whose state outgrows a small value limit
// ("bloated": many disjoint truncations and a compaction request) and
// clean sessions whose state stays small.
func stuckScripts(clean int) (bloated *sessionScript, others []*sessionScript) {
	bloated = &sessionScript{ID: "bloated"}
	bloated.Open("turns", 2, "turns")
	bloated.Turns(200, 1)
	for i := uint64(0); i < 60; i++ {
		bloated.Truncate(3*i, 3*i+1)
	}
	bloated.Compact("b1", rng(0, 200), rng(0, 190), 190, false)
	for i := range clean {
		s := &sessionScript{ID: fmt.Sprintf("clean%03d", i)}
		s.Open("turns", 2, "turns")
		s.Turns(6, 1)
		s.Compact("c", rng(0, 6), rng(0, 4), 4, false)
		others = append(others, s)
	}
	return bloated, others
}

// limitStateSize lowers the session bucket's value limit to n bytes under
// a running processor (a failure retrying cannot fix, for a state that
// outgrows it) and returns the function that lifts it again.
func (e *env) limitStateSize(t *testing.T, cfg processor.Config, n int32) (lift func()) {
	t.Helper()
	kvs, err := e.JS.Stream(e.ctx, "KV_"+cfg.Names().Sessions)
	require.NoError(t, err)
	info, err := kvs.Info(e.ctx)
	require.NoError(t, err)
	small := info.Config
	small.MaxMsgSize = n
	_, err = e.JS.UpdateStream(e.ctx, small)
	require.NoError(t, err)
	return func() {
		t.Helper()
		small.MaxMsgSize = -1
		_, err := e.JS.UpdateStream(e.ctx, small)
		require.NoError(t, err)
	}
}

// verdictsOf counts the verdicts of session id by kind.
func verdictsOf(t *testing.T, e *env, cfg processor.Config, id string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, v := range e.verdicts(t, cfg) {
		if v.v.Session == id {
			out[v.v.Type]++
		}
	}
	return out
}

// TestStuckSessionIsIsolated makes one session's state impossible to
// store (the bucket's value limit is lowered under a running processor,
// a failure retrying cannot fix): that session is stuck, named by Ready,
// while every other session is decided; once the limit is lifted, its
// redelivered inputs are applied, it is no longer stuck, and its verdict
// is in the stream once.
func TestStuckSessionIsIsolated(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.AckWait = 2 * time.Second
	cfg.RetryFor = time.Second
	r := e.start(t, cfg)
	waitFor(t, 10*time.Second, "the processor consuming", func() bool { return r.p.Ready() == nil })

	lift := e.limitStateSize(t, cfg, 400)

	bloated, others := stuckScripts(40)
	subj := cfg.Subjects()
	msgs := scriptMsgs(t, subj, bloated)
	// Its first events alone, until their state is stored: a loaded
	// machine could otherwise fetch the whole script in one batch, whose
	// first state is already too big, and store nothing before it.
	e.publishAll(t, msgs[:3])
	kvb, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the bloated session's first state stored", func() bool {
		_, err := kvb.Get(e.ctx, "bloated")
		return err == nil
	})
	msgs = msgs[3:]
	for _, s := range others {
		msgs = append(msgs, scriptMsgs(t, subj, s)...)
	}
	e.publishAll(t, msgs)

	waitFor(t, 30*time.Second, "every clean session decided", func() bool {
		n := 0
		for _, v := range e.verdicts(t, cfg) {
			if strings.HasPrefix(v.v.Session, "clean") && v.v.Type == events.TypeCompactionAllowed {
				n++
			}
		}
		return n == len(others)
	})
	waitFor(t, 10*time.Second, "the bloated session stuck", func() bool { return r.p.StuckSessions() == 1 })
	err = r.p.Ready()
	require.Error(t, err, "a stuck session makes the processor unready")
	require.ErrorIs(t, err, processor.ErrNotReady)
	require.ErrorContains(t, err, "session bloated")
	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)
	before, err := kv.Get(e.ctx, "bloated")
	require.NoError(t, err, "its state before it outgrew the limit is stored")

	lift()
	waitFor(t, 30*time.Second, "the bloated session applied after its redelivery", func() bool {
		e, err := kv.Get(e.ctx, "bloated")
		return err == nil && e.Revision() > before.Revision() && r.p.StuckSessions() == 0
	})
	require.NoError(t, r.p.Ready())
	e.waitIdle(t, cfg, 30*time.Second)
	got := verdictsOf(t, e, cfg, "bloated")
	require.Equal(t, map[string]int{events.TypeCompactionRefused: 1, events.TypeTranscriptSpilled: 1}, got,
		"the stuck session's verdicts, once each")
	require.NoError(t, r.stop(t))
}

// TestDrainEndsWhileASessionIsStuck denies the processor's user the
// verdict subjects of one session, so that its verdict is never confirmed
// (a transient failure as far as the client can tell), with a retry budget
// far longer than the drain's bound: Run still returns within
// DrainTimeout of the cancellation, and hands its partition over, so that
// another instance could take it at once.
func TestDrainEndsWhileASessionIsStuck(t *testing.T) {
	dir := t.TempDir()
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "proc", Password: "proc", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"seamguard.verdicts.denied.>"}},
			}},
		},
	}
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	connect := func(user string) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return nc, js
	}
	_, adminJS := connect("admin")
	_, procJS := connect("proc")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cfg := baseConfig()
	cfg.RetryFor = 5 * time.Minute
	cfg.DrainTimeout = 2 * time.Second
	p, err := processor.New(ctx, procJS, cfg, processor.WithClock(fixedNow),
		processor.WithLogger(slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() { p.Abort(); stop() })

	denied := &sessionScript{ID: "denied"}
	denied.Open("turns", 2, "turns")
	denied.Turns(4, 1)
	denied.Compact("d1", rng(0, 4), rng(0, 2), 2, false)
	clean := &sessionScript{ID: "fine"}
	clean.Open("turns", 2, "turns")
	clean.Turns(4, 1)
	clean.Compact("f1", rng(0, 4), rng(0, 2), 2, false)
	subj := cfg.Subjects()
	for _, m := range append(scriptMsgs(t, subj, denied), scriptMsgs(t, subj, clean)...) {
		_, err := adminJS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	verdicts, err := adminJS.Stream(ctx, cfg.Names().Verdicts)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the processor publishing (the denied verdict waits)", func() bool {
		info, err := verdicts.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})
	time.Sleep(500 * time.Millisecond) // the batch of the denied session is waiting for its ack

	start := time.Now()
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(cfg.DrainTimeout + 15*time.Second):
		t.Fatal("Run did not return after its drain timeout")
	}
	took := time.Since(start)
	t.Logf("drain returned after %s (DrainTimeout %s, RetryFor %s)", took, cfg.DrainTimeout, cfg.RetryFor)
	require.Less(t, took, cfg.DrainTimeout+10*time.Second)

	leases, err := adminJS.KeyValue(ctx, cfg.Names().Leases)
	require.NoError(t, err)
	e, err := leases.Get(ctx, "p0")
	if err == nil {
		t.Fatalf("partition 0's lease is still held by %q after the drain", e.Value())
	}
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
}

// TestReadyReportsALostLeasesBucket deletes the leases bucket under a
// running processor: it can no longer hold its partitions, and Ready must
// say so rather than report a processor that consumes nothing as ready.
func TestReadyReportsALostLeasesBucket(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	r := e.start(t, cfg)
	waitFor(t, 10*time.Second, "the processor ready", func() bool { return r.p.Ready() == nil })
	require.NoError(t, e.JS.DeleteKeyValue(e.ctx, cfg.Names().Leases))
	waitFor(t, 10*time.Second, "the processor unready", func() bool { return r.p.Ready() != nil })
	err := r.p.Ready()
	require.ErrorIs(t, err, processor.ErrNotReady)
	require.ErrorContains(t, err, "leases")
	require.NoError(t, r.stop(t))
}
