package spill

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/internal/latepub"
	"github.com/seamguard/seamguard/processor/ledger"
)

func TestStoreValidate(t *testing.T) {
	err := (&Store{Stream: "bad.name", Bucket: "b*", Retries: -1, Backoff: -time.Second, Subjects: events.Subjects{Prefix: "a..b"}}).Validate()
	require.Error(t, err)
	for _, want := range []string{"Store.JS is nil", "Store.Stream", "Store.Bucket", "Store.Subjects", "Store.Retries", "Store.Backoff"} {
		assert.Contains(t, err.Error(), want)
	}
	err = (&Store{}).Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Store.Stream is empty")
	assert.Contains(t, err.Error(), "Store.Bucket is empty")

	h := newHarness(t, nil)
	require.NoError(t, h.store.Validate())
	_, err = h.store.Write(testCtx(t), ledger.SpillRequest{Session: "a.b", Name: "x"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad spill request")
}

// TestWriteSpillsAcceptedEvents publishes a session in both content modes,
// interleaved with another session and with events the processor rejects or
// drops, and checks the spill holds exactly the accepted events, in order.
func TestWriteSpillsAcceptedEvents(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)

	var wantIDs []string
	pub := func(e ce, accepted bool) uint64 {
		t.Helper()
		seq, ok := h.publish(e)
		require.Equal(t, accepted, ok, "event %s (%s) accepted", e.id, e.typ)
		if accepted && e.session == "alpha" {
			wantIDs = append(wantIDs, h.ids["alpha"][len(h.ids["alpha"])-1])
		}
		return seq
	}
	first := pub(withBinary(opened("alpha", 2)), true)
	pub(opened("beta", 4), true)
	pub(turn("alpha", 0, map[string]any{"text": "hello", "n": 1.50}), true)
	pub(withBinary(turn("alpha", 1, "binary \u00e9 \"quoted\"")), true)
	pub(ce{session: "alpha", body: []byte(`{"specversion":"1.0","id":"bad-json",`)}, false)
	pub(ce{session: "alpha", typ: "turn.appended", binary: true, data: json.RawMessage(`{"offset":2,`)}, false)
	pub(withBinary(turn("beta", 0, "beta's first")), true)
	pub(turn("alpha", 1, "overlaps turn 1"), false) // offset_conflict
	bin := withBinary(turn("alpha", 2, []any{"a", 1, nil}))
	bin.id = "turn-2"
	bin.header = map[string]string{"ce-partitionkey": "alpha", "ce-traceparent": "00-abc%2Ddef"}
	pub(bin, true)
	dup := turn("alpha", 2, "same id again")
	dup.id, dup.msgID = "turn-2", "turn-2-redelivered" // past the stream's dedupe, caught by the ledger
	pub(dup, false)
	pub(truncated("alpha", 0, 2), true)
	pub(turn("beta", 1, "beta's second"), true)
	pub(turn("alpha", 3, nil), true)
	pub(withBinary(turn("alpha", 4, 4)), true)
	pub(ce{session: "alpha", typ: "no.such.type"}, false)
	pub(turn("alpha", 5, map[string]any{"last": true}), true)
	last := pub(withBinary(unsafeCompaction("alpha", "r1", 6)), true)
	pub(turn("alpha", 6, "after the request"), true)
	pub(turn("beta", 2, "beta goes on"), true)

	req, ok := h.req["alpha"]
	require.True(t, ok, "the ledger asked for no spill")
	require.Equal(t, uint64(len(wantIDs)-1), req.Events, "the ledger's count") // the turn after the request is not in it
	require.Equal(t, first, req.FirstSeq)
	require.Equal(t, last, req.LastSeq)

	hd, err := h.store.Write(ctx, req)
	require.NoError(t, err)

	var got bytes.Buffer
	info, err := h.store.Get(ctx, req.Name, &got)
	require.NoError(t, err)
	want := h.expected("alpha")
	require.Equal(t, string(want), got.String(), "the spill's bytes")

	digest, size, err := Digest(bytes.NewReader(got.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, events.SpillHandle{
		Bucket: Bucket, Name: "alpha/1.jsonl", Digest: digest, Size: size,
		Range: events.Range{Start: 0, End: 6}, Events: 9, FirstSeq: first, LastSeq: last,
	}, hd)
	assert.Equal(t, info.Digest, hd.Digest)
	assert.True(t, strings.HasPrefix(hd.Digest, "SHA-256="), hd.Digest)

	// Line by line: structured JSON, the accepted events of alpha in order.
	lines := strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n")
	require.Len(t, lines, 9)
	var ids []string
	for i, l := range lines {
		ev, err := events.DecodeJSON([]byte(l), events.Meta{Seq: uint64(i + 1)})
		require.NoError(t, err, "line %d: %s", i+1, l)
		assert.Equal(t, "alpha", ev.Subject)
		assert.True(t, strings.HasPrefix(l, `{"specversion":"1.0",`), l)
		ids = append(ids, ev.ID)
	}
	assert.Equal(t, wantIDs[:9], ids)
	assert.Contains(t, lines[3], `"partitionkey":"alpha"`)
	assert.Contains(t, lines[3], `"traceparent":"00-abc-def"`)
	assert.Contains(t, lines[3], `"data":{"content":["a",1,null],"offset":2,"role":"user","size":1}`)
	assert.Contains(t, lines[8], `"type":"io.seamguard.compaction.requested"`)

	// Info rebuilds the handle; a missing name says so.
	info, err = h.store.Info(ctx, req.Name)
	require.NoError(t, err)
	rebuilt, err := HandleOf(info)
	require.NoError(t, err)
	assert.Equal(t, hd, rebuilt)
	_, err = h.store.Info(ctx, "alpha/2.jsonl")
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	_, err = h.store.Get(ctx, "alpha/2.jsonl", io.Discard)
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)

	// Writing the same spill again gives the same bytes.
	again, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, hd, again)
}

