package spill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// chain publishes session alpha in rounds and tracks the spills its ledger
// asks for, as incremental requests.
type chain struct {
	t    *testing.T
	h    *harness
	head uint64
	n    int                  // rounds
	full *ledger.SpillRequest // the ledger's last request
	prev *events.SpillHandle  // the last spill written
	cum  uint64               // accepted events up to prev's LastSeq
}

func newChain(t *testing.T, h *harness) *chain {
	h.publish(opened("alpha", 2))
	return &chain{t: t, h: h}
}

// round publishes n turns of content (and events of beta, which the
// processor rejects, and of alpha it rejects or drops) and an unsafe
// compaction, and returns the spill request that follows the chain so far.
func (c *chain) round(n int, content string) ledger.SpillRequest {
	c.t.Helper()
	c.n++
	for i := range n {
		e := turn("alpha", c.head, fmt.Sprintf("%s %d", content, c.head))
		e.binary = i%2 == 0
		_, ok := c.h.publish(e)
		require.True(c.t, ok)
		c.head++
		if i%3 == 0 {
			c.h.publish(turn("beta", c.head, "not open")) // rejected
		}
	}
	if c.head > 0 {
		c.h.publish(turn("alpha", c.head-1, "overlaps the last turn")) // offset_conflict
	}
	r := unsafeCompaction("alpha", fmt.Sprintf("r%d", c.n), c.head)
	r.id = fmt.Sprintf("req-%d", c.n)
	c.h.publish(r)
	full, ok := c.h.req["alpha"]
	require.True(c.t, ok)
	require.True(c.t, c.full == nil || full.N != c.full.N, "the ledger asked for no new spill")
	req := full
	if c.full != nil && full.Previous == "" {
		// A ledger that still asks for the whole transcript: ask for what
		// follows the previous spill, as the incremental ledger does.
		req.FirstSeq = c.full.LastSeq + 1
		req.Events = full.Events - c.full.Events
		req.Previous = c.full.Name
	}
	c.full = &full
	return req
}

// written records a spill as written.
func (c *chain) written(hd events.SpillHandle, req ledger.SpillRequest) {
	c.prev = &hd
	c.cum += req.Events
}

