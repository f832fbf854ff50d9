package spill

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/heapwatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteMemoryBounded spills a transcript far larger than the memory
// Write may use. It spills about 16 MB by default; SEAMGUARD_BIG_SPILL=1
// makes it 200 MB:
//
//	SEAMGUARD_BIG_SPILL=1 go test -run TestWriteMemoryBounded -v -timeout 20m ./spill/
//
// Heap in use is sampled every 2ms during Write (with Verify) and compared
// with the heap in use after publishing and a GC.
//
// The server runs in a child process (this test binary again), as it does
// in production: in the test's own process its file store caches (a block
// read or written stays cached for 10 seconds) would be counted as Write's.
// The in-process variant, run with SEAMGUARD_BIG_SPILL=1, logs that total
// without asserting it.
func TestWriteMemoryBounded(t *testing.T) {
	t.Run("server in a child process", func(t *testing.T) {
		spillBig(t, setupHarness(t, startServerProcess(t), nil), true)
	})
	t.Run("server in process", func(t *testing.T) {
		if os.Getenv("SEAMGUARD_BIG_SPILL") != "1" {
			t.Skip("informational; runs with SEAMGUARD_BIG_SPILL=1")
		}
		spillBig(t, newHarness(t, nil), false)
	})
}

func spillBig(t *testing.T, h *harness, assertBudget bool) {
	const budget = 64 << 20
	size := 16 << 20
	if os.Getenv("SEAMGUARD_BIG_SPILL") == "1" {
		size = 200 << 20
	}
	const content = 8 << 10
	turns := size / content

	h.keep = false
	ctx := testCtx(t)
	start := time.Now()
	h.publish(opened("alpha", 8))
	text := strings.Repeat("abcdefghijklmnopqrstuvwxyz012345", content/32)
	h.publishAll(turns, func(i int) ce {
		e := turn("alpha", uint64(i), fmt.Sprintf("%08d", i)+text[8:])
		e.binary = i%2 == 1
		return e
	})
	h.publish(unsafeCompaction("alpha", "big", uint64(turns)))
	req, ok := h.req["alpha"]
	require.True(t, ok)
	t.Logf("published %d turns of %d KiB in %s", turns, content>>10, time.Since(start).Round(time.Millisecond))

	runtime.GC()
	var hd events.SpillHandle
	var err error
	base, peak, took := heapwatch.Peak(func() { hd, err = h.store.Write(ctx, req) })
	require.NoError(t, err)
	growth := int64(peak) - int64(base)
	t.Logf("spilled %d events, %.1f MB in %s (with Verify); heap in use: baseline %.1f MB, peak %.1f MB, growth %.1f MB (budget %d MB)",
		hd.Events, mb(hd.Size), took.Round(time.Millisecond), mb(base), mb(peak), float64(growth)/(1<<20), budget>>20)
	if assertBudget {
		assert.Less(t, growth, int64(budget), "peak heap growth during Write")
	}
	assert.Equal(t, req.Events, hd.Events)
	assert.Greater(t, hd.Size, uint64(size))

	info, err := h.store.Info(ctx, hd.Name)
	require.NoError(t, err)
	t.Logf("object: %d chunks of up to %d KiB", info.Chunks, chunkSize(info)>>10)
	assert.LessOrEqual(t, uint64(info.Chunks), hd.Size/chunkSize(info)+1, "chunks are full")

	sum := sha256.New()
	n := &discard{}
	_, err = h.store.Get(ctx, hd.Name, io.MultiWriter(sum, n))
	require.NoError(t, err)
	assert.Equal(t, hd.Digest, jetstream.GetObjectDigestValue(sum))
	assert.Equal(t, hd.Size, n.n)
}

func chunkSize(info *jetstream.ObjectInfo) uint64 {
	if info.Opts != nil && info.Opts.ChunkSize > 0 {
		return uint64(info.Opts.ChunkSize)
	}
	return 128 << 10
}

func mb(n uint64) float64 { return float64(n) / (1 << 20) }

// discard counts bytes and drops them.
type discard struct{ n uint64 }

func (d *discard) Write(p []byte) (int, error) {
	d.n += uint64(len(p))
	return len(p), nil
}
