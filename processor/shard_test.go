package processor

import (
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/seamguard/seamguard/events"
)

// mix is murmur3's 32-bit finalizer.
func mix(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// TestShardOfIsMixedFNV holds the inlined hash to FNV-32a, mixed: a
// session's shard must not depend on how the hash is computed.
func TestShardOfIsMixedFNV(t *testing.T) {
	for i := range 1000 {
		subj := fmt.Sprintf("seamguard.partitioned.%d.session-%d", i%16, i*7919)
		h := fnv.New32a()
		h.Write([]byte(subj))
		for _, n := range []int{1, 3, 8, 16} {
			if got, want := shardOf(subj, n), int(mix(h.Sum32())%uint32(n)); got != want {
				t.Fatalf("shardOf(%q, %d) = %d, mixed FNV-32a gives %d", subj, n, got, want)
			}
		}
	}
}

// TestShardsAllUsed: the sessions of a partitioned stream spread over every
// shard, whatever the length of their ids. Plain FNV-1a modulo 8 of the
// stored subject sent every session with an even-length id to shard 0 or 4
// (the partition digit, FNV-1a of the id modulo 4, cancelled it out), and
// left shards 1, 3, 5 and 7 idle.
func TestShardsAllUsed(t *testing.T) {
	for _, parts := range []int{4, 16} {
		subj := events.Subjects{Partitions: parts}
		for _, format := range []string{"s-%06d", "agent-%05d", "session-%07d"} { // even, odd, odd lengths
			const shards, n = 8, 40000
			var count [shards]int
			for i := range n {
				count[shardOf(subj.Stored(fmt.Sprintf(format, i)), shards)]++
			}
			for s, c := range count {
				if c < n/shards*8/10 || c > n/shards*12/10 {
					t.Errorf("%d partitions, ids %q: shard %d got %d of %d sessions (%v), not about %d", parts, format, s, c, n, count, n/shards)
				}
			}
		}
	}
}
