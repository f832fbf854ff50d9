package ledger

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// session drives one ledger with hand-built events.
type session struct {
	t   *testing.T
	l   Ledger
	cfg Config
	seq uint64
	id  string
}

func newSession(t *testing.T) *session {
	t.Helper()
	return &session{t: t, id: "s1"}
}

func (s *session) send(body any, typ string) Result {
	s.t.Helper()
	s.seq++
	return s.sendID(fmt.Sprintf("e%d", s.seq), body, typ)
}

func (s *session) sendID(id string, body any, typ string) Result {
	s.t.Helper()
	return s.sendFrom("urn:test", id, body, typ)
}

func (s *session) sendFrom(source, id string, body any, typ string) Result {
	s.t.Helper()
	ev := &events.Event{ID: id, Source: source, Type: typ, Subject: s.id, Body: body, Meta: events.Meta{Subject: "seamguard.events." + s.id, Seq: s.seq, Control: onControl(body)}}
	res, err := Step(&s.l, Input{Event: ev}, s.cfg)
	require.NoError(s.t, err)
	return res
}

func (s *session) open(unit, floorUnit events.Unit, span uint64) Result {
	return s.send(&events.SessionOpened{Unit: unit, RecoveryFloor: events.Floor{Span: span, Unit: floorUnit}}, events.TypeSessionOpened)
}

func (s *session) turn(off, size uint64) Result {
	return s.send(&events.TurnAppended{Offset: off, Size: size}, events.TypeTurnAppended)
}

func (s *session) turns(n int) {
	for range n {
		res := s.turn(s.l.head, 1)
		require.True(s.t, res.Accepted)
	}
}

func (s *session) truncate(a, b uint64) Result {
	return s.send(&events.ContextTruncated{Range: Range{Start: a, End: b}}, events.TypeContextTruncated)
}

type req struct {
	id          string
	in, summary Range
	tail        uint64
	carries     bool
}

func (s *session) request(r req) Result {
	return s.send(&events.CompactionRequested{RequestID: r.id, SummarizerInput: r.in, SummaryRange: r.summary, TailStart: r.tail, CarriesPriorSummary: r.carries}, events.TypeCompactionRequested)
}

func (s *session) commit(id string) Result {
	return s.send(&events.CompactionCommitted{RequestID: id}, events.TypeCompactionCommitted)
}

func (s *session) spill(failure string) Result {
	s.t.Helper()
	res, err := Step(&s.l, Input{Spill: &SpillResult{Failure: failure, Handle: events.SpillHandle{Bucket: "b", Name: "n", Range: Range{End: s.l.head}}}}, s.cfg)
	require.NoError(s.t, err)
	return res
}

// decide sends a request and, when it asks for a spill, answers it.
func (s *session) decide(r req, failure string) Result {
	s.t.Helper()
	res := s.request(r)
	if res.Spill != nil {
		require.Empty(s.t, res.Outputs)
		return s.spill(failure)
	}
	return res
}

func types(res Result) []string {
	var out []string
	for _, o := range res.Outputs {
		out = append(out, o.Type[len(events.TypePrefix):])
	}
	return out
}

func reasons(t *testing.T, res Result) map[events.ReasonCode][]Range {
	t.Helper()
	for _, o := range res.Outputs {
		if r, ok := o.Data.(*events.CompactionRefused); ok {
			m := map[events.ReasonCode][]Range{}
			var prev events.ReasonCode
			for _, x := range r.Reasons {
				assert.Greater(t, x.Code, prev, "reasons sorted by code")
				prev = x.Code
				assert.NotEmpty(t, x.Message)
				m[x.Code] = x.AtRisk
			}
			return m
		}
	}
	t.Fatalf("no refusal in %v", types(res))
	return nil
}

func rs(pairs ...uint64) []Range {
	out := []Range{}
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Range{Start: pairs[i], End: pairs[i+1]})
	}
	return out
}

// seed plays the seed story up to the compaction request.
func seed(t *testing.T) *session {
	s := newSession(t)
	s.open(events.UnitTurns, events.UnitTurns, 12)
	s.turns(48)
	require.True(t, s.truncate(0, 8).Accepted)
	s.turns(4)
	return s
}

