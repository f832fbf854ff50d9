package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor/ledger"
)

// batchEnv is a server with a bucket and a stream that allow atomic
// batches, and a batcher writing to them.
type batchEnv struct {
	*embedded.Test
	ctx context.Context
	kv  jetstream.KeyValue
	bt  *batcher
}

func newBatchEnv(t *testing.T, maxValue int32) *batchEnv {
	t.Helper()
	e := &batchEnv{Test: embedded.StartTest(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	kv, err := e.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", History: 1, MaxValueSize: maxValue})
	require.NoError(t, err)
	require.NoError(t, allowAtomic(ctx, e.JS, "KV_b"))
	e.kv = kv
	_, err = e.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "V", Subjects: []string{"v.>"}, Duplicates: time.Minute, AllowAtomicPublish: true})
	require.NoError(t, err)
	p := &Processor{js: e.JS, log: slog.New(slog.DiscardHandler)}
	p.batches.p = p
	e.bt = &p.batches
	return e
}

// cas is a compare-and-swap of key to val on revision rev, as sendStores
// builds it.
func cas(key, val string, rev uint64) *nats.Msg {
	m := nats.NewMsg("$KV.b." + key)
	m.Data = []byte(val)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	return m
}

// values reads every key of keys.
func (e *batchEnv) values(t *testing.T, keys ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range keys {
		en, err := e.kv.Get(e.ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		require.NoError(t, err)
		out[k] = string(en.Value()) + "@" + strconv.FormatUint(en.Revision(), 10)
	}
	return out
}

// TestAtomicBatchOfStates: a batch of compare-and-swaps is stored whole,
// each at the revision write reports, or not at all when one of them is
// stale, over the bucket's value limit, or mixed with a message the server
// could not stage.
func TestAtomicBatchOfStates(t *testing.T) {
	e := newBatchEnv(t, 256)
	keys := []string{"a", "b", "c"}

	seqs, err := e.bt.write(e.ctx, true, []*nats.Msg{cas("a", "a1", 0), cas("b", "b1", 0), cas("c", "c1", 0)})
	require.NoError(t, err)
	require.Len(t, seqs, 3)
	want := map[string]string{}
	for i, k := range keys {
		want[k] = fmt.Sprintf("%s1@%d", k, seqs[i])
	}
	require.Equal(t, want, e.values(t, keys...), "every state stored, at the revision write reported")

	// One stale revision: nothing of the batch is stored.
	stale := []*nats.Msg{cas("a", "a2", seqs[0]), cas("b", "b2", seqs[1]-1), cas("c", "c2", seqs[2])}
	got, err := e.bt.write(e.ctx, true, stale)
	var be *batchError
	require.ErrorAs(t, err, &be, "a stale revision refuses the batch")
	require.Empty(t, got)
	require.Equal(t, want, e.values(t, keys...), "nothing of a refused batch is stored")

	// One value over the bucket's limit: the same.
	big := []*nats.Msg{cas("a", "a2", seqs[0]), cas("b", string(make([]byte, 300)), seqs[1]), cas("c", "c2", seqs[2])}
	_, err = e.bt.write(e.ctx, true, big)
	require.Error(t, err)
	require.Equal(t, want, e.values(t, keys...), "nothing of a refused batch is stored")

	// A create of a key that exists: the same.
	_, err = e.bt.write(e.ctx, true, []*nats.Msg{cas("d", "d1", 0), cas("a", "a2", 0)})
	require.ErrorAs(t, err, &be)
	require.Equal(t, want, e.values(t, "a", "b", "c", "d"))

	// The caller's messages carry no batch headers afterwards: they are
	// written one by one when a batch does not commit.
	for _, m := range stale {
		require.Empty(t, m.Header.Get(batchIDHeader))
	}
	require.Equal(t, uint64(1), e.bt.committed.Load())
	require.Equal(t, uint64(3), e.bt.fellBack.Load())
}

// TestAtomicBatchSplits: more writes than one batch may hold go in several,
// in order, each whole.
func TestAtomicBatchSplits(t *testing.T) {
	e := newBatchEnv(t, 0)
	n := 2*maxAtomicBatch + 17
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		msgs[i] = cas(fmt.Sprintf("k%d", i), strconv.Itoa(i), 0)
	}
	seqs, err := e.bt.write(e.ctx, true, msgs)
	require.NoError(t, err)
	require.Len(t, seqs, n)
	for i := 1; i < n; i++ {
		require.Equal(t, seqs[i-1]+1, seqs[i])
	}
	for _, i := range []int{0, maxAtomicBatch - 1, maxAtomicBatch, n - 1} {
		en, err := e.kv.Get(e.ctx, fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(i), string(en.Value()))
		require.Equal(t, seqs[i], en.Revision())
	}
	require.Equal(t, uint64(3), e.bt.committed.Load())
	require.Equal(t, uint64(n), e.bt.messages.Load())
}

