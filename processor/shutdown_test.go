package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// TestGracefulShutdownAcksWhatItFetched cancels Run's context while the
// processor is busy: Run returns nil, and every message it had fetched is
// acknowledged (the ack deadline is a minute, so a message left behind
// would show as pending long after Run returned).
func TestGracefulShutdownAcksWhatItFetched(t *testing.T) {
	longtest.Skip(t)
	e := newEnv(t)
	cfg := baseConfig()
	// Everything is in the stream before the processor starts, so that it
	// is busy from its first fetch on, and there is far more of it than
	// the 50 verdicts waited for, so that it is still busy when cancelled.
	w := genWorkload(200)
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	e.publishAll(t, msgsOf(t, w, cfg.Subjects()))

	r := e.start(t, cfg)
	waitFor(t, 30*time.Second, "the first verdicts", func() bool {
		return e.streamInfo(t, cfg.Names().Verdicts).State.Msgs >= 50
	})
	busy := e.consumerInfo(t, cfg)
	require.NotZero(t, busy.NumAckPending, "messages in flight when cancelled")
	require.NoError(t, r.stop(t), "a drain returns nil")

	require.NoError(t, e.NC.Flush())
	require.Eventually(t, func() bool {
		info := e.consumerInfo(t, cfg)
		return info.NumAckPending == 0
	}, 3*time.Second, 20*time.Millisecond, "every fetched message acknowledged once Run returned")
	info := e.consumerInfo(t, cfg)
	require.Zero(t, info.NumRedelivered)
	require.NotZero(t, info.NumPending, "cancelled before the end: the test proves nothing otherwise")
	require.Equal(t, info.Delivered.Stream, info.AckFloor.Stream, "acked up to what was delivered")

	// What the drained processor decided is stored: a new one finishes the
	// work without a redelivery.
	r = e.start(t, cfg)
	e.waitIdle(t, cfg, 60*time.Second)
	require.NoError(t, r.stop(t))
	require.Zero(t, e.consumerInfo(t, cfg).NumRedelivered)
}

// TestRunFailsWhenItsConsumerIsDeleted deletes the durable consumer under
// a running processor: Run must not return nil as if it had been asked to
// stop, or a service would exit cleanly and stop guarding.
func TestRunFailsWhenItsConsumerIsDeleted(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	r := e.start(t, cfg)
	waitFor(t, 10*time.Second, "the consumer", func() bool {
		_, err := e.JS.Consumer(e.ctx, cfg.Names().Events, durable(cfg))
		return err == nil
	})
	require.NoError(t, e.JS.DeleteConsumer(e.ctx, cfg.Names().Events, durable(cfg)))
	select {
	case err := <-r.done:
		r.ended, r.err = true, err
		require.Error(t, err, "Run returned nil although nobody cancelled it")
		require.ErrorContains(t, err, "consumer")
	case <-time.After(20 * time.Second):
		t.Fatal("Run goes on without its consumer")
	}
}

// TestRunNamesTheFixForAnOldAckPolicy: a partition consumer left by a
// version that acknowledged one input at a time cannot be changed to AckAll
// in place; Run must fail saying which consumer and what to do, not run on
// with acks the server reads differently.
func TestRunNamesTheFixForAnOldAckPolicy(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	old := cfg.ConsumerConfig(0)
	old.AckPolicy = jetstream.AckExplicitPolicy
	_, err = e.JS.CreateConsumer(e.ctx, cfg.Names().Events, old)
	require.NoError(t, err)
	p, err := processor.New(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	err = p.Run(ctx)
	require.Error(t, err)
	require.ErrorContains(t, err, "nats consumer rm "+cfg.Names().Events+" "+old.Durable)
	require.ErrorContains(t, err, "AckExplicit")
}

// TestRunTakesOverAPinnedConsumer: a partition consumer left by a version
// that had a pinned priority group is changed in place (the group removed),
// and every input is decided as on fresh consumers.
func TestRunTakesOverAPinnedConsumer(t *testing.T) {
	w := genWorkload(10)
	cfg := baseConfig()
	ref := func() outcome {
		e := newEnv(t)
		r := e.start(t, cfg)
		e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
		e.waitIdle(t, cfg, time.Minute)
		require.NoError(t, r.stop(t))
		return e.outcome(t, cfg)
	}()

	e := newEnv(t)
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	old := cfg.ConsumerConfig(0)
	old.PriorityPolicy = jetstream.PriorityPolicyPinned
	old.PriorityGroups = []string{"seamguard"}
	old.PinnedTTL = 15 * time.Second
	_, err = e.JS.CreateConsumer(e.ctx, cfg.Names().Events, old)
	require.NoError(t, err)
	r := e.start(t, cfg)
	e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
	e.waitIdle(t, cfg, time.Minute)
	require.NoError(t, r.stop(t))
	requireSameOutcome(t, ref, e.outcome(t, cfg))
	cons, err := e.JS.Consumer(e.ctx, cfg.Names().Events, old.Durable)
	require.NoError(t, err)
	require.Equal(t, jetstream.PriorityPolicyNone, cons.CachedInfo().Config.PriorityPolicy)
	require.Empty(t, cons.CachedInfo().Config.PriorityGroups)
}
