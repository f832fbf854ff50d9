package processor_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// TestMissingStoreMakesUnready deletes, one at a time, each stream behind
// a store the processor needs under a running processor: Ready names the
// store within a few seconds, and once it is created again (as a restart
// of serve would, through Provision) the processor is ready again. The
// events stream takes its consumers with it: the processor stops, naming
// them, and a new one consumes the stream created again.
func TestMissingStoreMakesUnready(t *testing.T) {
	base := baseConfig()
	n := base.Names()
	for _, tc := range []struct{ stream, names string }{
		{n.Verdicts, "verdict stream " + n.Verdicts},
		{"KV_" + n.Sessions, "session bucket " + n.Sessions},
		{"OBJ_" + n.Spills, "spill object store " + n.Spills},
		{"KV_" + n.Leases, "leases bucket " + n.Leases},
		{n.Events, "events stream " + n.Events},
	} {
		t.Run(tc.stream, func(t *testing.T) {
			e := newEnv(t)
			cfg := baseConfig()
			r := e.start(t, cfg)
			waitFor(t, 10*time.Second, "the processor ready", func() bool { return r.p.Ready() == nil })

			require.NoError(t, e.JS.DeleteStream(e.ctx, tc.stream))
			var last error
			waitFor(t, 10*time.Second, "Ready naming the missing "+tc.names, func() bool {
				last = r.p.Ready()
				return last != nil && strings.Contains(last.Error(), tc.names)
			})
			require.ErrorIs(t, last, processor.ErrNotReady)
			require.ErrorIs(t, last, processor.ErrStoreMissing)
			require.ErrorContains(t, last, "restart seamguard serve")

			_, err := processor.Provision(e.ctx, e.JS, cfg)
			require.NoError(t, err)
			if tc.stream == n.Events {
				select {
				case err := <-r.done:
					r.ended, r.err = true, err
				case <-time.After(15 * time.Second):
					t.Fatal("the processor kept running without its consumers")
				}
				// Whichever of its consumers notices first stops it.
				require.ErrorContains(t, r.err, "on "+n.Events+" stopped")
				require.Regexp(t, `consumer seamguard-(p0|invalid) on`, r.err.Error())
				r = e.start(t, cfg)
			}
			waitFor(t, 15*time.Second, "the processor ready again", func() bool {
				last = r.p.Ready()
				return last == nil
			})
		})
	}
}

// TestSpillWaitsForMissingSpillStore asks for a compaction that needs a
// spill while the spill object store is gone: the session does not halt,
// its input waits unacknowledged, and once the store is back the
// compaction is refused with a spill, as it would have been.
func TestSpillWaitsForMissingSpillStore(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.AckWait = 2 * time.Second
	cfg.RetryFor = time.Second
	r := e.start(t, cfg)
	waitFor(t, 10*time.Second, "the processor ready", func() bool { return r.p.Ready() == nil })

	spills := "OBJ_" + cfg.Names().Spills
	require.NoError(t, e.JS.DeleteStream(e.ctx, spills))
	waitFor(t, 10*time.Second, "Ready naming the missing spill store", func() bool {
		return errors.Is(r.p.Ready(), processor.ErrStoreMissing)
	})

	s := needsSpill("needsspill")
	e.publishAll(t, scriptMsgs(t, cfg.Subjects(), s))

	waitFor(t, 30*time.Second, "the session stuck, waiting for the store", func() bool { return r.p.StuckSessions() == 1 })
	require.ErrorContains(t, r.p.Ready(), "session needsspill")
	kinds := verdictsOf(t, e, cfg, "needsspill")
	require.Zero(t, kinds[events.TypeSessionHalted], "a missing store halts no session: %v", kinds)
	require.Zero(t, kinds[events.TypeCompactionRefused], "nothing is decided without the store: %v", kinds)

	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the compaction refused with its spill once the store is back", func() bool {
		k := verdictsOf(t, e, cfg, "needsspill")
		return k[events.TypeCompactionRefused] == 1 && k[events.TypeTranscriptSpilled] == 1
	})
	waitFor(t, 15*time.Second, "the processor ready again", func() bool { return r.p.Ready() == nil })
	kinds = verdictsOf(t, e, cfg, "needsspill")
	require.Zero(t, kinds[events.TypeSessionHalted], fmt.Sprint(kinds))
}

// TestSpillOutlastsBriefFailures: a spill whose attempts fail for a moment
// with an error not told apart from a lasting one (as some do while a
// JetStream cluster elects a leader) is tried again until its failures
// span the least time they must, and the compaction is refused with its
// spill, the session not halted; a spill that keeps failing halts the
// session, but not before that time.
func TestSpillOutlastsBriefFailures(t *testing.T) {
	const failFor = 2 * time.Second
	for _, tc := range []struct {
		name   string
		fails  int32 // attempts that fail; -1: all
		halted bool
	}{
		{"brief", 5, false},
		{"lasting", -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int32
			defer processor.SpillsFail(func() error {
				if k := n.Add(1); tc.fails < 0 || k <= tc.fails {
					return errors.New("spill: the object store failed (a failure of no known kind)")
				}
				return nil
			}, failFor)()
			e := newEnv(t)
			cfg := baseConfig()
			e.start(t, cfg)

			s := needsSpill("flaky")
			start := time.Now()
			e.publishAll(t, scriptMsgs(t, cfg.Subjects(), s))
			var kinds map[string]int
			waitFor(t, 30*time.Second, "the spill's outcome", func() bool {
				kinds = verdictsOf(t, e, cfg, "flaky")
				return kinds[events.TypeTranscriptSpilled]+kinds[events.TypeSessionHalted] > 0
			})
			took := time.Since(start)
			if tc.halted {
				require.Equal(t, 1, kinds[events.TypeSessionHalted], fmt.Sprint(kinds))
				require.GreaterOrEqual(t, took, failFor, "halted before its failures spanned the least time")
				require.GreaterOrEqual(t, n.Load(), int32(4))
				return
			}
			require.Zero(t, kinds[events.TypeSessionHalted], fmt.Sprint(kinds))
			require.Equal(t, 1, kinds[events.TypeTranscriptSpilled], fmt.Sprint(kinds))
			require.Equal(t, tc.fails+1, n.Load(), "tried until it succeeded")
		})
	}
}

