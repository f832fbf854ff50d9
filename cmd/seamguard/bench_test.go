package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/bench"
	"github.com/seamguard/seamguard/internal/longtest"
)

// TestMain lets this test binary serve as the benchmark's child server
// process, as the seamguard binary does (see runBench). The tests' serve
// processes that give no --data-dir keep their signing key (and an
// embedded server's data) in a directory of the run, not in the package's.
func TestMain(m *testing.M) {
	if code, ok := bench.ServeChild(); ok {
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "seamguard-test-data-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, set := os.LookupEnv("SEAMGUARD_DATA_DIR"); !set {
		os.Setenv("SEAMGUARD_DATA_DIR", dir)
	}
	code := m.Run()
	os.RemoveAll(dir)
	printFaultTable(os.Stdout)
	os.Exit(code)
}

// TestBenchQuick runs `seamguard bench --quick` end to end, its server in a
// child process, and checks that every measurement reported figures that
// make sense. It asserts no target: the figures depend on the machine (and
// on -race); the table in docs/performance.md comes from a full run.
func TestBenchQuick(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("runs the quick benchmark")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "bench.json")
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"bench", "--quick", "--json", path}, nil, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr:\n%s", stderr.String())
	t.Logf("\n%s", stdout.String())

	var rep bench.Report
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &rep))
	require.True(t, rep.Quick)
	require.Equal(t, "child process", rep.Server)
	require.Len(t, rep.Ingest, 2)
	for _, in := range rep.Ingest {
		require.Positive(t, in.RawPerSec)
		require.Positive(t, in.SeamguardPerSec)
		require.Positive(t, in.LayoutPerSec)
		require.InDelta(t, in.SeamguardPerSec/in.RawPerSec, in.Ratio, 1e-9)
		require.InDelta(t, in.LayoutPerSec/in.RawPerSec, in.LayoutRatio, 1e-9)
		require.Len(t, in.SeamguardRounds, in.Rounds)
		require.Len(t, in.LayoutRounds, in.Rounds)
		require.Len(t, in.RawRounds, in.Rounds)
		require.Positive(t, in.Requests, "the workload holds compaction requests")
		// The raw publish anchor (a write rate) and per-message writes.
		require.Positive(t, in.RawPublishPerSec)
		require.InDelta(t, in.SeamguardPerSec/in.RawPublishPerSec, in.PublishRatio, 1e-9)
		require.Len(t, in.RawPublishRounds, in.Rounds)
		require.Positive(t, in.PerMessagePerSec)
		require.Len(t, in.PerMessageRounds, in.Rounds)
		require.InDelta(t, in.PerMessagePerSec/in.RawPerSec, in.PerMessageRatio, 1e-9)
		require.InDelta(t, in.SeamguardPerSec/in.PerMessagePerSec, in.AtomicOverPerMessage, 1e-9)
		// Ten sessions give a batch fewer states than an atomic batch is
		// worth (minAtomicBatch): batches are counted, not required.
		require.GreaterOrEqual(t, in.BatchedWrites, 16*in.AtomicBatches, "an atomic batch holds at least 16 writes")
	}
	require.NotNil(t, rep.Latency)
	require.Positive(t, rep.Latency.Raw.P50)
	require.GreaterOrEqual(t, rep.Latency.Seamguard.P99, rep.Latency.Seamguard.P50)
	h := rep.HTTP
	require.NotNil(t, h, "the HTTP gateway is measured")
	require.Positive(t, h.NATSPerSec)
	require.Positive(t, h.BinaryPerSec)
	require.Positive(t, h.BatchPerSec)
	require.InDelta(t, h.BinaryPerSec/h.NATSPerSec, h.BinaryRatio, 1e-9)
	require.InDelta(t, h.BatchPerSec/h.NATSPerSec, h.BatchRatio, 1e-9)
	require.Positive(t, h.HTTPLatency.P50)
	require.Positive(t, h.NATSLatency.P50)
	require.InDelta(t, h.HTTPLatency.P50/h.NATSLatency.P50, h.LatencyRatio, 1e-9)
	for _, key := range []string{"http_ingest", "http_latency_p50"} {
		require.Contains(t, rep.Targets, key)
	}
	require.NotNil(t, rep.Sessions)
	require.Positive(t, rep.Sessions.HeapPerSession, "live sessions hold memory")
	require.Less(t, rep.Sessions.HeapPerSession, 64.0*1024, "no session holds 64 KiB")
	require.Positive(t, rep.Sessions.SnapshotBytes)
	require.Equal(t, "always", rep.Sessions.Sync)
	require.Len(t, rep.Sessions.Sizes, 2)
	for i, z := range rep.Sessions.Sizes {
		require.Positive(t, z.SeamguardPerSec)
		require.Positive(t, z.PutPerSec)
		require.Positive(t, z.CASPerSec)
		require.Positive(t, z.ConsumePerSec)
		lowest := min(z.PutPerSec, z.CASPerSec, z.ConsumePerSec)
		require.InDelta(t, z.SeamguardPerSec/lowest, z.Ratio, 1e-9, "the ratio is to the lowest anchor")
		require.InDelta(t, z.SeamguardPerSec/z.CASPerSec, z.CASRatio, 1e-9)
		require.InDelta(t, 1.0, z.WritesPerEvent, 0.01, "one state write per event: no two events of a session share a batch")
		require.Positive(t, z.PerMessagePerSec)
		require.InDelta(t, z.SeamguardPerSec/z.PerMessagePerSec, z.AtomicOverPerMessage, 1e-9)
		require.Positive(t, z.AtomicBatches)
		if i < len(rep.Sessions.Sizes)-1 {
			require.Zero(t, z.LazyPerSec, "only the largest size has a lazy run")
		}
	}
	largest := rep.Sessions.Sizes[len(rep.Sessions.Sizes)-1]
	require.Positive(t, largest.LazyPerSec, "a run that syncs always on its own server has a lazy run")
	require.InDelta(t, largest.SeamguardPerSec/largest.LazyPerSec, largest.LazyRatio, 1e-9)
	require.Equal(t, "2m0s", rep.Sessions.LazySync)
	require.Empty(t, rep.Sessions.LazySkipped)
	rec := rep.Sessions.Recovery
	require.NotNil(t, rec, "the server runs in a child process: recovery after a crash is measured")
	require.Empty(t, rec.Skipped)
	require.Equal(t, largest.Sessions, rec.Sessions)
	require.Positive(t, rec.ServerRestart)
	require.Positive(t, rec.FirstDecision)
	require.Positive(t, rec.LeaseTaken)
	require.LessOrEqual(t, rec.LeaseTaken, rec.FirstDecision, "the lease is taken before the turn is decided")
	require.InDelta(t, rec.ServerRestart+rec.FirstDecision, rec.Total, 1e-9)
	for _, key := range []string{"sessions_cas", "sessions_lazy"} {
		require.Contains(t, rep.Targets, key)
	}
	require.NotNil(t, rep.Decision)
	require.Len(t, rep.Decision.Points, 3)
	last := rep.Decision.Points[2]
	require.Equal(t, 100_000, last.Truncated)
	require.Greater(t, last.ScanNs, last.StepNs, "a scan of 100,000 truncations is slower than a decision")
	require.NotNil(t, rep.Spill)
	require.Positive(t, rep.Spill.Ratio)
	require.Len(t, rep.Spill.Peaks, 2)
	require.Equal(t, rep.Spill.Bytes, rep.Spill.Peaks[1].Bytes)
	require.NotEmpty(t, rep.Rows)
	require.Contains(t, stdout.String(), "raw JetStream")
}

func TestBenchUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"bench", "--skip", "nothing"}, nil, &stdout, &stderr))
	require.Contains(t, stderr.String(), `Skip names "nothing"`)
	require.Equal(t, 2, run(context.Background(), []string{"bench", "extra"}, nil, &stdout, &stderr))
	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"bench", "--session-sizes", "500000,100000"}, nil, &stdout, &stderr))
	require.Contains(t, stderr.String(), "not ascending")
	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"bench", "--session-sizes", "100k"}, nil, &stdout, &stderr))
	require.Contains(t, stderr.String(), "not a number")
}
