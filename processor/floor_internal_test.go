package processor

import (
	"log/slog"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProvenNeedsEveryCondition: a state read fresh is taken as caught up
// to its partition's floor only when every condition of floor.go holds;
// each case below breaks one, and gets no proof.
func TestProvenNeedsEveryCondition(t *testing.T) {
	ok := prefetched{rev: 50, state: &State{Seq: 40}, floor: 100, floorOK: true, byProcessor: true}
	cases := []struct {
		name string
		got  func(prefetched) prefetched
		base uint64
		prep func(s *shard)
		want uint64
	}{
		{name: "all hold", want: 100},
		{name: "no state", got: func(g prefetched) prefetched { g.state = nil; return g }},
		{name: "not stored by a processor", got: func(g prefetched) prefetched { g.byProcessor = false; return g }},
		{name: "no floor in the view", got: func(g prefetched) prefetched { g.floorOK = false; return g }},
		{name: "floor short of the delivery's base", base: 101},
		{name: "floor at the base", base: 100, want: 100},
		{name: "park record newer than the state", got: func(g prefetched) prefetched { g.parkRev = 51; return g }},
		{name: "park record older than the state", got: func(g prefetched) prefetched { g.parkRev = 49; return g }, want: 100},
		{name: "an input seen here past the state", prep: func(s *shard) { s.see("s", 41, 0) }},
		{name: "an input seen here within the state", prep: func(s *shard) { s.see("s", 40, 0) }, want: 100},
		{name: "floor short of what was forgotten", prep: func(s *shard) { s.see("x", 1, 0); s.seenPruned[0] = 101 }},
		{name: "floors off", prep: func(s *shard) { s.p.floors.off.Store(true) }},
		{name: "state before the floor's low end", got: func(g prefetched) prefetched { g.floorLow = 41; return g }},
		{name: "state at the floor's low end", got: func(g prefetched) prefetched { g.floorLow = 40; return g }, want: 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &Processor{log: slog.New(slog.DiscardHandler), floors: newFloors(2)}
			s := &shard{p: p}
			if c.prep != nil {
				c.prep(s)
			}
			got := ok
			if c.got != nil {
				got = c.got(got)
			}
			require.Equal(t, c.want, s.proven("s", got, 0, c.base))
		})
	}
}

// TestStoredRevsNoticesTheLogGoingBack: the writer's groups are stored at
// rising sequences; one stored at or below an earlier one turns the floors
// off for good.
func TestStoredRevsNoticesTheLogGoingBack(t *testing.T) {
	p := &Processor{log: slog.New(slog.DiscardHandler), floors: newFloors(2)}
	g := &writeGroup{p: p, states: true}
	g.storedRevs([]groupAck{{seq: 10, ok: true}, {seq: 12, ok: true}, {}})
	g.storedRevs([]groupAck{{seq: 14, ok: true}, {seq: 13, ok: true}})
	require.False(t, p.floors.off.Load(), "rising sequences")
	require.Equal(t, uint64(14), p.floors.maxRev.Load())
	g.storedRevs([]groupAck{{seq: 7, ok: true}})
	require.True(t, p.floors.off.Load(), "a sequence below the last: the log went back")
}

// TestSeenStaysBounded: with no floor stored, the sessions a shard
// remembers stay bounded, and what it forgot keeps floors short of it
// from being taken.
func TestSeenStaysBounded(t *testing.T) {
	p := &Processor{log: slog.New(slog.DiscardHandler), floors: newFloors(2)}
	s := &shard{p: p}
	for i := range 3 * maxSeen {
		s.see(string(rune('a'+i%26))+strconv.Itoa(i), uint64(i+1), i%2)
	}
	require.LessOrEqual(t, len(s.seen), maxSeen+1)
	got := prefetched{rev: 50, state: &State{Seq: 40}, floor: 100, floorOK: true, byProcessor: true}
	require.Zero(t, s.proven("new", got, 0, 0), "a floor short of what was forgotten")
	got.floor = 3 * maxSeen
	require.Equal(t, uint64(3*maxSeen), s.proven("new", got, 0, 0), "one past it")
}
