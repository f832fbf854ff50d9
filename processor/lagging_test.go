package processor_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/processor"
)

// TestCatchUpDistrustsLaggingLeader: a session's stored state is behind the
// stream (put back from a backup), so a fresh instance catches it up before
// the input at hand. The events stream's leader, elected a moment ago,
// answers the first lookup as if nothing followed the stored sequence. The
// input at hand proves the answer stale: the catch-up asks again once the
// stream shows the input applied, applies the turn it had missed, and the
// outcome equals that of a run with no backup and no lag. Trusting the
// answer would apply the input over the hole and skip the missed turn's
// redelivery as applied.
func TestCatchUpDistrustsLaggingLeader(t *testing.T) {
	cfg := baseConfig()
	subj := cfg.Subjects()
	const session = "lag"
	line := func(id, typ, data string) []byte {
		return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":%q,"data":%s}`, id, typ, session, data)
	}
	turn := func(k int) *nats.Msg {
		return binaryMsg(t, subj, line(fmt.Sprintf("t%d", k), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"role":"user","content":"hello"}`, k)))
	}
	open := binaryMsg(t, subj, line("o", "session.opened", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`))
	compact := binaryMsg(t, subj, line("c", "compaction.requested", `{"request_id":"r1","summary_range":{"start":0,"end":2},"summarizer_input":{"start":0,"end":4},"tail_start":2}`))
	run := func(e *env, msgs ...*nats.Msg) {
		r := e.start(t, cfg)
		e.publishAll(t, msgs)
		e.waitIdle(t, cfg, time.Minute)
		require.NoError(t, r.stop(t))
	}

	ref := newEnv(t)
	run(ref, open, turn(0), turn(1), turn(2), turn(3), compact)
	want := ref.outcome(t, cfg)
	require.NotEmpty(t, want.verdicts)

	e := newEnv(t)
	run(e, open, turn(0), turn(1))
	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)
	backup, err := kv.Get(e.ctx, session)
	require.NoError(t, err)
	run(e, turn(2))
	_, err = kv.Put(e.ctx, session, backup.Value()) // restored from the backup
	require.NoError(t, err)

	var lied atomic.Int32
	events := subj.SessionFilters(session)[0]
	defer processor.LookupsLag(func(filter string) bool {
		return filter == events && lied.CompareAndSwap(0, 1)
	})()
	run(e, turn(3), compact)
	require.Equal(t, int32(1), lied.Load(), "the lookup answered as a lagging leader once")
	requireSameOutcome(t, want, e.outcome(t, cfg))
}