var seedReq = req{id: "req-1", in: Range{Start: 8, End: 52}, summary: Range{Start: 8, End: 40}, tail: 40}

func TestSeedStory(t *testing.T) {
	s := seed(t)
	res := s.request(seedReq)
	require.NotNil(t, res.Spill)
	assert.Equal(t, "e55", res.Spill.Cause.ID)
	res.Spill.Cause = events.Cause{}
	assert.Equal(t, SpillRequest{Session: "s1", N: 1, Name: "s1/1.jsonl", Range: Range{End: 52}, FirstSeq: 1, LastSeq: 55, Events: 55, MaxBytes: DefaultSpillQuota}, *res.Spill)
	_, err := Step(&s.l, Input{Event: &events.Event{ID: "x", Subject: "s1", Body: &events.SessionClosed{}}}, s.cfg)
	assert.ErrorIs(t, err, ErrSpillPending)

	res = s.spill("")
	assert.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
	assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(0, 8)}, reasons(t, res))
	ref := res.Outputs[1].Data.(*events.CompactionRefused)
	assert.Equal(t, events.NextRetry, ref.Next)
	require.NotNil(t, ref.Spill)

	res = s.request(seedReq)
	require.Equal(t, []string{"compaction.allowed"}, types(res))
	al := res.Outputs[0].Data.(*events.CompactionAllowed)
	assert.Equal(t, rs(8, 40), al.SummaryCoverage)
	assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, al.Cured)
	assert.Len(t, al.RecoveredBy, 1)
	assert.Equal(t, uint64(52), al.Head)

	res = s.commit("req-1")
	assert.Empty(t, res.Outputs)
	assert.True(t, res.Accepted)
	assert.Equal(t, rs(8, 40), s.l.committed.Ranges())
}