// TestSpillOutlastingItsLeaseCountsForNothing: a spill that fails for good
// after the partition's lease was taken from this instance (another
// instance may have decided the compaction meanwhile, with a spill that
// worked, and not stored its state yet) halts nothing: the session is
// left, and decided again under the next lease, where its spill works.
// The lease is taken by writing its key as another holder would, in the
// first spill attempt; the stored state alone still says the session is
// this instance's.
func TestSpillOutlastingItsLeaseCountsForNothing(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.AckWait = 2 * time.Second
	var calls atomic.Int32
	var stole atomic.Bool
	defer processor.SpillsFail(func() error {
		switch k := calls.Add(1); {
		case k == 1:
			if err := stealLease(e, cfg); err != nil {
				return err
			}
			stole.Store(true)
			fallthrough
		case k <= 4:
			return errors.New("spill: the object store failed (a failure of no known kind)")
		}
		return nil
	}, 100*time.Millisecond)()
	e.start(t, cfg)

	s := needsSpill("outlasted")
	e.publishAll(t, scriptMsgs(t, cfg.Subjects(), s))
	var kinds map[string]int
	waitFor(t, 60*time.Second, "the compaction refused with its spill", func() bool {
		kinds = verdictsOf(t, e, cfg, "outlasted")
		return kinds[events.TypeTranscriptSpilled] > 0 || kinds[events.TypeSessionHalted] > 0
	})
	require.True(t, stole.Load())
	kinds = verdictsOf(t, e, cfg, "outlasted")
	require.Zero(t, kinds[events.TypeSessionHalted], "a spill failure after the lease was lost halted the session: %v", kinds)
	require.Greater(t, calls.Load(), int32(4), "the spill was tried again under the next lease")
	require.Equal(t, 1, kinds[events.TypeTranscriptSpilled], fmt.Sprint(kinds))
	require.Equal(t, 1, kinds[events.TypeCompactionRefused], fmt.Sprint(kinds))
}

// needsSpill is a session whose one compaction, c1, is refused with a
// spill: turns evicted by a truncation that no summary covered.
func needsSpill(id string) *sessionScript {
	s := &sessionScript{ID: id}
	s.Open("turns", 4, "turns")
	s.Turns(10, 1)
	s.Truncate(0, 3)
	s.Compact("c1", rng(0, 10), rng(0, 6), 6, false) // refused, spilled
	return s
}

// stealLease writes partition 0's lease key as another instance taking it
// would, and waits until its holder's renewals (every TTL/4) have found
// the key another's.
func stealLease(e *env, cfg processor.Config) error {
	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Leases)
	if err != nil {
		return fmt.Errorf("test: open the leases bucket: %w", err)
	}
	if err := kv.Delete(e.ctx, "p0"); err != nil {
		return fmt.Errorf("test: delete the lease: %w", err)
	}
	if _, err := kv.Create(e.ctx, "p0", []byte("another-instance")); err != nil {
		return fmt.Errorf("test: take the lease: %w", err)
	}
	time.Sleep(cfg.LeaseTTL)
	return nil
}

// TestSpillNotPublishedAfterItsLease: a spill that worked while the lease
// was held is not published when its round goes on past the lease (here a
// later spill of the round stalls while the lease is taken): the
// partition's next holder decides the compaction again, and what it
// decides is all that is published. Its spills fail for good, so the
// session halts; had the first holder's spill been published, the same
// compaction would stand both refused with a spill and halted.
func TestSpillNotPublishedAfterItsLease(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.AckWait = 2 * time.Second
	cfg.Shards = 1 // both sessions in one round
	var calls atomic.Int32
	defer processor.SpillsFail(func() error {
		switch calls.Add(1) {
		case 1: // the first session's spill works
			return nil
		case 2: // the second's stalls while the lease is taken, then works
			return stealLease(e, cfg)
		}
		return errors.New("spill: the object store failed (a failure of no known kind)")
	}, 100*time.Millisecond)()
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	msgs := append(scriptMsgs(t, cfg.Subjects(), needsSpill("first")), scriptMsgs(t, cfg.Subjects(), needsSpill("second"))...)
	defer processor.FirstRoundTakes(len(msgs))()
	e.publishAll(t, msgs)
	e.start(t, cfg)

	for _, id := range []string{"first", "second"} {
		var kinds map[string]int
		waitFor(t, 60*time.Second, id+"'s compaction decided", func() bool {
			kinds = verdictsOf(t, e, cfg, id)
			return kinds[events.TypeSessionHalted]+kinds[events.TypeTranscriptSpilled] > 0
		})
		require.Zero(t, kinds[events.TypeTranscriptSpilled], "%s: a spill decided under a lease that ended before it was published was published: %v", id, kinds)
		require.Zero(t, kinds[events.TypeCompactionRefused], "%s: %v", id, kinds)
		require.Equal(t, 1, kinds[events.TypeSessionHalted], "%s: %v", id, kinds)
	}
	require.Greater(t, calls.Load(), int32(2))
}