func withBinary(e ce) ce { e.binary = true; return e }

// smallSession publishes a spillable session "alpha" of n turns, with beta's
// events in between, and returns the spill request and the turns' sequences.
func smallSession(t *testing.T, h *harness, n int, content string) (ledger.SpillRequest, []uint64) {
	t.Helper()
	h.publish(opened("alpha", 2))
	var seqs []uint64
	for i := range n {
		e := turn("alpha", uint64(i), content)
		e.binary = i%2 == 0
		seq, ok := h.publish(e)
		require.True(t, ok)
		seqs = append(seqs, seq)
		if i%4 == 0 {
			h.publish(turn("beta", uint64(i), "other")) // rejected: beta is not open
		}
	}
	h.publish(unsafeCompaction("alpha", "r1", uint64(n)))
	req, ok := h.req["alpha"]
	require.True(t, ok)
	return req, seqs
}

// TestSpillIsAnObject reads a spill of many chunks with nats.go's own
// object store API: Write lays it out as the object store does.
func TestSpillIsAnObject(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 300, strings.Repeat("o", 5000))
	h.store.ChunkSize = 100 << 10 // several chunks, the last one short
	hd, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	obs, err := h.js.ObjectStore(ctx, Bucket)
	require.NoError(t, err)
	got, err := obs.GetBytes(ctx, req.Name)
	require.NoError(t, err, "nats.go reads it and checks its digest")
	assert.Equal(t, string(h.expected("alpha")), string(got))
	info, err := obs.GetInfo(ctx, req.Name)
	require.NoError(t, err)
	assert.Equal(t, hd.Digest, info.Digest)
	assert.Equal(t, uint32(100<<10), info.Opts.ChunkSize)
	assert.Equal(t, uint32((len(got)+(100<<10)-1)/(100<<10)), info.Chunks)
	assert.Equal(t, "alpha", info.Metadata[metaSession])

	// Written again under the same name: the first version's chunks go.
	h.store.ChunkSize = 0
	_, err = h.store.Write(ctx, req)
	require.NoError(t, err)
	requireOnly(ctx, t, h, req.Name)
	got, err = obs.GetBytes(ctx, req.Name)
	require.NoError(t, err)
	assert.Equal(t, string(h.expected("alpha")), string(got))
}

