package ledger

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

func (s *session) pin(a, b uint64) Result {
	return s.send(&events.ContextPinned{Range: Range{Start: a, End: b}}, events.TypeContextPinned)
}

func (s *session) unpin(a, b uint64) Result {
	return s.send(&events.ContextUnpinned{Range: Range{Start: a, End: b}}, events.TypeContextUnpinned)
}

func (s *session) carry(r req, pins ...Range) Result {
	return s.send(&events.CompactionRequested{RequestID: r.id, SummarizerInput: r.in, SummaryRange: r.summary, TailStart: r.tail,
		CarriesPriorSummary: r.carries, CarriedPins: pins}, events.TypeCompactionRequested)
}

func refusal(t *testing.T, res Result) *events.CompactionRefused {
	t.Helper()
	for _, o := range res.Outputs {
		if d, ok := o.Data.(*events.CompactionRefused); ok {
			return d
		}
	}
	t.Fatalf("no compaction.refused in %v", types(res))
	return nil
}

func rejection(t *testing.T, res Result) *events.EventRejected {
	t.Helper()
	require.False(t, res.Accepted)
	require.NotEmpty(t, res.Outputs)
	d, ok := res.Outputs[0].Data.(*events.EventRejected)
	require.True(t, ok, "%v", types(res))
	return d
}

// pinnedSeed is the seed story with the user's rule, turn 0, pinned.
func pinnedSeed(t *testing.T) *session {
	s := newSession(t)
	s.open(events.UnitTurns, events.UnitTurns, 12)
	require.True(t, s.send(&events.TurnAppended{Offset: 0, Size: 1, Pinned: true}, events.TypeTurnAppended).Accepted)
	s.turns(47)
	require.True(t, s.truncate(0, 8).Accepted)
	s.turns(4)
	return s
}

// TestPinnedStory: CONTRACT.md section 8 on the seed's story. The spill
// cures the hole, not the pin; carrying the pin is allowed; unpinned, the
// plain request is allowed again.
func TestPinnedStory(t *testing.T) {
	s := pinnedSeed(t)
	assert.Equal(t, rs(0, 1), s.l.View().Pinned.Ranges())

	res := s.request(seedReq)
	require.NotNil(t, res.Spill, "rule 4 still spills for the hole")
	res = s.spill("")
	require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
	ref := refusal(t, res)
	assert.Equal(t, events.NextCarryPins, ref.Next)
	assert.NotNil(t, ref.Spill)
	assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(0, 8), events.ReasonPinDropped: rs(0, 1)}, reasons(t, res))

	// The retry: rule 3 would allow it; refused, with no spill.
	res = s.request(seedReq)
	assert.Nil(t, res.Spill)
	ref = refusal(t, res)
	assert.Equal(t, events.NextCarryPins, ref.Next)
	assert.Nil(t, ref.Spill)
	// pin_dropped alone is listed; the hole the spill covers is cured.
	assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonPinDropped: rs(0, 1)}, reasons(t, res))
	assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, ref.Cured)
	pin := ref.Reasons[0]
	require.Equal(t, events.ReasonPinDropped, pin.Code)
	assert.Contains(t, pin.Message, "pinned offsets [0, 1)")
	assert.Contains(t, pin.Message, `"carried_pins": [{"start": 0, "end": 1}]`)

	// Committing the refused retry is a violation.
	res = s.commit("req-1")
	require.Equal(t, []string{"compaction.violation"}, types(res))

	// Carrying the pin: allowed, cured by the spill.
	res = s.carry(req{id: "req-2", in: seedReq.in, summary: seedReq.summary, tail: seedReq.tail}, Range{Start: 0, End: 1})
	require.Equal(t, []string{"compaction.allowed"}, types(res))
	al := res.Outputs[0].Data.(*events.CompactionAllowed)
	assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, al.Cured)
	assert.Empty(t, s.commit("req-2").Outputs)

	// Unpinned: the plain request is allowed.
	require.True(t, s.unpin(0, 1).Accepted)
	assert.True(t, s.l.View().Pinned.IsEmpty())
	res = s.request(req{id: "req-3", in: seedReq.in, summary: seedReq.summary, tail: seedReq.tail})
	require.Equal(t, []string{"compaction.allowed"}, types(res))
}

