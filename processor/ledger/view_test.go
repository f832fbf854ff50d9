package ledger

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

func TestViewReportsTheSets(t *testing.T) {
	s := seed(t)
	res := s.request(seedReq)
	require.NotNil(t, res.Spill)
	v := s.l.View()
	assert.True(t, v.Pending)
	assert.Equal(t, "req-1", v.PendingRequest)

	s.spill("")
	s.commit("req-1")
	v = s.l.View()
	assert.Equal(t, "s1", v.Session)
	assert.Equal(t, "open", v.Status)
	assert.Equal(t, events.UnitTurns, v.Unit)
	assert.Equal(t, events.UnitTurns, v.FloorUnit)
	assert.Equal(t, uint64(12), v.Span)
	assert.Equal(t, uint64(52), v.Head)
	assert.Equal(t, Range{Start: 40, End: 52}, v.Floor())
	assert.Equal(t, rs(0, 52), v.Received.Ranges())
	assert.Equal(t, rs(0, 8), v.Truncated.Ranges())
	assert.Equal(t, rs(8, 40), v.Committed.Ranges())
	assert.Equal(t, rs(0, 52), v.Spilled.Ranges())
	assert.True(t, v.Waived.IsEmpty())
	assert.True(t, v.Gaps().IsEmpty())
	assert.Equal(t, uint32(1), v.Spills)
	require.NotNil(t, v.LastSpill)
	assert.Equal(t, "n", v.LastSpill.Name)
	assert.Nil(t, v.Halt)
	assert.False(t, v.Pending)
	assert.Equal(t, []RequestView{{ID: "req-1", Evaluated: true, Coverage: NewRangeSet(Range{Start: 8, End: 40}), Commits: 1}}, s.l.Requests())

	// A view is a copy: changing it leaves the ledger as it was, and the
	// ledger moving on leaves the view as it was.
	before, err := s.l.MarshalBinary()
	require.NoError(t, err)
	v.Received.Add(Range{Start: 100, End: 200})
	v.LastSpill.Name = "changed"
	after, err := s.l.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, before, after)
	s.turns(1)
	assert.Equal(t, uint64(52), v.Head)
	assert.Equal(t, rs(0, 52, 100, 200), v.Received.Ranges())
}

func TestViewOfAHaltAndItsWaiver(t *testing.T) {
	s := newSession(t)
	s.open(events.UnitTurns, events.UnitTurns, 2)
	s.turn(0, 2)
	s.turn(4, 2) // [2, 4) never arrives
	res := s.decide(req{id: "k1", in: Range{Start: 0, End: 6}, summary: Range{Start: 0, End: 4}, tail: 4}, "")
	require.Equal(t, []string{"session.halted"}, types(res))
	v := s.l.View()
	assert.Equal(t, "halted", v.Status)
	require.NotNil(t, v.Halt)
	assert.Equal(t, rs(2, 4), v.Halt.Ranges())
	assert.Equal(t, "k1", v.HaltRequest)
	assert.Equal(t, rs(2, 4), v.Gaps().Ranges())

	s.send(&events.SessionResumed{Note: "accepted"}, events.TypeSessionResumed)
	v = s.l.View()
	assert.Equal(t, "open", v.Status)
	assert.Nil(t, v.Halt)
	assert.Equal(t, rs(2, 4), v.Waived.Ranges())
	assert.Equal(t, Range{Start: 4, End: 6}, v.Floor())

	var zero Ledger
	assert.Equal(t, "new", zero.View().Status)
	assert.Equal(t, Range{}, zero.View().Floor())
}