func TestWriteIncomplete(t *testing.T) {
	subject := events.Subjects{}.Events("alpha")
	for _, tc := range []struct {
		name string
		cut  func(ctx context.Context, h *harness, req ledger.SpillRequest, turns []uint64) error
		msg  string
	}{
		{"stream purged", func(ctx context.Context, h *harness, _ ledger.SpillRequest, _ []uint64) error {
			return h.stream.Purge(ctx)
		}, "first event"},
		{"session purged", func(ctx context.Context, h *harness, _ ledger.SpillRequest, _ []uint64) error {
			return h.stream.Purge(ctx, jetstream.WithPurgeSubject(subject))
		}, "first event"},
		{"older events purged", func(ctx context.Context, h *harness, _ ledger.SpillRequest, turns []uint64) error {
			return h.stream.Purge(ctx, jetstream.WithPurgeSequence(turns[3]))
		}, "first event"},
		{"first event deleted", func(ctx context.Context, h *harness, req ledger.SpillRequest, _ []uint64) error {
			return h.stream.DeleteMsg(ctx, req.FirstSeq)
		}, "first event"},
		{"request deleted", func(ctx context.Context, h *harness, req ledger.SpillRequest, _ []uint64) error {
			return h.stream.DeleteMsg(ctx, req.LastSeq)
		}, "last event"},
		{"a turn deleted", func(ctx context.Context, h *harness, _ ledger.SpillRequest, turns []uint64) error {
			return h.stream.DeleteMsg(ctx, turns[5])
		}, "holds 11 accepted events of session alpha"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			ctx := testCtx(t)
			req, turns := smallSession(t, h, 10, strings.Repeat("x", 1000))
			require.NoError(t, tc.cut(ctx, h, req, turns))
			h.store.Backoff = time.Second // a retry would show in the time taken
			start := time.Now()
			_, err := h.store.Write(ctx, req)
			took := time.Since(start)
			require.ErrorIs(t, err, ErrIncomplete)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Less(t, took, time.Second, "an incomplete transcript is not retried")
			t.Logf("%s after %s", err, took)
			_, err = h.store.Info(ctx, req.Name)
			assert.ErrorIs(t, err, jetstream.ErrObjectNotFound, "no object is left for an incomplete spill")
		})
	}
}

func TestWriteIncompleteAgedOut(t *testing.T) {
	h := newHarness(t, func(c *jetstream.StreamConfig) {
		c.MaxAge = time.Second
		c.Duplicates = 500 * time.Millisecond
	})
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 5, "short-lived")
	eventually(t, 20*time.Second, "the events never expired", func() bool {
		si, err := h.stream.Info(ctx)
		return err == nil && si.State.Msgs == 0
	})
	start := time.Now()
	_, err := h.store.Write(ctx, req)
	require.ErrorIs(t, err, ErrIncomplete)
	assert.Less(t, time.Since(start), time.Second)
	t.Log(err)
}