// verdict is a message with a dedupe id, as prepare builds a verdict.
func verdict(id string) *nats.Msg {
	m := nats.NewMsg("v." + id)
	m.Data = []byte(id)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(jetstream.ExpectedStreamHeader, "V")
	return m
}

// TestAtomicBatchOfVerdicts: a batch holding a verdict the stream stored
// before (a decision made again after a crash) is refused whole, and the
// new verdicts in it are not stored until they are published again.
func TestAtomicBatchOfVerdicts(t *testing.T) {
	e := newBatchEnv(t, 0)
	_, err := e.bt.write(e.ctx, false, []*nats.Msg{verdict("v1"), verdict("v2")})
	require.NoError(t, err)
	_, err = e.bt.write(e.ctx, false, []*nats.Msg{verdict("v3"), verdict("v2"), verdict("v4")})
	var be *batchError
	require.ErrorAs(t, err, &be)
	require.Equal(t, 10201, be.code, "a duplicate id refuses the batch")
	s, err := e.JS.Stream(e.ctx, "V")
	require.NoError(t, err)
	info, err := s.Info(e.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), info.State.Msgs, "nothing of the refused batch is stored")
}

// TestAtomicBatchDisabled: a stream that does not allow atomic batches
// refuses them, and its writes go one at a time from then on.
func TestAtomicBatchDisabled(t *testing.T) {
	e := newBatchEnv(t, 0)
	_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{Name: "PLAIN", Subjects: []string{"plain.>"}})
	require.NoError(t, err)
	m1, m2 := nats.NewMsg("plain.1"), nats.NewMsg("plain.2")
	require.True(t, e.bt.on(false))
	_, err = e.bt.write(e.ctx, false, []*nats.Msg{m1, m2})
	require.ErrorIs(t, err, errAtomicDisabled)
	require.False(t, e.bt.on(false), "verdicts go one at a time once their stream refused a batch")
	require.True(t, e.bt.on(true), "states still go in batches")
}

// TestReadStatesAnswersAsKVGet: the batch read of states answers for each
// key what kv.Get does: its state and revision; no state for a key never
// written or deleted (with the deletion's revision, which a store swaps
// for a state); and leaves out a value that is not a state, for the batch
// to read on its own and report. More keys than one request holds go in
// several.
func TestReadStatesAnswersAsKVGet(t *testing.T) {
	ts := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	var cfg Config
	res, err := Provision(ctx, ts.JS, cfg)
	require.NoError(t, err)
	p := &Processor{cfg: cfg.withDefaults(), js: ts.JS, res: res, log: slog.New(slog.DiscardHandler)}
	kv := res.Sessions
	var ids []string
	want := map[string]uint64{} // id -> state seq
	for i := range maxMultiGet + 100 {
		id := fmt.Sprintf("s%04d", i)
		ids = append(ids, id)
		if i%3 == 0 {
			continue // never written
		}
		var l ledger.Ledger
		val, err := MarshalState(uint64(i), &l)
		require.NoError(t, err)
		_, err = kv.Put(ctx, id, val)
		require.NoError(t, err)
		want[id] = uint64(i)
	}
	require.NoError(t, kv.Delete(ctx, "s0001"))
	delete(want, "s0001")
	_, err = kv.Put(ctx, "s0002", []byte("not a state"))
	require.NoError(t, err)
	delete(want, "s0002")

	parts := make([]int, len(ids))
	for i := range parts {
		parts[i] = -1
	}
	got, err := p.readStates(ctx, p.js.Conn(), ids, parts)
	require.NoError(t, err)
	for _, id := range ids {
		g, ok := got[id]
		e, gerr := kv.Get(ctx, id)
		switch {
		case id == "s0002":
			require.False(t, ok, "a value that is not a state is left out")
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			require.True(t, ok, id)
			require.Nil(t, g.state, id)
		default:
			require.NoError(t, gerr)
			require.True(t, ok, id)
			require.NotNil(t, g.state, id)
			require.Equal(t, want[id], g.state.Seq, id)
			require.Equal(t, e.Revision(), g.rev, id)
		}
	}
	require.NotZero(t, got["s0001"].rev, "a deletion's revision")
}
