package processor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/processor"
)

// TestConsumerConfigurationFollowsTheProcessor: a start takes a consumer
// as it is only when the server's stored configuration (with the fields
// the server adds) has every field the processor sets; any one of them
// changed, the start updates the consumer.
func TestConsumerConfigurationFollowsTheProcessor(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.MaxAckPending = 100
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	want := cfg.ConsumerConfig(0)
	cons, err := e.JS.CreateOrUpdateConsumer(e.ctx, cfg.Names().Events, want)
	require.NoError(t, err)
	stored := cons.CachedInfo().Config
	require.True(t, processor.Configured(want, stored), "the stored configuration, with the server's own fields, is the processor's")
	for name, change := range map[string]func(){
		"max ack pending": func() { want.MaxAckPending++ },
		"ack wait":        func() { want.AckWait *= 2 },
		"filter":          func() { want.FilterSubjects = append(want.FilterSubjects, "other.>") },
		"description":     func() { want.Description += "!" },
	} {
		keep := cfg.ConsumerConfig(0)
		want = keep
		change()
		require.False(t, processor.Configured(want, stored), name)
	}

	// A start with another MaxAckPending updates the consumer.
	for _, n := range []int{100, 200, 200} {
		cfg.MaxAckPending = n
		r := e.start(t, cfg)
		waitFor(t, 10*time.Second, "the processor consuming", func() bool { return r.p.Ready() == nil })
		require.NoError(t, r.stop(t))
		info, err := e.JS.Consumer(e.ctx, cfg.Names().Events, cfg.ConsumerName(0))
		require.NoError(t, err)
		require.Equal(t, n, info.CachedInfo().Config.MaxAckPending)
	}
}
