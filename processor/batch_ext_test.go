package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// fleetWithVerdicts returns, for n sessions, each one's opening, a turn, and
// a compaction request that is allowed, in that order per session and
// interleaved across sessions.
func fleetWithVerdicts(t *testing.T, subj events.Subjects, n int) []*nats.Msg {
	line := func(id, session, typ, data string) []byte {
		return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":%q,"data":%s}`, id, typ, session, data)
	}
	var opens, turns, reqs []*nats.Msg
	for i := range n {
		s := fmt.Sprintf("batch-%04d", i)
		opens = append(opens, binaryMsg(t, subj, line(s+"-o", s, "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`)))
		turns = append(turns, binaryMsg(t, subj, line(s+"-t", s, "turn.appended", `{"offset":0,"size":1,"role":"user","content":"hello"}`)))
		reqs = append(reqs, binaryMsg(t, subj, line(s+"-r", s, "compaction.requested", `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":0},"tail_start":0}`)))
	}
	return append(append(opens, turns...), reqs...)
}

// TestAtomicBatchesChangeNothingButTheWrites: the same inputs decided with
// atomic batches (the default) and with every write on its own give the
// same verdicts and the same states, byte for byte; with batches, the
// writes went in far fewer messages' worth of commits.
func TestAtomicBatchesChangeNothingButTheWrites(t *testing.T) {
	const sessions = 200
	type outcome struct {
		verdicts map[string]string
		states   map[string][]byte
		stats    processor.Stats
	}
	decide := func(noBatches bool) outcome {
		e := newEnv(t)
		cfg := baseConfig()
		cfg.NoAtomicBatches = noBatches
		msgs := fleetWithVerdicts(t, cfg.Subjects(), sessions)
		// Published before the processor starts, so that its batches fill.
		_, err := processor.Provision(e.ctx, e.JS, cfg)
		require.NoError(t, err)
		e.publishOrdered(t, msgs)
		r := e.start(t, cfg)
		e.waitIdle(t, cfg, time.Minute)
		st := r.p.Stats()
		require.NoError(t, r.stop(t))
		return outcome{verdictBodies(t, e.verdicts(t, cfg)), e.kvStates(t, cfg), st}
	}
	single, batched := decide(true), decide(false)
	require.Len(t, single.verdicts, sessions)
	require.Equal(t, single.verdicts, batched.verdicts, "the same verdicts, byte for byte")
	requireSameStates(t, single.states, batched.states)

	require.Zero(t, single.stats.AtomicBatches)
	require.Zero(t, single.stats.BatchedWrites)
	b := batched.stats
	t.Logf("%d inputs: %d writes in %d atomic batches, %d fell back", b.Handled, b.BatchedWrites, b.AtomicBatches, b.BatchFallbacks)
	require.Zero(t, b.BatchFallbacks)
	require.Positive(t, b.AtomicBatches)
	// 200 verdicts and at least 200 state writes (each session is stored
	// once per batch that touched it), nearly all in batches.
	require.GreaterOrEqual(t, b.BatchedWrites, uint64(2*sessions-20))
	require.Greater(t, b.BatchedWrites/b.AtomicBatches, uint64(4), "batches of several writes each")
}

// TestRepeatedVerdictsFallBackOneByOne: a batch that decides inputs again
// (their states lost after they were acknowledged) publishes verdicts the
// stream holds already. Their atomic batch is refused whole as holding
// duplicates; they are then published one by one, which the stream's
// dedupe drops, and the states are stored: each verdict stays in the stream
// once, and every session moves on.
func TestRepeatedVerdictsFallBackOneByOne(t *testing.T) {
	const sessions = 400
	e := newEnv(t)
	cfg := baseConfig()
	subj := cfg.Subjects()
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	e.publishOrdered(t, fleetWithVerdicts(t, subj, sessions))
	r := e.start(t, cfg)
	e.waitIdle(t, cfg, time.Minute)
	require.NoError(t, r.stop(t))
	first := verdictBodies(t, e.verdicts(t, cfg))
	require.Len(t, first, sessions)

	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)
	var more []*nats.Msg
	for i := range sessions {
		s := fmt.Sprintf("batch-%04d", i)
		require.NoError(t, kv.Delete(e.ctx, s))
		more = append(more, binaryMsg(t, subj, fmt.Appendf(nil, `{"specversion":"1.0","id":"%s-t1","source":"urn:t","type":"io.seamguard.turn.appended","subject":%q,"data":{"offset":1,"size":1,"role":"user","content":"again"}}`, s, s)))
	}
	seqs := e.publishOrdered(t, more)
	r = e.start(t, cfg)
	e.waitIdle(t, cfg, time.Minute)
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d writes in %d atomic batches, %d fell back", st.BatchedWrites, st.AtomicBatches, st.BatchFallbacks)
	require.Positive(t, st.BatchFallbacks, "the repeated verdicts' batch is refused")
	require.Equal(t, first, verdictBodies(t, e.verdicts(t, cfg)), "each verdict once, unchanged")
	states := e.kvStates(t, cfg)
	require.Len(t, states, sessions)
	for i := range sessions {
		s, err := processor.UnmarshalState(states[fmt.Sprintf("batch-%04d", i)])
		require.NoError(t, err)
		require.Equal(t, seqs[i], s.Seq, "session %d moved on past its new turn", i)
	}
}

// TestFencedSessionInAnAtomicBatch: a session whose state another writer
// changed under a running instance fails the compare-and-swap of the
// atomic batch that holds it, which then stores nothing; written again one
// by one, the other sessions are stored and that one is left to be read
// again and decided on its redelivery. Every session ends past its turn,
// applied once.
func TestFencedSessionInAnAtomicBatch(t *testing.T) {
	const sessions = 400
	e := newEnv(t)
	cfg := baseConfig()
	cfg.AckWait = 2 * time.Second
	subj := cfg.Subjects()
	_, err := processor.Provision(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	line := func(id, session, typ, data string) *nats.Msg {
		return binaryMsg(t, subj, fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":%q,"data":%s}`, id, typ, session, data))
	}
	var opens, turns []*nats.Msg
	for i := range sessions {
		s := fmt.Sprintf("fence-%04d", i)
		opens = append(opens, line(s+"-o", s, "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`))
		turns = append(turns, line(s+"-t", s, "turn.appended", `{"offset":0,"size":1,"role":"user","content":"hello"}`))
	}
	r := e.start(t, cfg)
	e.publishOrdered(t, opens)
	e.waitIdle(t, cfg, time.Minute)

	// Another writer stores the same state again under the running
	// instance, which holds the session with the revision before.
	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)
	victim := "fence-0007"
	en, err := kv.Get(e.ctx, victim)
	require.NoError(t, err)
	_, err = kv.Put(e.ctx, victim, en.Value())
	require.NoError(t, err)

	seqs := e.publishOrdered(t, turns)
	e.waitIdle(t, cfg, time.Minute)
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d writes in %d atomic batches, %d fell back; %d fenced", st.BatchedWrites, st.AtomicBatches, st.BatchFallbacks, st.Fenced)
	require.Equal(t, uint64(1), st.Fenced, "only the session changed under the instance is left")
	states := e.kvStates(t, cfg)
	for i := range sessions {
		s, err := processor.UnmarshalState(states[fmt.Sprintf("fence-%04d", i)])
		require.NoError(t, err)
		require.Equal(t, seqs[i], s.Seq, "session %d is past its turn", i)
	}
	require.Empty(t, e.verdicts(t, cfg), "every turn accepted, none applied twice")
}
