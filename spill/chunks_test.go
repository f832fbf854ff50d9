package spill

import (
	"math/rand/v2"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestChunkIndexRoundTrip records random increasing sequences and reads
// every chunk's sequence back from the stored index.
func TestChunkIndexRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := 1 + rng.IntN(300)
		seqs := make([]uint64, n)
		var r seqRuns
		next := uint64(1 + rng.IntN(5))
		for i := range seqs {
			if rng.IntN(4) == 0 {
				next += uint64(1 + rng.IntN(3))
			}
			seqs[i] = next
			r.add(next)
			next++
		}
		info := &jetstream.ObjectInfo{Chunks: uint32(n), ObjectMeta: jetstream.ObjectMeta{Metadata: map[string]string{metaChunkSeqs: r.String()}}}
		x, ok := ChunkIndexOf(info)
		require.True(t, ok, "index %q of %d chunks", r.String(), n)
		for k, want := range seqs {
			got, ok := x.Seq(uint32(k))
			require.True(t, ok)
			require.Equal(t, want, got, "chunk %d of %q", k, r.String())
		}
		_, ok = x.Seq(uint32(n))
		require.False(t, ok, "past the last chunk")
	}
}

// TestChunkIndexRejects: an index that does not describe the object's
// chunks, in increasing order, is not used.
func TestChunkIndexRejects(t *testing.T) {
	for _, tc := range []struct {
		idx    string
		chunks uint32
	}{
		{"", 0}, {"", 3}, {"5+3", 2}, {"5+3", 4}, {"5+0", 0}, {"5", 1}, {"x+1", 1}, {"5+x", 1},
		{"5+3,6+1", 4}, {"5+3,7+1", 4}, {"0+1", 1}, {"18446744073709551615+2", 2}, {"5+3,", 3}, {"05+3", 3}, {"5+3,8+1", 4},
	} {
		info := &jetstream.ObjectInfo{Chunks: tc.chunks, ObjectMeta: jetstream.ObjectMeta{Metadata: map[string]string{metaChunkSeqs: tc.idx}}}
		_, ok := ChunkIndexOf(info)
		require.False(t, ok, "%q for %d chunks", tc.idx, tc.chunks)
	}
	var many seqRuns
	for i := range maxIndexRuns + 1 {
		many.add(uint64(2*i + 1))
	}
	require.Empty(t, many.String(), "too many runs: no index")
}

// FuzzChunkIndex: whatever a stored index says, reading it never panics,
// and an index accepted for n chunks gives n increasing sequences.
func FuzzChunkIndex(f *testing.F) {
	f.Add("5+3,9+2", uint32(5))
	f.Add("1+1", uint32(1))
	f.Fuzz(func(t *testing.T, idx string, chunks uint32) {
		chunks %= 100_000
		info := &jetstream.ObjectInfo{Chunks: chunks, ObjectMeta: jetstream.ObjectMeta{Metadata: map[string]string{metaChunkSeqs: idx}}}
		x, ok := ChunkIndexOf(info)
		if !ok {
			return
		}
		var last uint64
		for k := range chunks {
			s, ok := x.Seq(k)
			if !ok || s <= last {
				t.Fatalf("chunk %d of %q: %d after %d (%v)", k, idx, s, last, ok)
			}
			last = s
		}
		if x.runs.String() != idx {
			t.Fatalf("%q stored again as %q", idx, x.runs.String())
		}
	})
}
