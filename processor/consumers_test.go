package processor_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/processor"
)

// TestConsumerConfigurationFollowsTheProcessor: a start takes a consumer
// as it is only when the server's stored configuration, but for the
// fields the server fills in, is the processor's; a field changed on
// either side, or one set on the consumer that the processor does not
// set, and the start updates the consumer.
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

	// A field the processor sets, changed in what it wants.
	for name, change := range map[string]func(*jetstream.ConsumerConfig){
		"max ack pending": func(c *jetstream.ConsumerConfig) { c.MaxAckPending++ },
		"ack wait":        func(c *jetstream.ConsumerConfig) { c.AckWait *= 2 },
		"filter":          func(c *jetstream.ConsumerConfig) { c.FilterSubjects = append(c.FilterSubjects, "other.>") },
		"description":     func(c *jetstream.ConsumerConfig) { c.Description += "!" },
		"ack policy":      func(c *jetstream.ConsumerConfig) { c.AckPolicy = jetstream.AckExplicitPolicy },
	} {
		w := cfg.ConsumerConfig(0)
		change(&w)
		require.False(t, processor.Configured(w, stored), name)
	}
	// A field set on the consumer that the processor does not set.
	for name, change := range map[string]func(*jetstream.ConsumerConfig){
		"pin": func(c *jetstream.ConsumerConfig) {
			c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL = jetstream.PriorityPolicyPinned, []string{"g"}, 15*time.Second
		},
		"metadata":          func(c *jetstream.ConsumerConfig) { c.Metadata = map[string]string{"owner": "someone"} },
		"max deliver":       func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 5 },
		"max waiting":       func(c *jetstream.ConsumerConfig) { c.MaxWaiting = 7 },
		"inactive":          func(c *jetstream.ConsumerConfig) { c.InactiveThreshold = time.Hour },
		"max batch":         func(c *jetstream.ConsumerConfig) { c.MaxRequestBatch = 10 },
		"headers only":      func(c *jetstream.ConsumerConfig) { c.HeadersOnly = true },
		"backoff":           func(c *jetstream.ConsumerConfig) { c.BackOff = []time.Duration{time.Second, 2 * time.Minute} },
		"replicas, storage": func(c *jetstream.ConsumerConfig) { c.MemoryStorage = true },
	} {
		got := stored
		got.Metadata = map[string]string{}
		for k, v := range stored.Metadata {
			got.Metadata[k] = v
		}
		change(&got)
		require.False(t, processor.Configured(want, got), name)
	}

	// A start with another MaxAckPending updates every consumer, and one
	// with the same asks the server for no update at all (the requests
	// are seen on the JetStream API's subjects).
	var updates atomic.Int64
	ours := map[string]bool{}
	for part := -1; part < cfg.Partitions; part++ {
		ours[cfg.ConsumerName(part)] = true
	}
	// $JS.API.CONSUMER.CREATE.<stream>.<consumer>[.<filter>]; the
	// processor's watches of its buckets create consumers of their own.
	sub, err := e.NC.Subscribe("$JS.API.CONSUMER.CREATE."+cfg.Names().Events+".>", func(m *nats.Msg) {
		if tokens := strings.Split(m.Subject, "."); len(tokens) > 5 && ours[tokens[5]] {
			updates.Add(1)
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, e.NC.Flush())
	for i, n := range []int{100, 200, 200} {
		cfg.MaxAckPending = n
		updates.Store(0)
		r := e.start(t, cfg)
		waitFor(t, 10*time.Second, "the processor consuming", func() bool { return r.p.Ready() == nil })
		require.NoError(t, r.stop(t))
		info, err := e.JS.Consumer(e.ctx, cfg.Names().Events, cfg.ConsumerName(0))
		require.NoError(t, err)
		require.Equal(t, n, info.CachedInfo().Config.MaxAckPending)
		require.True(t, processor.Configured(cfg.ConsumerConfig(0), info.CachedInfo().Config))
		require.NoError(t, e.NC.Flush())
		switch i {
		case 0: // partition 0's consumer is the one made above
			require.Equal(t, int64(cfg.Partitions), updates.Load(), "the first start creates the consumers that are not there")
		case 1:
			require.Equal(t, int64(cfg.Partitions+1), updates.Load(), "a start with another MaxAckPending updates every consumer")
		default:
			require.Zero(t, updates.Load(), "a start with an unchanged configuration updates no consumer")
		}
	}
}
