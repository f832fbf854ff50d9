package processor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
)

// blindJS hands out the sessions bucket with reads and writes of one key
// failing while blind is set, and counts the failures.
type blindJS struct {
	jetstream.JetStream
	bucket, key string
	blind       *atomic.Bool
	failed      *atomic.Int32
}

func (b blindJS) wrap(kv jetstream.KeyValue, err error) (jetstream.KeyValue, error) {
	if err != nil || kv.Bucket() != b.bucket {
		return kv, err
	}
	return blindKV{kv, b}, nil
}

func (b blindJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	return b.wrap(b.JetStream.KeyValue(ctx, bucket))
}

func (b blindJS) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return b.wrap(b.JetStream.CreateKeyValue(ctx, cfg))
}

func (b blindJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if m.Subject == "$KV."+b.bucket+"."+b.key && b.blind.Load() {
		b.failed.Add(1)
		return nil, fmt.Errorf("test: the bucket does not answer: %w", nats.ErrTimeout)
	}
	return b.JetStream.PublishMsgAsync(m, opts...)
}

type blindKV struct {
	jetstream.KeyValue
	b blindJS
}

func (k blindKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if key == k.b.key && k.b.blind.Load() {
		k.b.failed.Add(1)
		return nil, fmt.Errorf("test: the bucket does not answer: %w", nats.ErrTimeout)
	}
	return k.KeyValue.Get(ctx, key)
}

func (k blindKV) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if key == k.b.key && k.b.blind.Load() {
		k.b.failed.Add(1)
		return 0, fmt.Errorf("test: the bucket does not answer: %w", nats.ErrTimeout)
	}
	return k.KeyValue.Update(ctx, key, value, last)
}

// TestLeftInputsCaughtUpBeforeLaterOnes: inputs of a session that a shard
// left undecided (here stuck: its state could not be stored) wait for their
// redelivery, and redeliveries come each after its own ack deadline, after
// newer inputs of the session. The first left input comes back, the
// session goes on, a newer input arrives before the second left one: it
// must not be decided before that one is applied, or the second, arriving
// last, is skipped as applied before, and its offset is lost for good.
func TestLeftInputsCaughtUpBeforeLaterOnes(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.AckWait = 3 * time.Second
	cfg.RetryFor = 300 * time.Millisecond
	var blind atomic.Bool
	var failed atomic.Int32
	js := blindJS{JetStream: e.JS, bucket: cfg.Names().Sessions, key: "lo", blind: &blind, failed: &failed}
	be := &env{Test: &embedded.Test{Server: e.Server, NC: e.NC, JS: js}, ctx: e.ctx}
	r := be.start(t, cfg)
	subj := cfg.Subjects()
	msg := func(id, typ, data string) *nats.Msg {
		return binaryMsg(t, subj, fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":"lo","data":%s}`, id, typ, data))
	}
	turn := func(n int) *nats.Msg {
		return msg(fmt.Sprintf("t%d", n), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"role":"user","content":"turn %d"}`, n, n))
	}
	e.publishAll(t, []*nats.Msg{msg("o", "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`), turn(0)})
	e.waitIdle(t, cfg, 10*time.Second)
	require.Equal(t, uint64(2), r.p.Stats().Handled)

	// Two inputs left, a second apart: their redeliveries come a second
	// apart too.
	blind.Store(true)
	e.publishAll(t, []*nats.Msg{turn(1)})
	waitFor(t, 10*time.Second, "the session to be stuck", func() bool { return r.p.Stats().Stuck == 1 })
	time.Sleep(time.Second)
	before := failed.Load()
	e.publishAll(t, []*nats.Msg{turn(2)})
	waitFor(t, 10*time.Second, "the second input to be left", func() bool { return failed.Load() > before })
	time.Sleep(cfg.RetryFor + 100*time.Millisecond)
	blind.Store(false)

	// The first comes back and is decided; a newer input arrives before
	// the second is redelivered.
	waitFor(t, 2*cfg.AckWait, "the first left input to be decided", func() bool { return r.p.Stats().Stuck == 0 })
	e.publishAll(t, []*nats.Msg{turn(3)})
	e.waitIdle(t, cfg, 20*time.Second)

	e.publishAll(t, []*nats.Msg{msg("r", "compaction.requested", `{"request_id":"r","summarizer_input":{"start":0,"end":4},"summary_range":{"start":0,"end":3},"tail_start":3}`)})
	e.waitIdle(t, cfg, 10*time.Second)
	require.NoError(t, r.stop(t))
	vs := e.verdicts(t, cfg)
	require.Len(t, vs, 1, "one verdict, for the request")
	require.Equal(t, events.TypeCompactionAllowed, vs[0].v.Type, "every turn was received: %s", describe(vs[0].v))
	st := r.p.Stats()
	t.Logf("%d decided, %d caught up from the stream; %d failed reads while the bucket was blind", st.Handled, st.CaughtUp, failed.Load())
}

// TestStateLostAfterAckRepaired: a server that acknowledges before it
// syncs can lose, in a power cut, a session state it acknowledged, while
// the inputs it covered stay acknowledged; a backup restore or an older
// instance's write puts an older state back alike. Whatever the servers'
// fsync setting, a session read fresh catches up from the events stream
// and applies those inputs again, so the compaction after it is decided
// on every turn. Deleted, the state is rebuilt from the stream the same way.
func TestStateLostAfterAckRepaired(t *testing.T) {
	for _, damage := range []string{"older", "deleted"} {
		t.Run(damage, func(t *testing.T) {
			e := newEnv(t)
			cfg := baseConfig()
			subj := cfg.Subjects()
			msg := func(id, typ, data string) *nats.Msg {
				return binaryMsg(t, subj, fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":"lost","data":%s}`, id, typ, data))
			}
			turn := func(n int) *nats.Msg {
				return msg(fmt.Sprintf("t%d", n), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"role":"user","content":"turn %d"}`, n, n))
			}
			run := func(msgs ...*nats.Msg) {
				r := e.start(t, cfg)
				e.publishAll(t, msgs)
				e.waitIdle(t, cfg, 10*time.Second)
				require.NoError(t, r.stop(t))
			}
			run(msg("o", "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`), turn(0))
			kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
			require.NoError(t, err)
			before, err := kv.Get(e.ctx, "lost")
			require.NoError(t, err)
			run(turn(1))
			// The bucket is back to the state before turn 1 (or has none),
			// which stays acknowledged.
			if damage == "deleted" {
				require.NoError(t, kv.Delete(e.ctx, "lost"))
			} else {
				_, err = kv.Put(e.ctx, "lost", before.Value())
				require.NoError(t, err)
			}

			run(turn(2), msg("r", "compaction.requested", `{"request_id":"r","summarizer_input":{"start":0,"end":3},"summary_range":{"start":0,"end":2},"tail_start":2}`))
			vs := e.verdicts(t, cfg)
			require.Len(t, vs, 1)
			require.Equal(t, events.TypeCompactionAllowed, vs[0].v.Type, "turn 1 applied again from the stream: %s", describe(vs[0].v))
		})
	}
}
