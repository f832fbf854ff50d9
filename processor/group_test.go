package processor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seamguard/seamguard/events"
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

// TestVerdictGroupLateWriter: a shard that stops waiting for the writer
// publishes its verdicts itself while the writer, late, writes the same
// messages; neither changes them (the race detector watches), and the
// stream holds each verdict once.
func TestVerdictGroupLateWriter(t *testing.T) {
	e := newBatchEnv(t, 0)
	defer func(d time.Duration) { maxGroupWait = d }(maxGroupWait)
	maxGroupWait = 50 * time.Millisecond
	stream := e.bt.p.cfg.Names().Verdicts
	_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"late.>"}, Duplicates: time.Minute, AllowAtomicPublish: true})
	require.NoError(t, err)
	msg := func(id string) *nats.Msg {
		m := nats.NewMsg("late." + id)
		m.Data = []byte(id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set(jetstream.ExpectedStreamHeader, stream)
		return m
	}
	g := newWriteGroup(e.bt.p, false)
	s := &shard{p: e.bt.p, verdicts: g}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.run(ctx)
	}()
	// The writer is busy: its first write is answered by nobody (a
	// subscriber that never replies), so it waits pubAckWait.
	defer func(d time.Duration) { pubAckWait = d }(pubAckWait)
	pubAckWait = 500 * time.Millisecond
	sub, err := e.NC.SubscribeSync("busy.late")
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	busy := nats.NewMsg("busy.late")
	busy.Data = []byte("x")
	g.send(e.ctx, e.bt.p, false, false, []*nats.Msg{busy})

	pubs := make([]published, 3)
	for i := range pubs {
		id := fmt.Sprintf("late%d", i)
		pubs[i] = published{msg: msg(id), id: id, out: events.Output{Type: events.TypeCompactionAllowed, Session: "s"}}
	}
	parked := func(id string, err error) error { return fmt.Errorf("parked %s: %w", id, err) }
	// The writer takes the shard's writes late: the shard gives up on it
	// and publishes them itself, and the writer then writes them too.
	require.NoError(t, s.sendVerdicts(e.ctx, &budget{limit: time.Second}, pubs, nil, parked))
	for i := range pubs {
		require.NotNil(t, pubs[i].f, "published by the shard")
		require.NoError(t, e.bt.p.confirm(e.ctx, &budget{limit: 5 * time.Second}, pubs[i]))
	}
	// One more request, answered, shows the late ones were written first.
	maxGroupWait = 10 * time.Second
	acks := g.submit(e.ctx, e.bt.p, false, false, []*nats.Msg{msg("after")})
	require.True(t, acks[0].ok)
	cancel()
	<-done
	st, err := e.JS.Stream(e.ctx, stream)
	require.NoError(t, err)
	info, err := st.Info(e.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(len(pubs)+1), info.State.Msgs, "each verdict once")
}
