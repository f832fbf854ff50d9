package spill

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// registrations returns the registrations in the bucket, by subject.
func registrations(ctx context.Context, t *testing.T, h *harness) map[string]registrationBody {
	t.Helper()
	obj, err := h.js.Stream(ctx, StreamName(Bucket))
	require.NoError(t, err)
	si, err := obj.Info(ctx, jetstream.WithSubjectFilter(ChunkPrefix(Bucket)+"*.writing"))
	require.NoError(t, err)
	out := map[string]registrationBody{}
	for subj := range si.State.Subjects {
		m, err := obj.GetLastMsgForSubject(ctx, subj)
		require.NoError(t, err)
		var b registrationBody
		require.NoError(t, json.Unmarshal(m.Data, &b))
		out[subj] = b
	}
	return out
}

// chunksOn counts the messages on the chunk subject of nuid.
func chunksOn(ctx context.Context, t *testing.T, h *harness, nuid string) uint64 {
	t.Helper()
	obj, err := h.js.Stream(ctx, StreamName(Bucket))
	require.NoError(t, err)
	subj := ChunkPrefix(Bucket) + nuid
	si, err := obj.Info(ctx, jetstream.WithSubjectFilter(subj))
	require.NoError(t, err)
	return si.State.Subjects[subj]
}

// TestSweepOrphans kills a writer mid-spill (its chunks and registration
// stay, as after kill -9), keeps another writer's spill in flight, and
// sweeps: the dead writer's chunks go once they are minAge old, its stale
// registration goes, and the stored spills (their chunks and replay state)
// and the write in flight are untouched; that write then completes.
func TestSweepOrphans(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	h.store.beat, h.store.markerTTL = 50*time.Millisecond, 600*time.Millisecond
	c := newChain(t, h)
	kept := c.write(ctx, c.round(4, "kept"))
	req := c.round(60, strings.Repeat("k", 4<<10))

	// The dead writer: its context ends after 3 chunks, and it leaves
	// everything behind, as a killed process would.
	dead := *h.store
	dead.crash, dead.ChunkSize = true, 32<<10
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int32
	dead.JS = flakyJS{h.js, &n, func(n int32) error {
		if n == 3 {
			cancel()
		}
		return nil
	}}
	_, err := dead.Write(wctx, req)
	require.ErrorIs(t, err, context.Canceled)
	regs := registrations(ctx, t, h)
	require.Len(t, regs, 1, "the dead writer's registration")
	var deadNUIDs []string
	for _, b := range regs {
		deadNUIDs = b.NUIDs
	}
	require.Len(t, deadNUIDs, 2)
	require.GreaterOrEqual(t, chunksOn(ctx, t, h, deadNUIDs[0]), uint64(3), "the dead writer's chunks are left")

	// The live writer: blocked before its third chunk until released.
	live := *h.store
	live.ChunkSize = 32 << 10
	release := make(chan struct{})
	var m atomic.Int32
	live.JS = flakyJS{h.js, &m, func(n int32) error {
		if n == 3 {
			<-release
		}
		return nil
	}}
	type result struct {
		hd  events.SpillHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		hd, err := live.Write(ctx, req)
		done <- result{hd, err}
	}()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	var liveNUIDs []string
	eventually(t, 10*time.Second, "the live writer never registered and sent two chunks", func() bool {
		for _, b := range registrations(ctx, t, h) {
			if b.NUIDs[0] != deadNUIDs[0] {
				liveNUIDs = b.NUIDs
			}
		}
		return liveNUIDs != nil && chunksOn(ctx, t, h, liveNUIDs[0]) == 2
	})

	// Once the dead writer's registration is stale, a sweep removes it,
	// but keeps its chunks while they are younger than minAge.
	time.Sleep(h.store.markerTTL + 100*time.Millisecond)
	rep, err := h.store.SweepOrphans(ctx, time.Hour)
	require.NoError(t, err)
	t.Logf("%+v", rep)
	assert.Equal(t, 1, rep.Writes, "the live write")
	assert.Equal(t, 1, rep.Stale, "the dead writer's registration")
	assert.Equal(t, 1, rep.Young, "the dead writer's chunks are younger than an hour")
	assert.Zero(t, rep.Orphans)
	assert.NotZero(t, chunksOn(ctx, t, h, deadNUIDs[0]))

	rep, err = h.store.SweepOrphans(ctx, 0)
	require.NoError(t, err)
	t.Logf("%+v", rep)
	assert.Equal(t, 1, rep.Orphans)
	assert.Equal(t, uint64(3), rep.Messages)
	assert.Equal(t, 1, rep.Writes)
	assert.Zero(t, chunksOn(ctx, t, h, deadNUIDs[0]), "the dead writer's chunks are gone")
	regs = registrations(ctx, t, h)
	assert.Len(t, regs, 1, "only the live write's registration is left")
	assert.Equal(t, uint64(2), chunksOn(ctx, t, h, liveNUIDs[0]), "the live write's chunks are kept")

	// The stored spill, with its replay state, is whole.
	info, err := h.store.Info(ctx, kept.Name)
	require.NoError(t, err)
	_, err = h.store.Get(ctx, kept.Name, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, stateChunks(t, info), chunksOn(ctx, t, h, info.Metadata[metaStateNUID]))

	// The write in flight completes, and reads back whole (Verify).
	close(release)
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the live write did not end")
	}
	require.NoError(t, r.err)
	c.written(r.hd, req)
	_, err = h.store.GetChain(ctx, r.hd.Name, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, registrations(ctx, t, h), "a finished write removes its registration")
	rep, err = h.store.SweepOrphans(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, SweepReport{Subjects: 4}, rep, "two spills and their states: nothing to sweep")
}

// A writer whose registration went unrenewed for half its TTL (a process
// paused, NATS unreachable) gives the attempt up before it stores the
// info: a sweep may have taken its chunks for a dead writer's.
func TestWriteRegistrationLapsed(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 20, strings.Repeat("l", 1<<10))
	h.store.beat, h.store.markerTTL = time.Hour, time.Millisecond // never renewed in time
	h.store.Retries = 2
	_, err := h.store.Write(ctx, req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "registration")
	assert.Contains(t, err.Error(), "gave up after 2 attempts")
	t.Log(err)
	_, err = h.store.Info(ctx, req.Name)
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	eventually(t, 10*time.Second, "the attempts left chunks or registrations", func() bool {
		si, err := objStream(ctx, h)
		return err == nil && si.State.Msgs == 0
	})
}