// The producer's own checks, for an end that goes missing after Write has
// looked at it.
func TestProduceDetectsMissingEnd(t *testing.T) {
	t.Run("nothing after", func(t *testing.T) {
		h := newHarness(t, nil)
		ctx := testCtx(t)
		req, _ := smallSession(t, h, 6, "t")
		require.NoError(t, h.stream.DeleteMsg(ctx, req.LastSeq))
		err := h.store.produce(ctx, req, &replay{from: req.FirstSeq, first: true}, NewWriter(io.Discard))
		require.ErrorIs(t, err, ErrIncomplete)
		assert.Contains(t, err.Error(), "the compaction request) at stream sequence "+itoa(req.LastSeq)+" is no longer in stream")
	})
	t.Run("later events", func(t *testing.T) {
		h := newHarness(t, nil)
		ctx := testCtx(t)
		req, _ := smallSession(t, h, 6, "t")
		later, _ := h.publish(turn("alpha", 6, "later"))
		require.NoError(t, h.stream.DeleteMsg(ctx, req.LastSeq))
		err := h.store.produce(ctx, req, &replay{from: req.FirstSeq, first: true}, NewWriter(io.Discard))
		require.ErrorIs(t, err, ErrIncomplete)
		assert.Contains(t, err.Error(), "no longer in stream")
		assert.Contains(t, err.Error(), "next event read is at "+itoa(later))
	})
	t.Run("first event", func(t *testing.T) {
		h := newHarness(t, nil)
		ctx := testCtx(t)
		req, _ := smallSession(t, h, 6, "t")
		require.NoError(t, h.stream.DeleteMsg(ctx, req.FirstSeq))
		err := h.store.produce(ctx, req, &replay{from: req.FirstSeq, first: true}, NewWriter(io.Discard))
		require.ErrorIs(t, err, ErrIncomplete)
		assert.Contains(t, err.Error(), "oldest remaining event is at")
	})
}

// A transcript's reader (a consumer, which may sit on a replica catching
// up) that misses an event the stream's leader holds does not make the
// transcript incomplete: the spill is unavailable for now, and the session
// does not halt for it. The same cuts made in the stream are incomplete
// (TestProduceDetectsMissingEnd, TestWriteIncomplete).
func TestProduceReaderLacksWhatTheLeaderHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		lack func(req ledger.SpillRequest, turns []uint64) uint64
	}{
		{"first event", func(req ledger.SpillRequest, _ []uint64) uint64 { return req.FirstSeq }},
		{"a turn", func(_ ledger.SpillRequest, turns []uint64) uint64 { return turns[3] }},
		{"last event", func(req ledger.SpillRequest, _ []uint64) uint64 { return req.LastSeq }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			ctx := testCtx(t)
			req, turns := smallSession(t, h, 6, "t")
			h.publish(turn("alpha", 6, "later")) // read after a missing last event
			lacks := tc.lack(req, turns)
			readerLacks = func(seq uint64) bool { return seq == lacks }
			t.Cleanup(func() { readerLacks = nil })

			err := h.store.produce(ctx, req, &replay{from: req.FirstSeq, first: true}, NewWriter(io.Discard))
			require.ErrorIs(t, err, ErrUnavailable)
			require.NotErrorIs(t, err, ErrIncomplete)
			t.Log(err)

			// Deleted from the stream, it is gone: the leader agrees.
			require.NoError(t, h.stream.DeleteMsg(ctx, lacks))
			err = h.store.produce(ctx, req, &replay{from: req.FirstSeq, first: true}, NewWriter(io.Discard))
			require.ErrorIs(t, err, ErrIncomplete)
		})
	}
}

// An events stream that is not found (deleted, or not yet known to a
// cluster's meta leader after a restart) makes a spill unavailable, not
// incomplete: the events are gone only once a stream of the name says so.
func TestWriteEventsStreamNotFound(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 4, "t")
	require.NoError(t, h.js.DeleteStream(ctx, testStream))
	h.store.Retries, h.store.Backoff = 2, 10*time.Millisecond
	_, err := h.store.Write(ctx, req)
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	require.NotErrorIs(t, err, ErrIncomplete)
}

func itoa(n uint64) string { b, _ := json.Marshal(n); return string(b) }