// TestChecks covers each check of CONTRACT.md section 5 with its at-risk ranges.
func TestChecks(t *testing.T) {
	healthy := req{id: "r", in: Range{Start: 0, End: 30}, summary: Range{Start: 0, End: 20}, tail: 20}
	cases := []struct {
		name    string
		unit    events.Unit
		prepare func(s *session)
		r       req
		want    map[events.ReasonCode][]Range
	}{
		{name: "unit mismatch", unit: events.UnitTokens, r: healthy,
			want: map[events.ReasonCode][]Range{events.ReasonUnitMismatch: rs(0, 30)}},
		{name: "floor not in tail", r: req{id: "r", in: Range{End: 30}, summary: Range{End: 25}, tail: 25},
			want: map[events.ReasonCode][]Range{events.ReasonFloorNotInTail: rs(20, 25)}},
		{name: "floor truncated", prepare: func(s *session) { s.truncate(22, 24) }, r: req{id: "r", in: Range{End: 30}, summary: Range{End: 20}, tail: 20},
			want: map[events.ReasonCode][]Range{
				events.ReasonFloorNotInTail:  rs(22, 24),
				events.ReasonFloorNotInInput: rs(22, 24),
				events.ReasonCoverageHole:    rs(22, 24),
			}},
		{name: "floor not in input", r: req{id: "r", in: Range{Start: 0, End: 26}, summary: Range{End: 20}, tail: 20},
			want: map[events.ReasonCode][]Range{events.ReasonFloorNotInInput: rs(26, 30)}},
		{name: "reach not in input", r: req{id: "r", in: Range{Start: 15, End: 30}, summary: Range{Start: 0, End: 20}, tail: 20},
			want: map[events.ReasonCode][]Range{
				events.ReasonReachNotInInput: rs(10, 15),
				events.ReasonCoverageHole:    rs(0, 15),
			}},
		{name: "reach truncated", prepare: func(s *session) { s.truncate(12, 14) }, r: healthy,
			want: map[events.ReasonCode][]Range{
				events.ReasonReachNotInInput: rs(12, 14),
				events.ReasonCoverageHole:    rs(12, 14),
			}},
		{name: "seam gap", r: req{id: "r", in: Range{End: 30}, summary: Range{End: 18}, tail: 20},
			want: map[events.ReasonCode][]Range{
				events.ReasonSeamGap:      rs(18, 20),
				events.ReasonCoverageHole: rs(18, 20),
			}},
		{name: "coverage hole before summary", r: req{id: "r", in: Range{Start: 5, End: 30}, summary: Range{Start: 5, End: 20}, tail: 20},
			want: map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(0, 5)}},
		{name: "summary claims beyond its input", r: req{id: "r", in: Range{Start: 10, End: 30}, summary: Range{Start: 0, End: 20}, tail: 20},
			want: map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(0, 10)}},
		{name: "sequence gap", prepare: func(s *session) { s.turn(33, 2) }, r: req{id: "r", in: Range{End: 35}, summary: Range{End: 23}, tail: 23},
			want: map[events.ReasonCode][]Range{events.ReasonSequenceGap: rs(30, 33)}},
		{name: "truncated tail outside floor is a hole only", prepare: func(s *session) { s.truncate(5, 6) }, r: req{id: "r", in: Range{End: 30}, summary: Range{End: 4}, tail: 4},
			want: map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(5, 6)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t)
			unit := events.UnitTurns
			if tc.unit != "" {
				unit = tc.unit
			}
			s.open(unit, events.UnitTurns, 10)
			s.turns(30)
			if tc.prepare != nil {
				tc.prepare(s)
			}
			ev := s.l.Evaluate(&events.CompactionRequested{RequestID: tc.r.id, SummarizerInput: tc.r.in, SummaryRange: tc.r.summary, TailStart: tc.r.tail, CarriesPriorSummary: tc.r.carries})
			got := map[events.ReasonCode][]Range{}
			for _, r := range ev.Reasons {
				got[r.Code] = r.AtRisk
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestHealthyAllowed(t *testing.T) {
	s := newSession(t)
	s.open(events.UnitTurns, events.UnitTurns, 10)
	s.turns(30)
	res := s.request(req{id: "a", in: Range{End: 30}, summary: Range{End: 20}, tail: 20})
	require.Equal(t, []string{"compaction.allowed"}, types(res))
	al := res.Outputs[0].Data.(*events.CompactionAllowed)
	assert.Empty(t, al.Cured)
	assert.NotNil(t, al.Cured)
	assert.Empty(t, al.RecoveredBy)
	assert.NotNil(t, al.RecoveredBy)
	assert.Nil(t, res.Spill)
	require.Empty(t, s.commit("a").Outputs)

	// A later compaction carries the committed summary over truncated turns.
	s.turns(20)
	s.truncate(0, 20)
	res = s.request(req{id: "b", in: Range{Start: 20, End: 50}, summary: Range{End: 40}, tail: 40, carries: true})
	require.Equal(t, []string{"compaction.allowed"}, types(res), "%+v", res.Outputs)
	assert.Equal(t, rs(0, 40), res.Outputs[0].Data.(*events.CompactionAllowed).SummaryCoverage)

	// Without carrying it, the truncated turns are a hole.
	res = s.decide(req{id: "c", in: Range{Start: 20, End: 50}, summary: Range{End: 40}, tail: 40}, "")
	assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(0, 20)}, reasons(t, res))
}

func TestRuleOne(t *testing.T) {
	t.Run("unknown session", func(t *testing.T) {
		s := newSession(t)
		res := s.request(seedReq)
		assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonUnknownSession: {}}, reasons(t, res))
		assert.False(t, res.Accepted)
	})
	t.Run("closed session", func(t *testing.T) {
		s := seed(t)
		s.send(&events.SessionClosed{}, events.TypeSessionClosed)
		res := s.request(seedReq)
		assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonSessionClosed: {}}, reasons(t, res))
		assert.Nil(t, res.Spill)
	})
	invalid := []req{
		{id: "", in: Range{Start: 8, End: 52}, summary: Range{Start: 8, End: 40}, tail: 40},
		{id: "x", in: Range{Start: 9, End: 8}, summary: Range{Start: 8, End: 40}, tail: 40},
		{id: "x", in: Range{Start: 8, End: 52}, summary: Range{Start: 41, End: 40}, tail: 40},
		{id: "x", in: Range{Start: 8, End: 52}, summary: Range{Start: 8, End: 40}, tail: 53},
		{id: "x", in: Range{Start: 8, End: 52}, summary: Range{Start: 8, End: 53}, tail: 40},
	}
	for i, r := range invalid {
		t.Run(fmt.Sprintf("invalid %d", i), func(t *testing.T) {
			s := seed(t)
			res := s.request(r)
			assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonInvalidRequest: {}}, reasons(t, res))
			assert.Nil(t, res.Spill)
			assert.Equal(t, events.NextNone, res.Outputs[0].Data.(*events.CompactionRefused).Next)
			// A rule-1 refusal computes nothing: committing it is a violation.
			assert.Equal(t, []string{"compaction.violation"}, types(s.commit(r.id+"-none")))
		})
	}
}