// lines is what a spill of req holds: the accepted lines after the
// previous spill.
func (c *chain) lines(req ledger.SpillRequest) string {
	var b bytes.Buffer
	for _, l := range c.h.lines["alpha"][c.cum : c.cum+req.Events] {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// upTo is what the chain up to and with req holds.
func (c *chain) upTo(req ledger.SpillRequest) string {
	var b bytes.Buffer
	for _, l := range c.h.lines["alpha"][:c.cum+req.Events] {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// write writes req, checks the object holds its stretch alone, and
// records it.
func (c *chain) write(ctx context.Context, req ledger.SpillRequest) events.SpillHandle {
	c.t.Helper()
	hd, err := c.h.store.Write(ctx, req)
	require.NoError(c.t, err)
	var got bytes.Buffer
	_, err = c.h.store.Get(ctx, req.Name, &got)
	require.NoError(c.t, err)
	require.Equal(c.t, c.lines(req), got.String(), "spill %s holds the accepted events after the previous spill", req.Name)
	c.written(hd, req)
	return hd
}

func ptr(s string) *string { return &s }

// TestWriteIncrementalChain writes three spills of a session: the first
// holds its events up to the first request, each next one only those
// after the previous spill. Handles describe each object alone but the
// chain's range; GetChain reads the chain back whole.
func TestWriteIncrementalChain(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	c := newChain(t, h)
	var hds []events.SpillHandle
	var reqs []ledger.SpillRequest
	for i, n := range []int{10, 6, 4} {
		req := c.round(n, strings.Repeat(string(rune('a'+i)), 300))
		if i > 0 {
			require.Equal(t, hds[i-1].Name, req.Previous)
			require.Equal(t, hds[i-1].LastSeq+1, req.FirstSeq)
		}
		wantAll := c.upTo(req)
		hd := c.write(ctx, req)

		want := events.SpillHandle{
			Bucket: Bucket, Name: req.Name, Digest: hd.Digest, Size: hd.Size,
			Range: req.Range, Events: req.Events, FirstSeq: req.FirstSeq, LastSeq: req.LastSeq,
		}
		if i > 0 {
			want.Previous = ptr(hds[i-1].Name)
		}
		assert.Equal(t, want, hd)
		assert.Equal(t, events.Range{Start: 0, End: c.head}, hd.Range, "the chain's range")
		info, err := h.store.Info(ctx, req.Name)
		require.NoError(t, err)
		rebuilt, err := HandleOf(info)
		require.NoError(t, err)
		assert.Equal(t, hd, rebuilt, "HandleOf rebuilds the handle, previous included")

		var all bytes.Buffer
		chainHds, err := h.store.GetChain(ctx, req.Name, &all)
		require.NoError(t, err)
		assert.Equal(t, wantAll, all.String(), "the chain holds every accepted event up to %d", req.LastSeq)
		assert.Equal(t, append(append([]events.SpillHandle{}, hds...), hd), chainHds)
		hds, reqs = append(hds, hd), append(reqs, req)
	}
	// Every object's bytes are its own: together exactly the chain.
	var total uint64
	for _, hd := range hds {
		total += hd.Size
	}
	var all bytes.Buffer
	_, err := h.store.GetChain(ctx, hds[2].Name, &all)
	require.NoError(t, err)
	assert.Equal(t, total, uint64(all.Len()))

	// Writing an incremental spill again gives the same handle, and the
	// bucket holds each spill once, with its replay state.
	again, err := h.store.Write(ctx, reqs[1])
	require.NoError(t, err)
	assert.Equal(t, hds[1], again)
	var want uint64
	for _, hd := range hds {
		info, err := h.store.Info(ctx, hd.Name)
		require.NoError(t, err)
		want += uint64(info.Chunks) + stateChunks(t, info) + 1
	}
	eventually(t, 10*time.Second, "the bucket holds more than the three spills", func() bool {
		si, err := objStream(ctx, h)
		return err == nil && si.State.Msgs == want
	})
}

// TestWriteIncrementalRestoresState purges the stream's events up to the
// first spill's last: the second spill needs only the events after it and
// the state stored with the first, since its events are only accepted or
// rejected right (offset_conflict, an id seen before) against that state.
func TestWriteIncrementalRestoresState(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	c := newChain(t, h)
	first := c.round(8, "first")
	c.write(ctx, first)
	// Rejected only by a ledger that knows the first stretch: a turn over
	// offset 0, and a copy of the first compaction request that the
	// stream's dedupe let through.
	_, ok := h.publish(turn("alpha", 0, "over turn 0"))
	require.False(t, ok)
	again := unsafeCompaction("alpha", "r1", 8)
	again.id, again.msgID = "req-1", "req-1-again"
	_, ok = h.publish(again)
	require.False(t, ok)
	second := c.round(5, "second")
	require.NoError(t, h.stream.Purge(ctx, jetstream.WithPurgeSequence(first.LastSeq+1)))
	si, err := h.stream.Info(ctx)
	require.NoError(t, err)
	require.Greater(t, si.State.FirstSeq, first.LastSeq, "the first spill's events are gone")
	c.write(ctx, second)
}

// TestWriteIncrementalFallback: when the previous spill's state cannot be
// used, the replay starts at the session's first event, and the spill is
// the same; when those events are gone too, the spill is incomplete.
func TestWriteIncrementalFallback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(ctx context.Context, h *harness, prev events.SpillHandle)
	}{
		{"state purged", func(ctx context.Context, h *harness, prev events.SpillHandle) {
			info, err := h.store.Info(ctx, prev.Name)
			require.NoError(t, err)
			purgeSubject(ctx, t, h, ChunkSubject(Bucket, info.Metadata[metaStateNUID]))
		}},
		{"state garbled", func(ctx context.Context, h *harness, prev events.SpillHandle) {
			info, err := h.store.Info(ctx, prev.Name)
			require.NoError(t, err)
			subj := ChunkSubject(Bucket, info.Metadata[metaStateNUID])
			purgeSubject(ctx, t, h, subj)
			_, err = h.js.Publish(ctx, subj, []byte("not a ledger"))
			require.NoError(t, err)
			info.Metadata[metaStateSize] = "12"
			sum, _, _ := Digest(strings.NewReader("not a ledger"))
			info.Metadata[metaStateDigest] = sum
			putMeta(ctx, t, h, info)
		}},
		{"older seamguard", func(ctx context.Context, h *harness, prev events.SpillHandle) {
			info, err := h.store.Info(ctx, prev.Name)
			require.NoError(t, err)
			for _, k := range []string{metaStateNUID, metaStateChunks, metaStateSize, metaStateDigest, metaStateSeq} {
				delete(info.Metadata, k)
			}
			putMeta(ctx, t, h, info)
		}},
		{"previous deleted", func(ctx context.Context, h *harness, prev events.SpillHandle) {
			obs, err := h.js.ObjectStore(ctx, Bucket)
			require.NoError(t, err)
			require.NoError(t, obs.Delete(ctx, prev.Name))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			ctx := testCtx(t)
			c := newChain(t, h)
			first := c.round(8, "first")
			hd := c.write(ctx, first)
			second := c.round(5, "second")
			third := c.round(3, "third")
			tc.spoil(ctx, h, hd)
			c.write(ctx, second) // checks its bytes
			c.write(ctx, third)  // from the state the fallback stored

			// Without the events before it, the fallback cannot replay.
			tc.spoil(ctx, h, *c.prev)
			fourth := c.round(2, "fourth")
			require.NoError(t, h.stream.Purge(ctx, jetstream.WithPurgeSequence(third.LastSeq+1)))
			h.store.Backoff = time.Minute
			_, err := h.store.Write(ctx, fourth)
			require.ErrorIs(t, err, ErrIncomplete)
			assert.Contains(t, err.Error(), "whole session was replayed")
			t.Log(err)
		})
	}
}

func purgeSubject(ctx context.Context, t *testing.T, h *harness, subj string) {
	t.Helper()
	obj, err := h.js.Stream(ctx, StreamName(Bucket))
	require.NoError(t, err)
	require.NoError(t, obj.Purge(ctx, jetstream.WithPurgeSubject(subj)))
}

// putMeta replaces an object's info.
func putMeta(ctx context.Context, t *testing.T, h *harness, info *jetstream.ObjectInfo) {
	t.Helper()
	meta, err := json.Marshal(info)
	require.NoError(t, err)
	m := nats.NewMsg(MetaSubject(Bucket, info.Name))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = meta
	_, err = h.js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// TestWriteQuota: a spill that would exceed its byte budget fails at once
// with ErrQuota and leaves nothing; one that fits it exactly is written.
func TestWriteQuota(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	c := newChain(t, h)
	req := c.round(40, strings.Repeat("q", 4<<10))
	size := uint64(len(c.lines(req)))
	h.store.ChunkSize = 32 << 10 // chunks are sent before the quota is reached
	h.store.Backoff = 5 * time.Second
	req.MaxBytes = size - 1
	start := time.Now()
	_, err := h.store.Write(ctx, req)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrQuota)
	assert.ErrorIs(t, err, ErrPermanent)
	assert.Less(t, took, 4*time.Second, "no retry")
	assert.Contains(t, err.Error(), fmt.Sprintf("at most %d bytes", size-1))
	t.Log(err)
	_, err = h.store.Info(ctx, req.Name)
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	eventually(t, 10*time.Second, "the chunks of the refused spill were left", func() bool {
		si, err := objStream(ctx, h)
		return err == nil && si.State.Msgs == 0
	})

	req.MaxBytes = size
	hd := c.write(ctx, req)
	assert.Equal(t, size, hd.Size)
}

// TestGetChainBroken: GetChain refuses chains it cannot follow, before
// copying a byte.
func TestGetChainBroken(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	c := newChain(t, h)
	var hds []events.SpillHandle
	for i := range 3 {
		hds = append(hds, c.write(ctx, c.round(3, fmt.Sprintf("r%d", i))))
	}
	relink := func(name, previous, session string) {
		info, err := h.store.Info(ctx, name)
		require.NoError(t, err)
		if previous == "" {
			delete(info.Metadata, metaPrevious)
		} else {
			info.Metadata[metaPrevious] = previous
		}
		if session != "" {
			info.Metadata[metaSession] = session
		}
		putMeta(ctx, t, h, info)
	}
	get := func(name string) error {
		var b bytes.Buffer
		_, err := h.store.GetChain(ctx, name, &b)
		if err != nil {
			assert.Zero(t, b.Len(), "bytes were copied before the chain was checked")
		}
		return err
	}
	require.NoError(t, get(hds[2].Name))

	h.store.MaxChain = 2
	err := get(hds[2].Name)
	require.ErrorIs(t, err, ErrChain)
	assert.Contains(t, err.Error(), "longer than 2")
	h.store.MaxChain = 0

	relink(hds[0].Name, hds[2].Name, "") // 1 -> 3 -> 2 -> 1
	err = get(hds[2].Name)
	require.ErrorIs(t, err, ErrChain)
	assert.Contains(t, err.Error(), "loops")
	t.Log(err)

	relink(hds[0].Name, "alpha/9.jsonl", "")
	err = get(hds[2].Name)
	require.ErrorIs(t, err, ErrChain)
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	t.Log(err)

	relink(hds[0].Name, "", "gamma")
	err = get(hds[2].Name)
	require.ErrorIs(t, err, ErrChain)
	assert.Contains(t, err.Error(), "of session gamma")

	relink(hds[0].Name, "", "alpha")
	relink(hds[2].Name, hds[0].Name, "") // 3 -> 1, skipping 2: fine, in order
	require.NoError(t, get(hds[2].Name))
	relink(hds[0].Name, hds[2].Name, "")
	relink(hds[2].Name, hds[1].Name, "")
	relink(hds[1].Name, hds[2].Name, "") // 2 -> 3, out of order
	err = get(hds[1].Name)
	require.ErrorIs(t, err, ErrChain)
	assert.Contains(t, err.Error(), "but its previous spill")

	_, err = h.store.GetChain(ctx, "alpha/9.jsonl", io.Discard)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	assert.NotErrorIs(t, err, ErrChain)
}

func TestCheckRequestChain(t *testing.T) {
	good := ledger.SpillRequest{Session: "a", Name: "a/2.jsonl", Previous: "a/1.jsonl", FirstSeq: 5, LastSeq: 9, Events: 5, Range: events.Range{End: 4}}
	require.NoError(t, checkRequest(good))
	for _, tc := range []struct {
		change func(*ledger.SpillRequest)
		want   string
	}{
		{func(r *ledger.SpillRequest) { r.Previous = r.Name }, "names itself"},
		{func(r *ledger.SpillRequest) { r.Events = 6 }, "6 events cannot lie between"},
		{func(r *ledger.SpillRequest) { r.Range = events.Range{Start: 3, End: 2} }, "not a range"},
	} {
		r := good
		tc.change(&r)
		err := checkRequest(r)
		require.ErrorIs(t, err, ErrPermanent)
		assert.Contains(t, err.Error(), tc.want)
	}
}