func TestWriteBucketDeleted(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 8, "x")
	require.NoError(t, h.js.DeleteObjectStore(ctx, Bucket))
	h.store.Retries, h.store.Backoff = 3, 20*time.Millisecond

	base := goroutines()
	start := time.Now()
	_, err := h.store.Write(ctx, req)
	took := time.Since(start)
	require.Error(t, err)
	assert.ErrorIs(t, err, jetstream.ErrBucketNotFound)
	assert.NotErrorIs(t, err, ErrIncomplete)
	assert.Contains(t, err.Error(), "gave up after 3 attempts")
	assert.GreaterOrEqual(t, took, 60*time.Millisecond, "backoff of 20ms then 40ms")
	t.Logf("%s after %s", err, took)
	settles(t, base)
}

// A bucket too small for the transcript refuses a chunk part way: the
// spill fails at once with ErrStorageFull, without another attempt, and
// the chunks it had sent are purged.
func TestWriteStorageFull(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	require.NoError(t, h.js.DeleteObjectStore(ctx, Bucket))
	_, err := h.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: Bucket, MaxBytes: 256 << 10})
	require.NoError(t, err)
	req, _ := smallSession(t, h, 120, strings.Repeat("y", 8<<10)) // about 1 MB
	h.store.Retries = 3
	h.store.Backoff = 5 * time.Second // a retry would show in the time taken
	h.store.ChunkSize = 64 << 10      // the bucket refuses the fifth chunk, not the first
	var n atomic.Int32
	h.store.JS = flakyJS{h.js, &n, func(int32) error { return nil }}

	base := goroutines()
	start := time.Now()
	_, err = h.store.Write(ctx, req)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrStorageFull)
	assert.ErrorIs(t, err, ErrPermanent)
	assert.NotErrorIs(t, err, ErrIncomplete)
	assert.Contains(t, err.Error(), "maximum bytes")
	assert.NotContains(t, err.Error(), "gave up")
	assert.Less(t, took, 4*time.Second, "a full bucket is not retried")
	assert.LessOrEqual(t, n.Load(), int32(16), "one attempt's chunks at most")
	t.Logf("%s after %s, %d chunk publishes", err, took, n.Load())
	settles(t, base)
	_, err = h.store.Info(ctx, req.Name)
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	eventually(t, 10*time.Second, "partial chunks were left in the bucket", func() bool {
		si, err := objStream(ctx, h)
		return err == nil && si.State.Msgs == 0
	})
}

