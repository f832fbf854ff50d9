package processor

import (
	"testing"
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
	for _, d := range batch {
		if _, err := p.subj.SessionOf(d.markSubject); err != nil {
			t.Fatalf("test subject %s: %v", d.markSubject, err)
		}
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
	// Finishing the round records the same again, and a later round that
	// caught a up past it forgets it.
	s.noteLeft(batch, r.fenced, nil)
	if got := s.horizon("a", delivery{}); got != 17 {
		t.Fatalf("after the round finished, session a's horizon is %d; want 17", got)
	}
	s.put(&session{id: "a", caughtUp: 17})
	s.noteLeft(nil, nil, []ack{{session: "a", seq: 18}})
	if got := s.horizon("a", delivery{}); got != 0 {
		t.Fatalf("session a caught up past what was left, yet its horizon is %d", got)
	}
}
