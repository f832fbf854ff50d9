package processor_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// TestEventsAgeOutBeforeCompaction keeps input events for 2s only. A
// session's early turns, truncated from the context, age out of the stream
// before its compaction: the transcript can no longer be spilled whole, so
// the session halts naming the lost offsets. An operator's session.resumed
// waives them and the next compaction is allowed.
func TestEventsAgeOutBeforeCompaction(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.EventsMaxAge = 2 * time.Second
	cfg.EventsDuplicates = time.Second
	require.NoError(t, cfg.Validate())
	r := e.start(t, cfg)
	subj := cfg.Subjects()
	s := &sessionScript{ID: "aging"}
	sent := 0
	publish := func() []uint64 {
		var msgs []*nats.Msg
		for _, it := range s.Items[sent:] {
			msgs = append(msgs, binaryMsg(t, subj, it.Line))
		}
		sent = len(s.Items)
		return e.publishAll(t, msgs)
	}

	s.Open("turns", 4, "turns")
	s.Turns(20, 1)
	s.Truncate(0, 8)
	early := publish()
	e.waitIdle(t, cfg, 10*time.Second)
	waitFor(t, 15*time.Second, "the early events to age out", func() bool {
		st, err := e.JS.Stream(e.ctx, cfg.Names().Events)
		if err != nil {
			return false
		}
		info, err := st.Info(e.ctx)
		return err == nil && info.State.FirstSeq > early[len(early)-1]
	})

	s.Turns(4, 1)
	tail := s.Head - 4
	// The floor and the reach are in the input; [0, 8) is in no summary.
	s.Compact("c1", rng(8, s.Head), rng(8, tail), tail, false)
	s.Compact("c2", rng(8, s.Head), rng(8, tail), tail, false)
	publish()
	e.waitIdle(t, cfg, 10*time.Second)

	vs := e.verdicts(t, cfg)
	require.Len(t, vs, 2, "verdicts: %v", vs)
	h, ok := vs[0].v.Data.(*events.SessionHalted)
	require.True(t, ok, "c1: %s", describe(vs[0].v))
	assert.Equal(t, "c1", h.RequestID)
	assert.Equal(t, []events.Range{{Start: 0, End: 8}}, h.Unrecoverable)
	assert.Contains(t, h.Message, "[0, 8)")
	assert.Contains(t, h.Message, "could not be spilled")
	assert.Contains(t, h.Message, "no longer in stream", "the message says the events aged out: %s", h.Message)
	assert.Contains(t, h.Message, "session.resumed")
	ref, ok := vs[1].v.Data.(*events.CompactionRefused)
	require.True(t, ok, "c2: %s", describe(vs[1].v))
	require.Len(t, ref.Reasons, 1)
	assert.Equal(t, events.ReasonSessionHalted, ref.Reasons[0].Code)
	assert.Equal(t, []events.Range{{Start: 0, End: 8}}, ref.Reasons[0].AtRisk)
	assert.Nil(t, ref.Spill)

	// The operator accepts the loss; the same compaction is now allowed,
	// the lost offsets cured by the waiver, not by a spill.
	s.Event(events.TypeSessionResumed, map[string]any{"note": "turns 0-7 aged out of the events stream; accepted as lost (OPS-1)"})
	s.Compact("c3", rng(8, s.Head), rng(8, tail), tail, false)
	s.Commit("c3")
	publish()
	e.waitIdle(t, cfg, 10*time.Second)
	vs = e.verdicts(t, cfg)
	require.Len(t, vs, 3, "no verdict for the resume or the commit")
	al, ok := vs[2].v.Data.(*events.CompactionAllowed)
	require.True(t, ok, "c3: %s", describe(vs[2].v))
	assert.Equal(t, "c3", al.RequestID)
	assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, al.Cured)
	assert.Empty(t, al.RecoveredBy)
	assert.Equal(t, []events.Range{{Start: 8, End: tail}}, al.SummaryCoverage)
	require.NoError(t, r.stop(t))
}