// TestPinOnly: a request whose only failed check is pin_dropped is refused
// with next carry_pins and no spill, under either policy.
func TestPinOnly(t *testing.T) {
	for _, policy := range []Policy{PolicySpill, PolicyHalt} {
		s := newSession(t)
		s.cfg.Policy = policy
		s.open(events.UnitTurns, events.UnitTurns, 4)
		s.turns(20)
		require.True(t, s.pin(2, 4).Accepted)
		good := req{id: "r", in: Range{Start: 0, End: 20}, summary: Range{Start: 0, End: 16}, tail: 16}
		res := s.request(good)
		assert.Nil(t, res.Spill)
		ref := refusal(t, res)
		assert.Equal(t, events.NextCarryPins, ref.Next)
		assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonPinDropped: rs(2, 4)}, reasons(t, res))
		assert.False(t, s.l.Halted())
		// Carrying only part of them is not enough.
		good.id = "r2"
		res = s.carry(good, Range{Start: 2, End: 3})
		assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonPinDropped: rs(3, 4)}, reasons(t, res))
		good.id = "r3"
		res = s.carry(good, Range{Start: 0, End: 3}, Range{Start: 3, End: 4})
		require.Equal(t, []string{"compaction.allowed"}, types(res))
		assert.Empty(t, res.Outputs[0].Data.(*events.CompactionAllowed).Cured)
		if policy == PolicyHalt {
			continue // the truncation below would halt the session (rule 5)
		}
		// A pinned turn in the tail that was truncated is dropped too.
		require.True(t, s.unpin(0, 20).Accepted)
		require.True(t, s.pin(18, 19).Accepted)
		require.True(t, s.truncate(18, 19).Accepted)
		good.id = "r4"
		res = s.request(good)
		if res.Spill != nil { // the truncated turn is a hole too: rule 4
			res = s.spill("")
		}
		ref = refusal(t, res)
		assert.Equal(t, events.NextCarryPins, ref.Next)
		assert.Contains(t, reasons(t, res), events.ReasonPinDropped)
		assert.Equal(t, rs(18, 19), reasons(t, res)[events.ReasonPinDropped])
	}
}

// TestPinDroppedUnderHalt: rule 5 applies to the other checks alone; a
// halt names only what no spill could hold, not the pins.
func TestPinDroppedUnderHalt(t *testing.T) {
	s := pinnedSeed(t)
	s.cfg.Policy = PolicyHalt
	res := s.request(seedReq)
	require.Equal(t, []string{"session.halted"}, types(res))
	assert.Equal(t, rs(0, 8), res.Outputs[0].Data.(*events.SessionHalted).Unrecoverable)
}

// TestPinEvents: what context.pinned, context.unpinned and a pinned turn
// accept and reject.
func TestPinEvents(t *testing.T) {
	s := newSession(t)
	assert.Equal(t, events.CodeUnknownSession, rejection(t, s.pin(0, 0)).Code)
	s.open(events.UnitTokens, events.UnitTokens, 4)
	s.turn(0, 3)
	s.turn(5, 2) // [3, 5) never received
	assert.Equal(t, events.CodeRangeOutOfBounds, rejection(t, s.pin(0, 8)).Code)
	assert.Equal(t, events.CodeRangeOutOfBounds, rejection(t, s.unpin(6, 8)).Code)
	assert.Equal(t, events.CodeBadData, rejection(t, s.pin(4, 2)).Code)
	require.True(t, s.pin(1, 7).Accepted)
	assert.Equal(t, rs(1, 3, 5, 7), s.l.View().Pinned.Ranges(), "only received offsets are pinned")
	require.True(t, s.unpin(2, 6).Accepted)
	assert.Equal(t, rs(1, 2, 6, 7), s.l.View().Pinned.Ranges())
	require.True(t, s.send(&events.TurnAppended{Offset: 3, Size: 2, Pinned: true}, events.TypeTurnAppended).Accepted)
	assert.Equal(t, rs(1, 2, 3, 5, 6, 7), s.l.View().Pinned.Ranges())

	// Bad carried_pins: invalid_request, nothing evaluated.
	r := req{id: "bad", in: Range{Start: 0, End: 7}, summary: Range{Start: 0, End: 3}, tail: 3}
	res := s.carry(r, Range{Start: 2, End: 1})
	assert.Equal(t, events.ReasonInvalidRequest, refusal(t, res).Reasons[0].Code)
	assert.Contains(t, refusal(t, res).Reasons[0].Message, "carried_pins[0]")
	res = s.send(&events.CompactionRequested{RequestID: "bad2", SummarizerInput: r.in, SummaryRange: r.summary, TailStart: r.tail,
		CarriedPinsInvalid: "carried_pins is a string"}, events.TypeCompactionRequested)
	assert.Equal(t, events.ReasonInvalidRequest, refusal(t, res).Reasons[0].Code)
	assert.Equal(t, events.NextNone, refusal(t, res).Next)

	s.send(&events.SessionClosed{}, events.TypeSessionClosed)
	assert.Equal(t, events.CodeSessionClosed, rejection(t, s.unpin(0, 1)).Code)
}

