package heapwatch

import (
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

var (
	mu      sync.Mutex
	samples = []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
)

// InUse is runtime.MemStats.HeapInuse, read without stopping the world.
func InUse() uint64 {
	mu.Lock()
	defer mu.Unlock()
	metrics.Read(samples)
	return samples[0].Value.Uint64() + samples[1].Value.Uint64()
}

// Peak runs f while sampling the heap in use every 2ms, and returns the heap
// in use just before f, the highest sample, and how long f took. The caller
// settles the heap (runtime.GC) first if the baseline should not count
// garbage.
func Peak(f func()) (base, peak uint64, took time.Duration) {
	base = InUse()
	var high atomic.Uint64
	high.Store(base)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if v := InUse(); v > high.Load() {
					high.Store(v)
				}
			}
		}
	})
	start := time.Now()
	f()
	took = time.Since(start)
	close(stop)
	wg.Wait()
	return base, high.Load(), took
}
