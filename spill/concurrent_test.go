package spill

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteSameNameConcurrently writes one spill from two writers at once,
// as two instances do while a session changes hands: both must end with the
// same handle (the content is the same), and neither may fail.
func TestWriteSameNameConcurrently(t *testing.T) {
	h := newHarness(t, nil)
	req, _ := smallSession(t, h, 400, strings.Repeat("x", 3000))
	fails := 0
	for round := range 20 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		digests := make([]string, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hd, err := h.store.Write(h.ctx, req)
				errs[i], digests[i] = err, hd.Digest
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				fails++
				t.Logf("round %d writer %d: %v", round, i, err)
			}
		}
		if errs[0] == nil && errs[1] == nil {
			assert.Equal(t, digests[0], digests[1])
		}
	}
	require.Zero(t, fails)
}