// TestPinnedLimit: the pinned set counts against MaxRanges; past it the
// event is rejected with state_limit and the session halts.
func TestPinnedLimit(t *testing.T) {
	s := newSession(t)
	s.cfg.Limits = Limits{MaxRanges: 2}
	s.open(events.UnitTurns, events.UnitTurns, 4)
	s.turns(10)
	require.True(t, s.pin(0, 1).Accepted)
	require.True(t, s.pin(2, 3).Accepted)
	res := s.pin(4, 5)
	rej := rejection(t, res)
	assert.Equal(t, events.CodeStateLimit, rej.Code)
	assert.Equal(t, "ledger.pinned", rej.Field)
	assert.True(t, s.l.Halted())
	assert.Equal(t, rs(0, 1, 2, 3), s.l.View().Pinned.Ranges())
	res = s.unpin(0, 10)
	require.True(t, res.Accepted, "unpinning everything always fits")
	res = s.send(&events.TurnAppended{Offset: 10, Size: 1, Pinned: true}, events.TypeTurnAppended)
	require.True(t, res.Accepted)
}

// TestPinSnapshotEstimate: pinning a range over many received ranges can
// add as many pinned ranges; the snapshot estimate must count them, so the
// snapshot never passes its limit.
func TestPinSnapshotEstimate(t *testing.T) {
	s := newSession(t)
	s.open(events.UnitTokens, events.UnitTokens, 4)
	for i := range 1000 {
		require.True(t, s.turn(uint64(2*i), 1).Accepted)
	}
	b, _ := s.l.MarshalBinary()
	limit := len(b) + 1000 + haltReserve
	s.cfg.Limits = Limits{MaxSnapshotBytes: limit}
	res := s.pin(0, s.l.head)
	rej := rejection(t, res)
	assert.Equal(t, "ledger.snapshot", rej.Field)
	after, _ := s.l.MarshalBinary()
	assert.LessOrEqual(t, len(after), limit)
	assert.True(t, s.l.View().Pinned.IsEmpty())
}

// TestSnapshotPins: the pinned set survives a snapshot.
func TestSnapshotPins(t *testing.T) {
	s := pinnedSeed(t)
	require.True(t, s.pin(20, 22).Accepted)
	b, err := s.l.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, byte(3), b[0])
	var back Ledger
	require.NoError(t, back.UnmarshalBinary(b))
	assert.Equal(t, rs(0, 1, 20, 22), back.View().Pinned.Ranges())
}

// TestSnapshotVersion2: snapshots written before pins still load, pin
// nothing, and carry on.
func TestSnapshotVersion2(t *testing.T) {
	load := func(t *testing.T, name string) *session {
		l := loadOldSnapshot(t, 2, name)
		assert.True(t, l.View().Pinned.IsEmpty())
		return &session{t: t, l: *l, id: "s1", seq: l.View().LastSeq}
	}
	t.Run("chain", func(t *testing.T) {
		s := load(t, "chain")
		v := s.l.View()
		require.NotNil(t, v.LastSpill)
		require.NotNil(t, v.LastSpill.Previous)
		assert.Equal(t, uint32(2), v.Spills)
		assert.Equal(t, uint64(5700), v.SpilledBytes)
		require.True(t, s.pin(0, 1).Accepted)
		res := s.request(req{id: "req-9", in: Range{Start: 20, End: 56}, summary: Range{Start: 20, End: 44}, tail: 44})
		ref := refusal(t, res)
		assert.Equal(t, events.NextCarryPins, ref.Next)
		assert.Nil(t, ref.Spill)
	})
	t.Run("pending", func(t *testing.T) {
		s := load(t, "pending")
		require.True(t, s.l.Pending())
		res := s.spill("")
		require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
		assert.Equal(t, events.NextRetry, refusal(t, res).Next)
	})
	t.Run("halted", func(t *testing.T) {
		s := load(t, "halted")
		require.True(t, s.l.Halted())
		require.True(t, s.send(&events.SessionResumed{Note: "ok"}, events.TypeSessionResumed).Accepted)
		assert.Equal(t, rs(0, 8), s.l.waived.Ranges())
	})
}
