// Package heapwatch measures the Go heap while something runs: the heap in
// use read without stopping the world, and its peak sampled every 2ms. The
// spill memory test and the benchmark's spill measurement share it.
package heapwatch
