package processor_test

import (
	"fmt"
	"github.com/seamguard/seamguard/internal/longtest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestHandOverBackAndForth moves partitions between instances and back
// while a fleet publishes: instance A runs throughout; a second instance
// joins (A hands it half the partitions, and keeps its own copies of the
// sessions it decided), decides for a while, and drains (A takes the
// partitions back), three times, each with deliveries in flight. Every
// request must be decided exactly once and as a single undisturbed
// instance decides it: A may not decide from its copy of a session that
// the other instance has moved on since.
func TestHandOverBackAndForth(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("moves partitions back and forth under load")
	}
	w := genWorkload(120)
	cfg := baseConfig()
	cfg.Partitions = 4
	cfg.AckWait = 2 * time.Second
	cfg.LeaseTTL = time.Second

	ref := func() outcome {
		e := newEnv(t)
		r := e.start(t, cfg)
		e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
		e.waitIdle(t, cfg, 2*time.Minute)
		require.NoError(t, r.stop(t))
		return e.outcome(t, cfg)
	}()

	e := newEnv(t)
	a := e.start(t, cfg)
	msgs := msgsOf(t, w, cfg.Subjects())
	// The fleet publishes in small steps over the whole run.
	const steps = 60
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range steps {
			lo, hi := i*len(msgs)/steps, (i+1)*len(msgs)/steps
			e.publishAll(t, msgs[lo:hi])
			time.Sleep(100 * time.Millisecond)
		}
	}()
	for round := range 3 {
		time.Sleep(700 * time.Millisecond)
		b := e.start(t, cfg)
		waitFor(t, 20*time.Second, fmt.Sprintf("round %d: the second instance to decide", round), func() bool {
			return b.p.Stats().Handled > 50
		})
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, b.stop(t), "round %d: drain", round)
		st := b.p.Stats()
		t.Logf("round %d: the second instance decided %d inputs (%d fenced, %d reloaded)", round, st.Handled, st.Fenced, st.Reloaded)
	}
	wg.Wait()
	e.waitIdle(t, cfg, 2*time.Minute)
	st := a.p.Stats()
	t.Logf("instance A: %d decided, %d fenced, %d reloaded, %d caught up", st.Handled, st.Fenced, st.Reloaded, st.CaughtUp)
	require.NoError(t, a.stop(t))
	requireSameOutcome(t, ref, e.outcome(t, cfg))
}

var _ = nats.Msg{}