func objStream(ctx context.Context, h *harness) (*jetstream.StreamInfo, error) {
	s, err := h.js.Stream(ctx, StreamName(Bucket))
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// flakyJS lets fail (or watch) the publishes of an object's chunks: fail
// gets the number of the chunk publish (from 1, over all attempts) and
// returns the error to fail it with, or nil to send it.
type flakyJS struct {
	jetstream.JetStream
	n    *atomic.Int32
	fail func(n int32) error
}

func (f flakyJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if strings.HasPrefix(m.Subject, ChunkPrefix(Bucket)) {
		if err := f.fail(f.n.Add(1)); err != nil {
			return nil, err
		}
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

// requireOnly checks that the bucket holds the spill name and nothing else:
// its info and exactly its chunks and its replay state's, none left over
// from failed attempts, and no registration.
func requireOnly(ctx context.Context, t *testing.T, h *harness, name string) {
	t.Helper()
	info, err := h.store.Info(ctx, name)
	require.NoError(t, err)
	want := uint64(info.Chunks) + stateChunks(t, info) + 1
	eventually(t, 10*time.Second, "chunks of failed attempts were left in the bucket", func() bool {
		si, err := objStream(ctx, h)
		return err == nil && si.State.Msgs == want
	})
}

// stateChunks is the number of chunks of a spill's replay state.
func stateChunks(t *testing.T, info *jetstream.ObjectInfo) uint64 {
	t.Helper()
	st, _, err := stateOf(info)
	require.NoError(t, err)
	return uint64(st.Chunks)
}

func TestWriteRetriesTransientFailures(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 200, strings.Repeat("z", 4<<10)) // several chunks
	h.store.ChunkSize = 64 << 10
	var n atomic.Int32
	h.store.JS = flakyJS{h.js, &n, func(n int32) error {
		if n == 3 || n == 5 {
			// Chunks 1 and 2 of the first attempt are sent, chunk 3 is
			// not; then chunk 2 of the second attempt.
			return nats.ErrTimeout
		}
		return nil
	}}
	base := goroutines()
	hd, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	digest, size, err := Digest(bytes.NewReader(h.expected("alpha")))
	require.NoError(t, err)
	assert.Equal(t, digest, hd.Digest)
	assert.Equal(t, size, hd.Size)
	info, err := h.store.Info(ctx, req.Name)
	require.NoError(t, err)
	assert.Equal(t, int32(5)+int32(info.Chunks)+int32(stateChunks(t, info)), n.Load(), "two failed attempts (3 and 2 chunk publishes), then the whole object and its state")
	requireOnly(ctx, t, h, req.Name)
	settles(t, base)
}

func TestWriteCancelledMidPut(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 200, strings.Repeat("c", 8<<10))
	h.store.ChunkSize = 64 << 10
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int32
	h.store.JS = flakyJS{h.js, &n, func(n int32) error {
		if n == 3 {
			cancel()
		}
		return nil
	}}
	h.store.Retries = 5
	base := goroutines()
	_, err := h.store.Write(wctx, req)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int32(3), n.Load(), "no chunk sent once ctx is done, and no retry")
	t.Log(err)
	settles(t, base)
	_, err = h.store.Info(ctx, req.Name)
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	eventually(t, 10*time.Second, "the cancelled put's chunks were left in the bucket", func() bool {
		si, err := objStream(ctx, h)
		return err == nil && si.State.Msgs == 0
	})
}

func TestWriteCancelledDuringBackoff(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 4, "x")
	require.NoError(t, h.js.DeleteObjectStore(ctx, Bucket))
	h.store.Backoff = time.Minute
	wctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	base := goroutines()
	start := time.Now()
	_, err := h.store.Write(wctx, req)
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, jetstream.ErrBucketNotFound, "the last failure is kept")
	assert.Less(t, time.Since(start), 5*time.Second)
	settles(t, base)
}

func TestGetDetectsDigestMismatch(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 40, strings.Repeat("d", 4<<10))
	hd, err := h.store.Write(ctx, req)
	require.NoError(t, err)

	// Rewrite the object's meta with the digest of other bytes.
	info, err := h.store.Info(ctx, hd.Name)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("something else"))
	info.Digest = "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
	meta, err := json.Marshal(info)
	require.NoError(t, err)
	m := nats.NewMsg(MetaSubject(Bucket, hd.Name))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = meta
	_, err = h.js.PublishMsg(ctx, m)
	require.NoError(t, err)

	var got bytes.Buffer
	_, err = h.store.Get(ctx, hd.Name, &got)
	require.ErrorIs(t, err, ErrDigestMismatch)
	assert.ErrorIs(t, err, jetstream.ErrDigestMismatch)
	assert.Equal(t, int(hd.Size), got.Len(), "every byte was copied")
	t.Log(err)
}

func goroutines() int { return runtime.NumGoroutine() }

func TestGetDetectsMissingChunk(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 60, strings.Repeat("m", 8<<10))
	h.store.ChunkSize = 128 << 10 // about 4 chunks
	hd, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	info, err := h.store.Info(ctx, hd.Name)
	require.NoError(t, err)
	require.Greater(t, info.Chunks, uint32(2))

	obj, err := h.js.Stream(ctx, StreamName(Bucket))
	require.NoError(t, err)
	last, err := obj.GetLastMsgForSubject(ctx, ChunkSubject(Bucket, info.NUID))
	require.NoError(t, err)
	require.NoError(t, obj.DeleteMsg(ctx, last.Sequence))

	var got bytes.Buffer
	_, err = h.store.Get(ctx, hd.Name, &got)
	require.ErrorIs(t, err, ErrDigestMismatch)
	assert.Contains(t, err.Error(), "holds only")
	t.Log(err)
}

