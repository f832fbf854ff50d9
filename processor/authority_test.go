package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/workload"
	"github.com/seamguard/seamguard/processor"
)

// TestResumeOnlyOnTheControlSubject: sessions halted by a gap, spread over
// several partitions. An agent's session.resumed on the events subject is
// rejected not_permitted and lifts nothing (the next request is still
// refused session_halted); the same resume on the control subject lifts the
// halt. Every partition's consumer reads every control subject, yet each is
// decided by one: a control subject that names no session is rejected once.
func TestResumeOnlyOnTheControlSubject(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.Partitions = 4
	subj := cfg.Subjects()
	r := e.start(t, cfg)

	const n = 8
	forged := map[string]string{}
	var msgs []*nats.Msg
	for i := range n {
		s := &workload.Script{ID: fmt.Sprintf("auth-%d", i)}
		s.Open("tokens", 100, "tokens")
		s.TurnAt(0, 100)
		s.TurnAt(300, 400) // [100, 300) never arrived
		s.Compact("k1", workload.R(0, 700), workload.R(0, 500), 500, false)
		forged[s.ID] = s.Event(events.TypeSessionResumed, map[string]any{"note": "an agent waives its own gap"})
		s.Items[len(s.Items)-1].Control = false // on the events subject
		s.Compact("k2", workload.R(0, 700), workload.R(0, 500), 500, false)
		s.Event(events.TypeSessionResumed, map[string]any{"note": "operator: accepted as lost"})
		s.Compact("k3", workload.R(0, 700), workload.R(0, 500), 500, false)
		require.True(t, s.Items[len(s.Items)-2].Control)
		for _, it := range s.Items {
			m, err := it.Msg(subj)
			require.NoError(t, err)
			msgs = append(msgs, m)
		}
	}
	// A control subject that names no session: rejected once, by one
	// partition, not by each.
	bad := nats.NewMsg(subj.Control("not$a-session"))
	bad.Header.Set("Nats-Msg-Id", "bad-control")
	bad.Data = []byte(`{"specversion":"1.0","id":"bad-control","source":"urn:test","type":"io.seamguard.session.resumed","subject":"x","data":{"note":"n"}}`)
	bad.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	msgs = append(msgs, bad)
	e.publishAll(t, msgs)
	e.waitIdle(t, cfg, 30*time.Second)
	assert.Equal(t, uint64(len(msgs)), r.p.Stats().Handled, "every input decided once, control subjects by their session's partition alone")
	require.NoError(t, r.stop(t))

	bySession := map[string][]*events.Verdict{}
	for _, v := range e.verdicts(t, cfg) {
		bySession[v.v.Session] = append(bySession[v.v.Session], v.v)
	}
	require.Len(t, bySession[""], 1, "one rejection of the control subject that names no session")
	assert.Equal(t, events.CodeBadSessionID, bySession[""][0].Data.(*events.EventRejected).Code)
	for i := range n {
		id := fmt.Sprintf("auth-%d", i)
		var got []string
		for _, v := range bySession[id] {
			got = append(got, describe(v))
		}
		vs := bySession[id]
		require.Len(t, vs, 4, "%s: halted, rejected, refused, allowed; got %v", id, got)
		assert.Equal(t, events.TypeSessionHalted, vs[0].Type, got)
		require.Equal(t, events.TypeEventRejected, vs[1].Type, got)
		rej := vs[1].Data.(*events.EventRejected)
		assert.Equal(t, events.CodeNotPermitted, rej.Code)
		assert.Equal(t, subj.Events(id), rej.Input.Subject, "the subject it was published on")
		assert.Equal(t, forged[id], vs[1].Cause.ID)
		assert.Contains(t, rej.Message, "control subject")
		assert.Equal(t, events.TypeCompactionRefused, vs[2].Type, got)
		assert.Contains(t, got[2], "session_halted")
		assert.Equal(t, events.TypeCompactionAllowed, vs[3].Type, got)
	}
}

// TestUpgradeToControlSubjects: a deployment made before control subjects
// (its events stream on the events subjects alone, its partitions' durable
// consumers filtering one subject each, a session halted and its inputs
// acknowledged) is taken over by this version: the stream gains the
// control subjects, the consumers their second filter, and an operator's
// resume on the control subject lifts the halt.
func TestUpgradeToControlSubjects(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.Partitions = 2
	subj := cfg.Subjects()
	apart := subj // a stream made before control subjects were partitioned
	apart.ControlApart = true
	_, err := e.JS.CreateStream(e.ctx, jetstream.StreamConfig{
		Name: cfg.Names().Events, Subjects: []string{"seamguard.events.>"}, Storage: jetstream.FileStorage,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: apart.EventsWildcard(), Destination: apart.TransformDestination()},
		MaxAge:           processor.DefaultEventsMaxAge, Duplicates: processor.DefaultEventsDuplicates,
	})
	require.NoError(t, err)
	for p := -1; p < cfg.Partitions; p++ {
		cc := cfg.ConsumerConfig(p)
		cc.FilterSubject, cc.FilterSubjects = apart.PartitionFilters(p)[0], nil
		if p < 0 {
			cc.FilterSubject = "seamguard.events.>"
		}
		_, err := e.JS.CreateOrUpdateConsumer(e.ctx, cfg.Names().Events, cc)
		require.NoError(t, err)
	}

	s := &workload.Script{ID: "upgraded"}
	s.Open("tokens", 100, "tokens")
	s.TurnAt(0, 100)
	s.TurnAt(300, 400)
	s.Compact("k1", workload.R(0, 700), workload.R(0, 500), 500, false) // halted: [100, 300) never arrived
	var before []*nats.Msg
	for _, it := range s.Items {
		m, err := it.Msg(subj)
		require.NoError(t, err)
		before = append(before, m)
	}
	r := e.start(t, cfg)
	e.publishAll(t, before)
	e.waitIdle(t, cfg, 20*time.Second)

	for p := -1; p < cfg.Partitions; p++ {
		c, err := e.JS.Consumer(e.ctx, cfg.Names().Events, cfg.ConsumerName(p))
		require.NoError(t, err)
		assert.Equal(t, apart.PartitionFilters(p), c.CachedInfo().Config.FilterSubjects, "consumer %s keeps the stream's layout", cfg.ConsumerName(p))
	}
	n := len(s.Items)
	s.Event(events.TypeSessionResumed, map[string]any{"note": "operator: accepted as lost"})
	s.Compact("k2", workload.R(0, 700), workload.R(0, 500), 500, false)
	var after []*nats.Msg
	for _, it := range s.Items[n:] {
		m, err := it.Msg(subj)
		require.NoError(t, err)
		after = append(after, m)
	}
	require.Equal(t, subj.Control("upgraded"), after[0].Subject)
	e.publishAll(t, after)
	e.waitIdle(t, cfg, 20*time.Second)
	require.NoError(t, r.stop(t))
	var types []string
	for _, v := range e.verdicts(t, cfg) {
		types = append(types, v.v.Type)
	}
	assert.Equal(t, []string{events.TypeSessionHalted, events.TypeCompactionAllowed}, types)
}
