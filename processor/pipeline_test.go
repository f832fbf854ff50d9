package processor

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor/ledger"
)

// pipelineShard is a shard without a writer of its own (its stores are
// written before startStores returns) over a real session bucket.
func pipelineShard(t *testing.T) (*shard, jetstream.KeyValue, context.Context) {
	t.Helper()
	e := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cfg := Config{Prefix: "pl"}
	kv, err := e.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Names().Sessions, History: 1})
	require.NoError(t, err)
	p := &Processor{js: e.JS, cfg: cfg, log: slog.New(slog.DiscardHandler), obs: nopObserver{}, res: &Resources{Sessions: kv}}
	p.batches.p = p
	return &shard{p: p, sessions: map[string]*session{}}, kv, ctx
}

// newTestRound begins round n of s.
func newTestRound(ctx context.Context, s *shard, n uint64) *round {
	s.rounds = n
	return &round{s: s, p: s.p, ctx: ctx, b: &budget{limit: time.Second}, n: n}
}

// TestPendingRoundLeavesInNextRound: a round's states are settled while
// the next round is decided; a session the settle loses (another writer
// stored it since it was read) is left by the next round too, which then
// neither stores it nor acknowledges its inputs, while a session it stored
// stays in memory, dirty, for the next round's store, which is read from
// the revision the settle recorded.
func TestPendingRoundLeavesInNextRound(t *testing.T) {
	s, kv, ctx := pipelineShard(t)
	lost := &session{id: "lost", l: new(ledger.Ledger), seq: 3}
	kept := &session{id: "kept", l: new(ledger.Ledger), seq: 4}
	s.put(lost)
	s.put(kept)
	// Another instance stored "lost" since this one read it (as absent).
	_, err := kv.Create(ctx, "lost", []byte("theirs"))
	require.NoError(t, err)

	prev := newTestRound(ctx, s, 1)
	prev.touch(lost)
	prev.touch(kept)
	prev.stores = s.startStores(ctx, prev.touched, prev.fenced, prev.park, prev.n)
	s.pending = prev

	// The next round decides both sessions from memory.
	cur := newTestRound(ctx, s, 2)
	s.cur = cur
	lost.seq, kept.seq = 7, 8
	cur.touch(lost)
	cur.touch(kept)
	win := &ackWindow{}
	win.hold(7)
	win.hold(8)
	cur.acks = append(cur.acks, ack{win: win, seq: 7, session: "lost"}, ack{win: win, seq: 8, session: "kept"})

	require.NoError(t, s.settle())
	require.Nil(t, s.pending)
	require.True(t, cur.fenced["lost"], "lost by the pending round: left by the next")
	require.NotContains(t, s.sessions, "lost")
	require.False(t, cur.fenced["kept"])
	require.Contains(t, s.sessions, "kept", "stored by the pending round, changed by the next: still in memory")
	require.Equal(t, uint64(2), kept.dirty, "dirty for the next round")
	e, err := kv.Get(ctx, "kept")
	require.NoError(t, err)
	require.Equal(t, e.Revision(), kept.rev)
	st, err := UnmarshalState(e.Value())
	require.NoError(t, err)
	require.Equal(t, uint64(4), st.Seq, "the pending round stored its own state, not the next round's")

	// The next round stores only what it did not leave, on the revision
	// the settle recorded.
	cur.stores = s.startStores(ctx, cur.touched, cur.fenced, cur.park, cur.n)
	require.Len(t, cur.stores.out, 1)
	s.pending, s.cur = cur, nil
	require.NoError(t, s.settle())
	require.Zero(t, kept.dirty)
	e, err = kv.Get(ctx, "kept")
	require.NoError(t, err)
	st, err = UnmarshalState(e.Value())
	require.NoError(t, err)
	require.Equal(t, uint64(8), st.Seq)
	e, err = kv.Get(ctx, "lost")
	require.NoError(t, err)
	require.Equal(t, "theirs", string(e.Value()), "the other writer's state stands")
	i, ok := win.find(7)
	require.True(t, ok)
	require.False(t, win.q[i].done, "the left session's input is not finished")
	i, ok = win.find(8)
	require.True(t, ok)
	require.True(t, win.q[i].done, "the stored session's input is finished")
}

// TestPendingRoundSettledBeforeNewLease: a session changed by the pending
// round is used from memory by the next round while its lease and
// delivery are unchanged; under a new lease it is settled first and read
// again from the bucket (not from a prefetch read before the settle), so
// that what another holder stored meanwhile is what the next round decides
// from.
func TestPendingRoundSettledBeforeNewLease(t *testing.T) {
	s, kv, ctx := pipelineShard(t)
	b := &budget{limit: time.Second}
	val, err := MarshalState(4, new(ledger.Ledger))
	require.NoError(t, err)
	rev, err := kv.Create(ctx, "s", val)
	require.NoError(t, err)
	sess := &session{id: "s", l: new(ledger.Ledger), seq: 4, rev: rev, loaded: 10, epoch: 1}
	s.put(sess)

	prev := newTestRound(ctx, s, 1)
	sess.seq = 5
	prev.touch(sess)
	prev.stores = s.startStores(ctx, prev.touched, prev.fenced, prev.park, prev.n)
	s.pending = prev
	cur := newTestRound(ctx, s, 2)
	s.cur = cur

	// Same lease, same delivery: from memory, the round still pending.
	got, err := s.load(ctx, b, "s", 10, 1)
	require.NoError(t, err)
	require.Same(t, sess, got)
	require.NotNil(t, s.pending)

	// The pending round's state landed; then another holder of the
	// partition moved the session on (the lease changed hands twice).
	e, err := kv.Get(ctx, "s")
	require.NoError(t, err)
	theirs, err := MarshalState(9, new(ledger.Ledger))
	require.NoError(t, err)
	_, err = kv.Update(ctx, "s", theirs, e.Revision())
	require.NoError(t, err)
	// A prefetch of this batch read the session before that.
	s.pre.states = map[string]prefetched{"s": {rev: e.Revision(), state: &State{Seq: 5}}}

	got, err = s.load(ctx, b, "s", 10, 2)
	require.NoError(t, err)
	require.Nil(t, s.pending, "settled first")
	require.NotSame(t, sess, got)
	require.Equal(t, uint64(9), got.seq, "read from the bucket: the other holder's state")
	require.Zero(t, got.dirty)
}

// TestPendingRoundLostBeforeNewLease: a session changed by the pending
// round whose state another writer stored first is, once the settle
// under a new lease finds that, left by the round at hand: load says it
// is fenced rather than reading it again.
func TestPendingRoundLostBeforeNewLease(t *testing.T) {
	s, kv, ctx := pipelineShard(t)
	sess := &session{id: "s", l: new(ledger.Ledger), seq: 5, loaded: 10, epoch: 1}
	s.put(sess)
	_, err := kv.Create(ctx, "s", []byte("theirs"))
	require.NoError(t, err)
	prev := newTestRound(ctx, s, 1)
	prev.touch(sess)
	prev.stores = s.startStores(ctx, prev.touched, prev.fenced, prev.park, prev.n)
	s.pending = prev
	cur := newTestRound(ctx, s, 2)
	s.cur = cur

	_, err = s.load(ctx, &budget{limit: time.Second}, "s", 10, 2)
	require.ErrorIs(t, err, errFenced)
	require.True(t, cur.fenced["s"])
	require.NotContains(t, s.sessions, "s")
}
