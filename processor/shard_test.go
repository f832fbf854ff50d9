package processor

import (
	"fmt"
	"hash/fnv"
	"testing"
)

// TestShardOfIsFNV holds the inlined hash to FNV-32a: a session's shard
// must not depend on how the hash is computed.
func TestShardOfIsFNV(t *testing.T) {
	for i := range 1000 {
		subj := fmt.Sprintf("seamguard.partitioned.%d.session-%d", i%16, i*7919)
		h := fnv.New32a()
		h.Write([]byte(subj))
		for _, n := range []int{1, 3, 8, 16} {
			if got, want := shardOf(subj, n), int(h.Sum32()%uint32(n)); got != want {
				t.Fatalf("shardOf(%q, %d) = %d, FNV-32a gives %d", subj, n, got, want)
			}
		}
	}
}