func TestHaltAndResume(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		gap     bool
		failure string
	}{
		{name: "spill fails", failure: "object store unavailable after 5 tries"},
		{name: "policy halt", cfg: Config{Policy: PolicyHalt}},
		{name: "at-risk offsets never received", gap: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := seed(t)
			s.cfg = tc.cfg
			r := seedReq
			want := rs(0, 8)
			if tc.gap {
				s.turn(60, 2)
				r = req{id: "g", in: Range{Start: 8, End: 62}, summary: Range{Start: 8, End: 50}, tail: 50}
				want = rs(0, 8, 52, 60)
			}
			res := s.decide(r, tc.failure)
			require.Equal(t, []string{"session.halted"}, types(res))
			h := res.Outputs[0].Data.(*events.SessionHalted)
			assert.Equal(t, r.id, h.RequestID)
			assert.Equal(t, want, h.Unrecoverable)
			assert.Contains(t, h.Message, "[0, 8)")
			assert.True(t, s.l.Halted())

			// Halted: every compaction is refused, even a healthy one.
			res = s.request(req{id: "h", in: Range{Start: 0, End: s.l.head}, summary: Range{End: s.l.head - 12}, tail: s.l.head - 12})
			assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonSessionHalted: want}, reasons(t, res))

			// Committing the halted compaction anyway is a violation.
			assert.Equal(t, []string{"compaction.violation"}, types(s.commit(r.id)))

			res = s.send(&events.SessionResumed{Note: "accepted by ops"}, events.TypeSessionResumed)
			assert.True(t, res.Accepted)
			assert.False(t, s.l.Halted())
			assert.Equal(t, want, s.l.waived.Ranges())

			// The waived offsets now cure the same compaction, without a spill.
			res = s.request(r)
			require.Equal(t, []string{"compaction.allowed"}, types(res))
			al := res.Outputs[0].Data.(*events.CompactionAllowed)
			assert.NotEmpty(t, al.Cured)
			assert.Empty(t, al.RecoveredBy)
		})
	}
}

func TestCommits(t *testing.T) {
	s := seed(t)
	assert.Equal(t, []string{"compaction.violation"}, types(s.commit("never")))
	assert.True(t, s.l.committed.IsEmpty(), "unknown commit changes nothing")
	s.decide(seedReq, "")
	res := s.commit("req-1")
	require.Equal(t, []string{"compaction.violation"}, types(res))
	assert.Contains(t, res.Outputs[0].Data.(*events.CompactionViolation).Message, "refused")
	assert.Equal(t, rs(8, 40), s.l.committed.Ranges(), "a refused commit is recorded all the same")
}

