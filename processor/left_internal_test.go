package processor

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/workload"
)

// TestLeaveIsKnownToTheNextRound: a round that leaves a session records
// its inputs of the batch as left at once, before the round is settled.
// The shard's next round runs while this one's states are in flight; if
// it reads the session again, catches up only to an earlier redelivery and
// then decides a later input from memory, it must first catch up past
// what this round left, or those inputs are skipped as applied.
func TestLeaveIsKnownToTheNextRound(t *testing.T) {
	cfg := Config{Partitions: 4}
	p := &Processor{subj: cfg.Subjects()}
	s := &shard{p: p, sessions: map[string]*session{}}
	subject := func(id string) string {
		return "seamguard.partitioned.0.events." + id
	}
	batch := []delivery{
		{markSubject: subject("a"), mark: []uint64{10}},
		{markSubject: subject("b"), mark: []uint64{11}},
		{markSubject: subject("a"), mark: []uint64{12, 14}},
		{markSubject: subject("b"), mark: []uint64{20}},
		{markSubject: subject("a"), mark: []uint64{17}},
	}
	for i, d := range batch {
		sid, err := p.subj.SessionOf(d.markSubject)
		if err != nil {
			t.Fatalf("test subject %s: %v", d.markSubject, err)
		}
		batch[i].sid = sid // as adopt sets it
	}
	r := &round{s: s, p: p, batch: batch}
	s.put(&session{id: "a"})
	r.leave("a")
	if got := s.horizon("a", delivery{}); got != 17 {
		t.Fatalf("after the round left session a, its horizon is %d; want 17, its last input in the batch", got)
	}
	if got := s.horizon("b", delivery{}); got != 0 {
		t.Fatalf("session b was not left, yet its horizon is %d", got)
	}
	if _, ok := s.sessions["a"]; ok {
		t.Fatal("a left session stays cached")
	}
	// Finishing the round keeps it, and a later round that caught a up
	// past it forgets it.
	s.forgetLeft(r.fenced, nil)
	if got := s.horizon("a", delivery{}); got != 17 {
		t.Fatalf("after the round finished, session a's horizon is %d; want 17", got)
	}
	s.put(&session{id: "a", caughtUp: 17})
	s.forgetLeft(nil, []ack{{session: "a", seq: 18}})
	if got := s.horizon("a", delivery{}); got != 0 {
		t.Fatalf("session a caught up past what was left, yet its horizon is %d", got)
	}
}

// TestLeftInputsNotSkippedByTheNextRound runs the shard's rounds by hand,
// on a real server, in the order that skipped inputs: round Z leaves a
// session's first two inputs (their lease is not current); round A reads
// the session, decides its third input and leaves the fourth and fifth;
// round B, run while A is still pending as the shard runs it, gets the
// first input again (redelivered) and then the sixth. B reads the session
// afresh and must catch up past everything A left before it decides the
// sixth: the stored state has every turn, and no gap.
func TestLeftInputsNotSkippedByTheNextRound(t *testing.T) {
	ctx, p, got := byHand(t, "x")

	const held, gone = 1, 2 // the lease's epoch now, and one that ended
	l := &leases{parts: []leaseState{{held: true, epoch: held, renewed: time.Now()}}, ttl: time.Hour, now: time.Now, wake: make(chan struct{})}
	s := &shard{p: p, lease: l, sessions: map[string]*session{}}
	d := func(seq int, epoch uint64) delivery {
		m := got[seq-1]
		meta, err := m.Metadata()
		require.NoError(t, err)
		require.Equal(t, uint64(seq), meta.Sequence.Stream)
		return delivery{msg: m, meta: meta, sid: p.sessionOf(m.Subject()), at: time.Now(), part: 0, epoch: epoch}
	}

	require.NoError(t, s.handle(ctx, []delivery{d(1, gone), d(2, gone)})) // Z
	require.NoError(t, s.settle())
	require.NoError(t, s.handle(ctx, []delivery{d(3, held), d(4, gone), d(5, held)})) // A, left pending
	require.NotNil(t, s.pending, "round A is pending when round B runs")
	require.NoError(t, s.handle(ctx, []delivery{d(1, held), d(6, held)})) // B
	require.NoError(t, s.settle())

	requireEveryTurn(t, ctx, p, "x", "turns skipped as applied: the stored state never received them")
}

// TestHorizonCatchUpDistrustsLaggingLeader: an input delivered after a
// break (its horizon past it: inputs of its session delivered elsewhere and
// pending) is followed by a catch-up to the horizon. A stream leader elected
// a moment ago may answer that lookup with nothing before it has applied
// its log; believed, the session would count itself caught up, decide its
// next input without the ones in between, and skip their redeliveries as
// applied. The lookup answers nothing once here: the stored state must
// still have every turn.
func TestHorizonCatchUpDistrustsLaggingLeader(t *testing.T) {
	ctx, p, got := byHand(t, "y")

	s := &shard{p: p, sessions: map[string]*session{}}
	d := func(seq int, horizon uint64) delivery {
		m := got[seq-1]
		meta, err := m.Metadata()
		require.NoError(t, err)
		return delivery{msg: m, meta: meta, sid: p.sessionOf(m.Subject()), at: time.Now(), part: -1, horizon: horizon}
	}
	events := p.subj.SessionFilters("y")[0]
	lied := false
	lookupLags = func(filter string) bool {
		if filter == events && !lied {
			lied = true
			return true
		}
		return false
	}
	defer func() { lookupLags = nil }()

	// Sequences 2..5 were delivered elsewhere: 1 comes with the horizon 5,
	// then 6.
	require.NoError(t, s.handle(ctx, []delivery{d(1, 5)}))
	require.NoError(t, s.handle(ctx, []delivery{d(6, 5)}))
	require.NoError(t, s.settle())
	require.True(t, lied, "the lookup answered as a lagging leader")

	requireEveryTurn(t, ctx, p, "y", "turns skipped: a lagging leader's answer was believed")
}

// byHand starts a server and a processor that is not run (its shards are
// driven by hand), publishes session id's opening and five turns (stream
// sequences 1 to 6) and returns them as one fetch delivered them.
func byHand(t *testing.T, id string) (context.Context, *Processor, []jetstream.Msg) {
	t.Helper()
	e := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cfg := Config{Source: "urn:seamguard:test", Partitions: 1, LeaseTTL: time.Minute}
	p, err := New(ctx, e.JS, cfg)
	require.NoError(t, err)

	sc := &workload.Script{ID: id}
	sc.Open("turns", 10, "turns")
	sc.Turns(5, 1) // offsets 0..4, stream sequences 2..6
	msgs, err := (&workload.Workload{Items: sc.Items}).Msgs(cfg.Subjects())
	require.NoError(t, err)
	for _, m := range msgs {
		_, err := e.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	cons, err := p.res.Events.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "by-hand", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	fetched, err := cons.FetchNoWait(len(msgs))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range fetched.Messages() {
		got = append(got, m)
	}
	require.Len(t, got, len(msgs))
	return ctx, p, got
}

// requireEveryTurn fails unless session id's stored state has applied
// stream sequence 6 and received all five turns, with no gap (why says
// what a gap means).
func requireEveryTurn(t *testing.T, ctx context.Context, p *Processor, id, why string) {
	t.Helper()
	entry, err := p.res.Sessions.Get(ctx, id)
	require.NoError(t, err)
	st, err := UnmarshalState(entry.Value())
	require.NoError(t, err)
	require.Equal(t, uint64(6), st.Seq)
	v := st.Ledger.View()
	require.Equal(t, uint64(5), v.Head)
	require.Empty(t, v.Gaps(), why)
}
