package processor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/processor"
)

// TestIdleSessionsDecideAlike runs a workload of 30 sessions as usual, then
// again with every session turned into its snapshot after every batch and
// restored for its next event, and requires the same verdicts and states: a
// session restored from its snapshot decides as the live one would.
func TestIdleSessionsDecideAlike(t *testing.T) {
	w := genWorkload(30)
	cfg := baseConfig()
	var stats processor.Stats
	run := func() outcome {
		e := newEnv(t)
		r := e.start(t, cfg)
		e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
		e.waitIdle(t, cfg, 90*time.Second)
		stats = r.p.Stats()
		require.NoError(t, r.stop(t))
		return e.outcome(t, cfg)
	}
	began := time.Now()
	ref := run()
	t.Logf("reference: %d events in %s", len(w.Items), time.Since(began).Round(time.Millisecond))
	require.Zero(t, stats.Dropped, "the default cap drops nothing here")
	restore := processor.IdleAfterEveryBatch()
	defer restore()
	requireSameOutcome(t, ref, run())

	// With room for 8 sessions (one a shard), sessions leave memory and
	// are read again from the bucket whenever they come back.
	cfg.MaxSessions = 8
	requireSameOutcome(t, ref, run())
	t.Logf("with MaxSessions 8: %d dropped, %d reloaded, %d held at the end", stats.Dropped, stats.Reloaded, stats.Sessions)
	require.NotZero(t, stats.Dropped, "sessions beyond the cap leave memory")
	require.LessOrEqual(t, stats.Sessions, cfg.MaxSessions, "sessions held once the last batch is swept")
}
