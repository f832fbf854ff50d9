package processor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// groupRun hands each of reqs to a writer of states before it starts (so
// that its first group is all of them, as when shards hand over states
// while it writes), then starts it, and returns each request's outcome.
func groupRun(t *testing.T, e *batchEnv, reqs [][]*nats.Msg) [][]groupAck {
	t.Helper()
	g := newWriteGroup(e.bt.p, true)
	out := make([][]groupAck, len(reqs))
	var wg sync.WaitGroup
	for i, msgs := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = g.submit(e.ctx, e.bt.p, true, false, msgs)
		}()
	}
	require.Eventually(t, func() bool { return len(g.in) == len(reqs) }, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.run(ctx)
	}()
	wg.Wait()
	cancel()
	<-done
	return out
}

// TestStateGroupGathers: the states of many shards waiting for the writer
// are written as one atomic batch, each answered with its own revision;
// a stale compare-and-swap among them fails the batch, and then every
// other state is still stored (one by one) and only the stale one is
// answered as not stored.
func TestStateGroupGathers(t *testing.T) {
	e := newBatchEnv(t, 0)
	keys := func(shard int) []string {
		return []string{fmt.Sprintf("s%d-a", shard), fmt.Sprintf("s%d-b", shard), fmt.Sprintf("s%d-c", shard)}
	}
	var reqs [][]*nats.Msg
	for shard := range 8 {
		var msgs []*nats.Msg
		for _, k := range keys(shard) {
			msgs = append(msgs, cas(k, k+"-1", 0))
		}
		reqs = append(reqs, msgs)
	}
	acks := groupRun(t, e, reqs)
	require.Equal(t, uint64(1), e.bt.committed.Load(), "8 shards of 3 states: one atomic batch")
	require.Equal(t, uint64(24), e.bt.messages.Load())
	revs := map[string]uint64{}
	for shard, a := range acks {
		require.Len(t, a, 3)
		for k, key := range keys(shard) {
			require.True(t, a[k].ok, key)
			revs[key] = a[k].seq
			require.Equal(t, map[string]string{key: fmt.Sprintf("%s-1@%d", key, a[k].seq)}, e.values(t, key))
		}
	}

	// Shard 3's second state is stale: the batch does not commit, the
	// others are written one by one.
	reqs = nil
	for shard := range 8 {
		var msgs []*nats.Msg
		for _, k := range keys(shard) {
			rev := revs[k]
			if shard == 3 && k == keys(3)[1] {
				rev--
			}
			msgs = append(msgs, cas(k, k+"-2", rev))
		}
		reqs = append(reqs, msgs)
	}
	acks = groupRun(t, e, reqs)
	require.Equal(t, uint64(1), e.bt.committed.Load())
	require.Equal(t, uint64(1), e.bt.fellBack.Load())
	for shard, a := range acks {
		for k, key := range keys(shard) {
			stale := shard == 3 && k == 1
			require.Equal(t, !stale, a[k].ok, key)
			want := fmt.Sprintf("%s-2@%d", key, a[k].seq)
			if stale {
				want = fmt.Sprintf("%s-1@%d", key, revs[key])
			}
			require.Equal(t, map[string]string{key: want}, e.values(t, key))
		}
	}

	// Fewer states than an atomic batch is worth: each on its own.
	acks = groupRun(t, e, [][]*nats.Msg{{cas("x", "x1", 0)}, {cas("y", "y1", 0), cas("z", "z1", 0)}})
	require.Equal(t, uint64(1), e.bt.committed.Load(), "no batch for 3 states")
	for _, a := range acks {
		for _, one := range a {
			require.True(t, one.ok)
		}
	}
	require.Len(t, e.values(t, "x", "y", "z"), 3)
}

// TestStateGroupWithoutWriter: with no writer running, a shard writes its
// states itself, the same way.
func TestStateGroupWithoutWriter(t *testing.T) {
	e := newBatchEnv(t, 0)
	var g *writeGroup
	msgs := make([]*nats.Msg, 20)
	for i := range msgs {
		msgs[i] = cas(fmt.Sprintf("k%d", i), "v", 0)
	}
	acks := g.submit(e.ctx, e.bt.p, true, false, msgs)
	require.Len(t, acks, 20)
	for _, a := range acks {
		require.True(t, a.ok)
	}
	require.Equal(t, uint64(1), e.bt.p.batches.committed.Load())
}

// TestVerdictGroupOrdered: a shard's verdicts that must be confirmed in
// order are written by the writer only inside an atomic batch; the others
// of a small group are written one by one.
func TestVerdictGroupOrdered(t *testing.T) {
	e := newBatchEnv(t, 0)
	g := newWriteGroup(e.bt.p, false)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go g.run(ctx)

	acks := g.submit(e.ctx, e.bt.p, false, true, []*nats.Msg{verdict("o1"), verdict("o2")})
	require.Equal(t, []groupAck{{}, {}}, acks, "an ordered request of a small group is left to the shard")
	acks = g.submit(e.ctx, e.bt.p, false, false, []*nats.Msg{verdict("p1"), verdict("p2")})
	require.True(t, acks[0].ok && acks[1].ok)
	require.Less(t, acks[0].seq, acks[1].seq, "in order")

	var msgs []*nats.Msg
	for i := range minAtomicBatch {
		msgs = append(msgs, verdict(fmt.Sprintf("b%d", i)))
	}
	acks = g.submit(e.ctx, e.bt.p, false, true, msgs)
	for _, a := range acks {
		require.True(t, a.ok, "an ordered request in an atomic batch is written whole")
	}
	require.Equal(t, uint64(1), e.bt.committed.Load())
	s, err := e.JS.Stream(e.ctx, "V")
	require.NoError(t, err)
	info, err := s.Info(e.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2+minAtomicBatch), info.State.Msgs, "o1 and o2 were not written")
}
