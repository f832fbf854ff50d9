package processor

// IdleAfterEveryBatch makes every shard turn every session it can into its
// snapshot after each batch, so that each is restored for its next event.
// It returns the function that puts things back. Call it only while no
// processor runs.
func IdleAfterEveryBatch() (restore func()) {
	idleAll = true
	return func() { idleAll = false }
}