func TestRejections(t *testing.T) {
	cases := []struct {
		name  string
		run   func(s *session) Result
		code  events.Code
		field string
	}{
		{"turn before open", func(s *session) Result { return s.turn(0, 1) }, events.CodeUnknownSession, "subject"},
		{"truncate before open", func(s *session) Result { return s.truncate(0, 0) }, events.CodeUnknownSession, "subject"},
		{"commit before open", func(s *session) Result { return s.commit("x") }, events.CodeUnknownSession, "subject"},
		{"resume before open", func(s *session) Result {
			return s.send(&events.SessionResumed{Note: "n"}, events.TypeSessionResumed)
		}, events.CodeUnknownSession, "subject"},
		{"already open", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			return s.open(events.UnitTurns, events.UnitTurns, 13)
		}, events.CodeAlreadyOpen, "data"},
		{"closed", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			s.send(&events.SessionClosed{}, events.TypeSessionClosed)
			return s.turn(0, 1)
		}, events.CodeSessionClosed, "subject"},
		{"closed twice", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			s.send(&events.SessionClosed{}, events.TypeSessionClosed)
			return s.send(&events.SessionClosed{}, events.TypeSessionClosed)
		}, events.CodeSessionClosed, "subject"},
		{"reopen closed", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			s.send(&events.SessionClosed{}, events.TypeSessionClosed)
			return s.open(events.UnitTurns, events.UnitTurns, 12)
		}, events.CodeSessionClosed, "subject"},
		{"overlapping turn", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			s.turns(5)
			return s.turn(4, 2)
		}, events.CodeOffsetConflict, "data.offset"},
		{"truncation beyond head", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			s.turns(5)
			return s.truncate(3, 6)
		}, events.CodeRangeOutOfBounds, "data.range"},
		{"reversed truncation", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			s.turns(5)
			return s.truncate(3, 2)
		}, events.CodeBadData, "data.range"},
		{"zero size", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			return s.turn(0, 0)
		}, events.CodeBadData, "data.size"},
		{"overflow", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			return s.turn(events.MaxOffset, 1)
		}, events.CodeBadData, "data.size"},
		{"bad unit", func(s *session) Result { return s.open("bytes", events.UnitTurns, 12) }, events.CodeBadData, "data.unit"},
		{"bad floor unit", func(s *session) Result { return s.open(events.UnitTurns, "", 12) }, events.CodeBadData, "data.recovery_floor.unit"},
		{"empty note", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			return s.send(&events.SessionResumed{Note: " "}, events.TypeSessionResumed)
		}, events.CodeBadData, "data.note"},
		{"commit without id", func(s *session) Result {
			s.open(events.UnitTurns, events.UnitTurns, 12)
			return s.commit("")
		}, events.CodeBadData, "data.request_id"},
		{"unknown body", func(s *session) Result { return s.send(42, "io.seamguard.nope") }, events.CodeUnknownType, "type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t)
			res := tc.run(s)
			require.Equal(t, []string{"event.rejected"}, types(res))
			assert.False(t, res.Accepted)
			rej := res.Outputs[0].Data.(*events.EventRejected)
			assert.Equal(t, tc.code, rej.Code)
			assert.Equal(t, tc.field, rej.Field)
			assert.NotEmpty(t, rej.Message)
			assert.Equal(t, s.seq, rej.Input.Seq)
			assert.NotNil(t, rej.Input.Headers)
		})
	}
}

func TestRejectedChangesNothing(t *testing.T) {
	s := seed(t)
	before, err := s.l.MarshalBinary()
	require.NoError(t, err)
	for _, f := range []func() Result{
		func() Result { return s.turn(3, 1) },
		func() Result { return s.truncate(50, 60) },
		func() Result { return s.open(events.UnitTokens, events.UnitTokens, 1) },
	} {
		res := f()
		require.Equal(t, []string{"event.rejected"}, types(res))
		after, err := s.l.MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, before, after)
	}
}

func TestGapFill(t *testing.T) {
	s := newSession(t)
	s.open(events.UnitTokens, events.UnitTokens, 100)
	assert.True(t, s.turn(0, 10).Accepted)
	assert.True(t, s.turn(20, 10).Accepted)
	assert.Equal(t, uint64(30), s.l.Head())
	assert.True(t, s.turn(10, 5).Accepted, "fills part of the gap")
	assert.Equal(t, []string{"event.rejected"}, types(s.turn(14, 2)))
	assert.True(t, s.turn(15, 5).Accepted)
	assert.Equal(t, rs(0, 30), s.l.received.Ranges())
}