// A stream whose answer ends before the transcript's last sequence has not
// lost it: it is behind (a leader just elected, still applying its log).
// The spill is unavailable for now, not incomplete, so the session is not
// halted for it.
func TestWriteBehindIsUnavailable(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 6, "t")
	si, err := h.stream.Info(ctx)
	require.NoError(t, err)
	req.LastSeq = si.State.LastSeq + 5
	h.store.Retries = 1
	_, err = h.store.Write(ctx, req)
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotErrorIs(t, err, ErrIncomplete)
	t.Log(err)
}

// swapJS sends the second chunk publish of an object after the third, as
// the NATS client does when it republishes a chunk the server answered
// "no responders" (a stream leader moving) while later chunks went out.
type swapJS struct {
	jetstream.JetStream
	n    *atomic.Int32
	held *latepub.Future
}

func (f *swapJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if !strings.HasPrefix(m.Subject, ChunkPrefix(Bucket)) {
		return f.JetStream.PublishMsgAsync(m, opts...)
	}
	switch f.n.Add(1) {
	case 2:
		f.held = latepub.New(m)
		return f.held, nil
	case 3:
		third, err := f.JetStream.PublishMsgAsync(m, opts...)
		if err != nil {
			return nil, err
		}
		f.held.Follow(f.JetStream, opts...)
		return third, nil
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

// TestWriteChunksStoredOutOfOrder: a chunk stored after the one sent behind
// it would make the object read back in the wrong order (a digest mismatch
// for every reader). The put notices from the acks' sequences, without
// reading the object back, purges the attempt, and writes it again.
func TestWriteChunksStoredOutOfOrder(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 200, strings.Repeat("o", 4<<10)) // several chunks
	h.store.ChunkSize = 64 << 10
	h.store.Verify = false // the acks alone must tell
	var n atomic.Int32
	h.store.JS = &swapJS{JetStream: h.js, n: &n}
	hd, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	var got bytes.Buffer
	_, err = h.store.Get(ctx, req.Name, &got)
	require.NoError(t, err, "the spill reads back with its digest")
	require.Equal(t, h.expected("alpha"), got.Bytes())
	info, err := h.store.Info(ctx, req.Name)
	require.NoError(t, err)
	require.Greater(t, n.Load(), int32(info.Chunks)+int32(stateChunks(t, info)), "the first attempt was given up")
	requireOnly(ctx, t, h, req.Name)
	t.Logf("spill %s: %d chunks, %d chunk publishes over all attempts", hd.Name, info.Chunks, n.Load())
}

// A stream leader elected a moment ago may answer that it holds no message
// at a sequence it has not applied yet, and hold it a moment later. The
// spill must not take the first answer for the transcript's end being gone
// (ErrIncomplete halts the session): the stream's state shows it holds the
// sequence, and the message read again is there.
func TestWriteLeaderNotYetApplied(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 6, "t")
	var missed atomic.Int32
	real := leaderGet
	leaderGet = func(ctx context.Context, nc *nats.Conn, stream string, seq uint64) (*jsread.Msg, error) {
		if seq == req.LastSeq && missed.CompareAndSwap(0, 1) {
			return nil, nil // not applied yet: no such message
		}
		return real(ctx, nc, stream, seq)
	}
	t.Cleanup(func() { leaderGet = real })
	h.store.Retries = 1
	_, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	require.Equal(t, int32(1), missed.Load(), "the leader answered not found once")
	var got bytes.Buffer
	_, err = h.store.Get(ctx, req.Name, &got)
	require.NoError(t, err)
}