func TestDuplicates(t *testing.T) {
	s := seed(t)
	res := s.sendID("e3", &events.TurnAppended{Offset: 1, Size: 1}, events.TypeTurnAppended)
	assert.False(t, res.Duplicate, "e3 is older than the ring; a late duplicate turn is rejected, not applied")
	assert.Equal(t, []string{"event.rejected"}, types(res))

	s.seq++
	res = s.sendID("dup-turn", &events.TurnAppended{Offset: 52, Size: 1}, events.TypeTurnAppended)
	require.True(t, res.Accepted)
	res = s.sendID("dup-turn", &events.TurnAppended{Offset: 52, Size: 1}, events.TypeTurnAppended)
	assert.True(t, res.Duplicate)
	assert.Empty(t, res.Outputs)

	// A compaction request re-delivered long after its verdict gets no second one.
	r := req{id: "req-2", in: Range{Start: 8, End: 53}, summary: Range{Start: 8, End: 41}, tail: 41}
	res = s.sendID("the-request", &events.CompactionRequested{RequestID: r.id, SummarizerInput: r.in, SummaryRange: r.summary, TailStart: r.tail}, events.TypeCompactionRequested)
	require.NotNil(t, res.Spill)
	s.spill("")
	s.turns(20)
	res = s.sendID("the-request", &events.CompactionRequested{RequestID: r.id, SummarizerInput: r.in, SummaryRange: r.summary, TailStart: r.tail}, events.TypeCompactionRequested)
	assert.True(t, res.Duplicate)
	assert.Empty(t, res.Outputs)
}

// TestSameIDsTwoSources: an event is its (source, id): two sources'
// events with the same ids in one session are all applied, and only the
// same source and id again is a duplicate.
func TestSameIDsTwoSources(t *testing.T) {
	s := newSession(t)
	turn := func(off uint64) *events.TurnAppended { return &events.TurnAppended{Offset: off, Size: 1} }
	require.True(t, s.sendFrom("urn:agent:a", "1", &events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 1, Unit: events.UnitTurns}}, events.TypeSessionOpened).Accepted)
	for i, e := range []struct {
		source, id string
		off        uint64
	}{{"urn:agent:a", "2", 0}, {"urn:agent:b", "1", 1}, {"urn:agent:b", "2", 2}, {"urn:agent:c", "2", 3}} {
		s.seq++
		res := s.sendFrom(e.source, e.id, turn(e.off), events.TypeTurnAppended)
		assert.True(t, res.Accepted, "turn %d (%s, %s): %v", i, e.source, e.id, types(res))
		assert.False(t, res.Duplicate)
	}
	assert.Equal(t, uint64(4), s.l.head)
	s.seq++
	res := s.sendFrom("urn:agent:b", "2", turn(2), events.TypeTurnAppended)
	assert.True(t, res.Duplicate, "the same source and id again")
	assert.Equal(t, uint64(4), s.l.head)
}

func TestProtocolErrors(t *testing.T) {
	var l Ledger
	_, err := Step(&l, Input{}, Config{})
	assert.ErrorIs(t, err, ErrEmptyInput)
	_, err = Step(&l, Input{Spill: &SpillResult{}}, Config{})
	assert.ErrorIs(t, err, ErrNoSpillPending)
	_, err = Step(&l, Input{Event: &events.Event{Subject: "a", Body: &events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Unit: events.UnitTurns}}}}, Config{})
	require.NoError(t, err)
	_, err = Step(&l, Input{Event: &events.Event{Subject: "b", Body: &events.SessionClosed{}}}, Config{})
	assert.True(t, errors.Is(err, ErrWrongSession))
	assert.Error(t, Config{Policy: 7}.Validate())
	assert.NoError(t, Config{}.Validate())
}

func TestSnapshotRoundTripSeed(t *testing.T) {
	s := seed(t)
	s.decide(seedReq, "")
	s.decide(seedReq, "")
	s.commit("req-1")
	b, err := s.l.MarshalBinary()
	require.NoError(t, err)
	var l2 Ledger
	require.NoError(t, l2.UnmarshalBinary(b))
	b2, err := l2.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, b, b2)
	assert.Equal(t, s.l.committed, l2.committed)
	assert.Equal(t, *s.l.lastSpill, *l2.lastSpill)
	for i := range b {
		var l3 Ledger
		assert.Error(t, l3.UnmarshalBinary(b[:i]), "truncated snapshot at %d", i)
	}
}

func TestIdleLedgerSize(t *testing.T) {
	s := newSession(t)
	s.open(events.UnitTurns, events.UnitTurns, 12)
	s.turns(300)
	b, err := s.l.MarshalBinary()
	require.NoError(t, err)
	assert.Less(t, len(b), 160, "snapshot of an idle session")
}

// onControl reports whether a test input of this body comes on the control
// subject: a session.resumed does, as an operator publishes it; everything
// else comes on the events subject.
func onControl(body any) bool {
	_, ok := body.(*events.SessionResumed)
	return ok
}
