package ledger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

func TestLimitsValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want []string // parts of the error, one per problem; none for valid
	}{
		{"zero value", Config{}, nil},
		{"defaults spelled out", Config{Limits: Limits{MaxRanges: DefaultMaxRanges, MaxRequests: 256, MaxSnapshotBytes: DefaultMaxSnapshotBytes, SpillQuota: 1}}, nil},
		{"more request ids", Config{Limits: Limits{MaxRequests: 4096}}, nil},
		{"small snapshots", Config{Limits: Limits{MaxSnapshotBytes: MinSnapshotBytes}}, nil},
		{"negative ranges", Config{Limits: Limits{MaxRanges: -1}}, []string{"MaxRanges is -1"}},
		{"too few request ids", Config{Limits: Limits{MaxRequests: 255}}, []string{"MaxRequests is 255"}},
		{"negative request ids", Config{Limits: Limits{MaxRequests: -3}}, []string{"MaxRequests is -3"}},
		{"tiny snapshots", Config{Limits: Limits{MaxSnapshotBytes: 100}}, []string{"MaxSnapshotBytes is 100"}},
		{"everything at once", Config{Policy: 9, Limits: Limits{MaxRanges: -1, MaxRequests: 1, MaxSnapshotBytes: -1}},
			[]string{"unknown policy 9", "MaxRanges is -1", "MaxRequests is 1", "MaxSnapshotBytes is -1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Equal(t, len(tc.want), strings.Count(err.Error(), "ledger: "), "one line per problem: %v", err)
		})
	}
}

// gapTurns appends one-offset turns at offs, which may leave gaps.
func gapTurns(s *session, offs ...uint64) {
	for _, o := range offs {
		require.True(s.t, s.turn(o, 1).Accepted)
	}
}

// TestStateLimits: an event that would take a set or the snapshot past its
// limit is rejected with state_limit naming it, and halts the session in the
// same Step: session.halted with no request id, the offsets the event
// concerned as unrecoverable; nothing else changes.
func TestStateLimits(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(s *session)
		limits  func(s *session) Limits // the limits of the event over them
		act     func(s *session) Result
		field   string
		unrec   []Range
	}{
		{
			name:    "received: a turn that leaves a third gap-separated range",
			prepare: func(s *session) { gapTurns(s, 0, 2) },
			limits:  func(*session) Limits { return Limits{MaxRanges: 2} },
			act:     func(s *session) Result { return s.turn(4, 1) },
			field:   "ledger.received", unrec: rs(4, 5),
		},
		{
			name:    "received: filling a gap merges, a turn at head does not add",
			prepare: func(s *session) { gapTurns(s, 0, 2) },
			limits:  func(*session) Limits { return Limits{MaxRanges: 2} },
			act:     func(s *session) Result { return s.turn(6, 2) },
			field:   "ledger.received", unrec: rs(6, 8),
		},
		{
			name:    "truncated",
			prepare: func(s *session) { s.turns(10); s.truncate(0, 1); s.truncate(2, 3) },
			limits:  func(*session) Limits { return Limits{MaxRanges: 2} },
			act:     func(s *session) Result { return s.truncate(4, 5) },
			field:   "ledger.truncated", unrec: rs(4, 5),
		},
		{
			name:    "coverage: the summary coverage a request would commit",
			prepare: func(s *session) { s.turns(20); s.truncate(1, 2); s.truncate(3, 4) },
			limits:  func(*session) Limits { return Limits{MaxRanges: 2} },
			act: func(s *session) Result {
				return s.request(req{id: "r", in: Range{End: 20}, summary: Range{End: 10}, tail: 10})
			},
			field: "ledger.coverage", unrec: rs(0, 20),
		},
		{
			name:    "halt: a rule-5 halt with too many unrecoverable ranges",
			prepare: func(s *session) { gapTurns(s, 0, 2, 4); s.turn(6, 4) },
			limits:  func(*session) Limits { return Limits{MaxRanges: 2} },
			act: func(s *session) Result {
				return s.request(req{id: "r", in: Range{End: 10}, summary: Range{End: 8}, tail: 8})
			},
			field: "ledger.halt", unrec: rs(0, 10),
		},
		{
			name: "committed: a coverage the limit no longer allows",
			prepare: func(s *session) {
				s.turns(20)
				s.truncate(1, 2)
				s.truncate(3, 4)
				s.decide(req{id: "r", in: Range{End: 20}, summary: Range{End: 10}, tail: 10}, "")
			},
			limits: func(*session) Limits { return Limits{MaxRanges: 2} },
			act:    func(s *session) Result { return s.commit("r") },
			field:  "ledger.committed", unrec: rs(0, 20),
		},
		{
			name: "waived: resuming a halt whose ranges would not fit",
			prepare: func(s *session) {
				s.cfg.Policy = PolicyHalt
				gapTurns(s, 0, 2, 4)
				s.turn(6, 4)
				s.request(req{id: "r", in: Range{End: 10}, summary: Range{End: 8}, tail: 8})
				require.True(t, s.l.Halted())
			},
			limits: func(*session) Limits { return Limits{MaxRanges: 2} },
			act: func(s *session) Result {
				return s.send(&events.SessionResumed{Note: "accept"}, events.TypeSessionResumed)
			},
			// Three ranges are more than a halt may hold now: it names all.
			field: "ledger.waived", unrec: rs(0, 10),
		},
		{
			name:    "snapshot: a turn the snapshot has no room for",
			prepare: func(s *session) { s.turns(30) },
			limits: func(s *session) Limits {
				b, _ := s.l.MarshalBinary()
				return Limits{MaxSnapshotBytes: len(b) + haltReserve}
			},
			act:   func(s *session) Result { return s.turn(40, 1) },
			field: "ledger.snapshot", unrec: rs(40, 41),
		},
		{
			name:    "snapshot: a request, which concerns the whole transcript",
			prepare: func(s *session) { s.turns(30) },
			limits: func(s *session) Limits {
				b, _ := s.l.MarshalBinary()
				return Limits{MaxSnapshotBytes: len(b) + haltReserve}
			},
			act: func(s *session) Result {
				return s.request(req{id: "r", in: Range{End: 30}, summary: Range{End: 20}, tail: 20})
			},
			field: "ledger.snapshot", unrec: rs(0, 30),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t)
			s.open(events.UnitTurns, events.UnitTurns, 4)
			tc.prepare(s)
			wasHalted := s.l.Halted()
			before, err := s.l.MarshalBinary()
			require.NoError(t, err)
			s.cfg.Limits = tc.limits(s)
			res := tc.act(s)

			require.Equal(t, []string{"event.rejected", "session.halted"}, types(res), "%+v", res.Outputs)
			assert.False(t, res.Accepted)
			assert.Nil(t, res.Spill)
			rej := res.Outputs[0].Data.(*events.EventRejected)
			assert.Equal(t, events.CodeStateLimit, rej.Code)
			assert.Equal(t, tc.field, rej.Field)
			assert.Contains(t, rej.Message, "limit")
			assert.Contains(t, rej.Message, "session.resumed")
			h := res.Outputs[1].Data.(*events.SessionHalted)
			assert.Empty(t, h.RequestID)
			assert.Equal(t, tc.unrec, h.Unrecoverable)
			assert.Contains(t, h.Message, "limit")
			assert.Equal(t, res.Outputs[0].Cause, res.Outputs[1].Cause, "both answer the event")
			assert.True(t, s.l.Halted())

			// Nothing but the halt changed.
			var was Ledger
			require.NoError(t, was.UnmarshalBinary(before))
			was.status, was.halt, was.haltReq = s.l.status, s.l.halt, s.l.haltReq
			want, _ := was.MarshalBinary()
			now, _ := s.l.MarshalBinary()
			assert.Equal(t, want, now, "a rejected event changes the halt only")
			if !wasHalted {
				assert.Equal(t, tc.unrec, s.l.halt.Ranges())
			}

			// Compactions are refused until an operator resumes.
			s.cfg.Limits = Limits{}
			ref := s.request(req{id: "after", in: Range{End: s.l.head}, summary: Range{End: s.l.head}, tail: s.l.head})
			require.Equal(t, []string{"compaction.refused"}, types(ref))
			reason := ref.Outputs[0].Data.(*events.CompactionRefused).Reasons[0]
			assert.Equal(t, events.ReasonSessionHalted, reason.Code)
			assert.Contains(t, reason.Message, "reached a limit")
			require.True(t, s.send(&events.SessionResumed{Note: "accepted"}, events.TypeSessionResumed).Accepted)
			assert.False(t, s.l.Halted())
		})
	}
}

// TestStateLimitBeforeOpen: on a session that was never opened there is
// nothing to halt; the rejection comes alone and the ledger stays empty.
func TestStateLimitBeforeOpen(t *testing.T) {
	s := newSession(t)
	s.cfg.Limits = Limits{MaxSnapshotBytes: 100}
	res := s.open(events.UnitTurns, events.UnitTurns, 4)
	require.Equal(t, []string{"event.rejected"}, types(res))
	assert.Equal(t, events.CodeStateLimit, res.Outputs[0].Data.(*events.EventRejected).Code)
	assert.False(t, s.l.Opened())
	assert.Empty(t, s.l.Session())
}

// TestStateLimitWhileHalted: a halt in force gains the offsets of a later
// event over a limit; when the snapshot has no room for one range more it
// names their hull instead.
func TestStateLimitWhileHalted(t *testing.T) {
	halted := func(t *testing.T) *session {
		s := seed(t)
		s.cfg.Policy = PolicyHalt
		s.decide(seedReq, "")
		require.Equal(t, rs(0, 8), s.l.halt.Ranges())
		return s
	}
	// T is [0, 8) and [20, 21): a third truncated range is over a limit
	// of two, and the halt gains it.
	t.Run("union", func(t *testing.T) {
		s := halted(t)
		s.truncate(20, 21)
		s.cfg.Limits = Limits{MaxRanges: 2}
		res := s.truncate(30, 31)
		require.Equal(t, []string{"event.rejected", "session.halted"}, types(res))
		assert.Equal(t, rs(0, 8, 30, 31), res.Outputs[1].Data.(*events.SessionHalted).Unrecoverable)
		assert.Equal(t, rs(0, 8, 30, 31), s.l.halt.Ranges())
	})
	t.Run("hull without room", func(t *testing.T) {
		s := halted(t)
		s.truncate(20, 21)
		b, _ := s.l.MarshalBinary()
		s.cfg.Limits = Limits{MaxRanges: 2, MaxSnapshotBytes: len(b) + rangeBytes}
		res := s.truncate(30, 31)
		require.Equal(t, []string{"event.rejected", "session.halted"}, types(res))
		assert.Equal(t, rs(0, 31), res.Outputs[1].Data.(*events.SessionHalted).Unrecoverable)
		after, _ := s.l.MarshalBinary()
		assert.LessOrEqual(t, len(after), s.cfg.Limits.MaxSnapshotBytes)
	})
	t.Run("too many ranges name the whole transcript", func(t *testing.T) {
		s := halted(t)
		s.cfg.Limits = Limits{MaxRanges: 1}
		res := s.turn(60, 1) // [0, 8) ∪ [60, 61): two ranges, over a limit of one
		require.Equal(t, []string{"event.rejected", "session.halted"}, types(res))
		assert.Equal(t, rs(0, 61), s.l.halt.Ranges(), "a halt over MaxRanges names [0, end)")
		assert.Contains(t, res.Outputs[1].Data.(*events.SessionHalted).Message, "the whole transcript")
	})
}

// TestForgottenRequests: the ledger keeps the MaxRequests most recently used
// request ids; a commit of a forgotten one is a violation saying so, which
// leaves no prior summary credited, distinct from one never decided.
func TestForgottenRequests(t *testing.T) {
	allowedReq := func(id string) req {
		return req{id: id, in: Range{End: 30}, summary: Range{End: 20}, tail: 20}
	}
	violationMsg := func(t *testing.T, res Result) string {
		t.Helper()
		require.Equal(t, []string{"compaction.violation"}, types(res))
		return res.Outputs[0].Data.(*events.CompactionViolation).Message
	}
	ids := func(l *Ledger) []string {
		var out []string
		for _, r := range l.Requests() {
			out = append(out, r.ID)
		}
		return out
	}
	s := newSession(t)
	s.cfg.Limits = Limits{MaxRequests: 2} // below what Validate allows, as tests may
	s.open(events.UnitTurns, events.UnitTurns, 4)
	s.turns(30)
	require.Equal(t, []string{"compaction.allowed"}, types(s.request(allowedReq("a"))))
	require.Equal(t, []string{"compaction.allowed"}, types(s.request(allowedReq("b"))))
	require.Empty(t, s.commit("a").Outputs, "a is used again: b is now the least recently used")
	require.Equal(t, []string{"compaction.allowed"}, types(s.request(allowedReq("c"))))
	assert.Equal(t, []string{"a", "c"}, ids(&s.l))
	assert.Equal(t, uint64(1), s.l.View().ForgottenRequests)
	assert.Equal(t, rs(0, 20), s.l.committed.Ranges())

	msg := violationMsg(t, s.commit("b"))
	assert.Contains(t, msg, "no longer remembers")
	assert.Contains(t, msg, "2 most recently used")
	assert.True(t, s.l.committed.IsEmpty(), "the summary is unknown now: no prior summary is credited")

	msg = violationMsg(t, s.commit("never"))
	assert.Contains(t, msg, "never decided")
	assert.NotContains(t, msg, "remembers")

	// A forgotten request that comes again is evaluated again.
	res := s.request(allowedReq("b"))
	require.Equal(t, []string{"compaction.allowed"}, types(res))
	assert.Equal(t, []string{"b", "c"}, ids(&s.l))

	// A request only ever refused under rule 1 was never decided: its
	// commit says so even after it is forgotten.
	s.request(req{id: "bad", in: Range{Start: 5, End: 1}, summary: Range{End: 20}, tail: 20})
	s.request(allowedReq("d"))
	s.request(allowedReq("e"))
	assert.NotContains(t, ids(&s.l), "bad")
	assert.Contains(t, violationMsg(t, s.commit("bad")), "never decided")
}

// TestForgottenRequestsBeyondMemory: the ledger keeps the hashes of the last
// 1024 forgotten request ids; past them it cannot tell forgotten from never
// decided, and says both.
func TestForgottenRequestsBeyondMemory(t *testing.T) {
	s := newSession(t)
	s.cfg.Limits = Limits{MaxRequests: 1}
	s.open(events.UnitTurns, events.UnitTurns, 4)
	s.turns(30)
	const n = maxForgotten + 100
	for i := range n + 1 {
		res := s.request(req{id: fmt.Sprintf("r%d", i), in: Range{End: 30}, summary: Range{End: 20}, tail: 20})
		require.Equal(t, []string{"compaction.allowed"}, types(res))
	}
	v := s.l.View()
	assert.Equal(t, uint64(n), v.ForgottenRequests)
	assert.Len(t, s.l.forgotten, maxForgotten)
	for _, tc := range []struct{ id, want string }{
		{fmt.Sprintf("r%d", n-1), "no longer remembers"}, // among the last 1024 forgotten
		{"r0", "either it never decided it, or it decided it long ago"},
		{"never-requested", "either it never decided it, or it decided it long ago"},
	} {
		res := s.commit(tc.id)
		require.Equal(t, []string{"compaction.violation"}, types(res))
		assert.Contains(t, res.Outputs[0].Data.(*events.CompactionViolation).Message, tc.want, tc.id)
	}
}

// spillAs answers a pending spill with a handle made from its request.
func (s *session) spillAs(r *SpillRequest, size uint64, prev *string) Result {
	s.t.Helper()
	res, err := Step(&s.l, Input{Spill: &SpillResult{Handle: events.SpillHandle{
		Bucket: "seamguard-spills", Name: r.Name, Digest: "SHA-256=" + r.Name, Size: size, Range: r.Range,
		Events: r.Events, FirstSeq: r.FirstSeq, LastSeq: r.LastSeq, Previous: prev,
	}}}, s.cfg)
	require.NoError(s.t, err)
	return res
}

// TestIncrementalSpills: each spill asks only for the accepted events after
// the previous one's last_seq, names it as previous, and is bounded by what
// is left of the quota; the handles carry previous.
func TestIncrementalSpills(t *testing.T) {
	s := seed(t)
	res := s.request(seedReq)
	require.NotNil(t, res.Spill)
	first := *res.Spill
	assert.Equal(t, uint64(1), first.FirstSeq)
	assert.Equal(t, uint64(55), first.LastSeq)
	assert.Equal(t, uint64(55), first.Events)
	assert.Empty(t, first.Previous)
	assert.Equal(t, uint64(DefaultSpillQuota), first.MaxBytes)
	wrong := "whatever the writer says"
	res = s.spillAs(&first, 1000, &wrong)
	require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
	assert.Nil(t, res.Outputs[0].Data.(*events.SpillHandle).Previous, "the first spill has no previous, whatever the writer says")
	assert.Nil(t, res.Outputs[1].Data.(*events.CompactionRefused).Spill.Previous)

	s.turns(3)
	require.Equal(t, []string{"event.rejected"}, types(s.turn(0, 1)), "a rejected event is no part of a spill")
	s.truncate(52, 53)
	res = s.request(req{id: "req-2", in: Range{Start: 20, End: 55}, summary: Range{Start: 20, End: 43}, tail: 43})
	require.NotNil(t, res.Spill)
	second := *res.Spill
	assert.Equal(t, SpillRequest{
		Cause: second.Cause, Session: "s1", N: 2, Name: "s1/2.jsonl", Range: Range{End: 55},
		FirstSeq: 56, LastSeq: s.seq, Events: 5, // three turns, a truncation, the request
		Previous: "s1/1.jsonl", MaxBytes: DefaultSpillQuota - 1000,
	}, second)
	res = s.spillAs(&second, 500, nil)
	require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
	h := res.Outputs[0].Data.(*events.SpillHandle)
	require.NotNil(t, h.Previous)
	assert.Equal(t, "s1/1.jsonl", *h.Previous)
	assert.Equal(t, h, res.Outputs[1].Data.(*events.CompactionRefused).Spill)
	assert.Equal(t, uint64(1500), s.l.View().SpilledBytes)

	// The retry is allowed by the newest spill, whose chain holds it all.
	res = s.request(req{id: "req-2", in: Range{Start: 20, End: 55}, summary: Range{Start: 20, End: 43}, tail: 43})
	require.Equal(t, []string{"compaction.allowed"}, types(res))
	by := res.Outputs[0].Data.(*events.CompactionAllowed).RecoveredBy
	require.Len(t, by, 1)
	assert.Equal(t, "s1/2.jsonl", by[0].Name)
	assert.Equal(t, "s1/1.jsonl", *by[0].Previous)
}

// TestSpillQuota: a spill the quota cannot take halts the session (rule 5),
// naming the quota.
func TestSpillQuota(t *testing.T) {
	cases := []struct {
		name   string
		quota  uint64
		answer func(s *session, r *SpillRequest) Result
		halted bool
	}{
		{"within the quota", 1000, func(s *session, r *SpillRequest) Result { return s.spillAs(r, 1000, nil) }, false},
		{"the writer stopped at the quota", 1000, func(s *session, r *SpillRequest) Result {
			res, err := Step(&s.l, Input{Spill: &SpillResult{Failure: "object over 1000 bytes", OverQuota: true}}, s.cfg)
			require.NoError(t, err)
			return res
		}, true},
		{"a handle larger than MaxBytes", 1000, func(s *session, r *SpillRequest) Result { return s.spillAs(r, 1001, nil) }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := seed(t)
			s.cfg.Limits = Limits{SpillQuota: tc.quota}
			res := s.request(seedReq)
			require.NotNil(t, res.Spill)
			assert.Equal(t, tc.quota, res.Spill.MaxBytes)
			res = tc.answer(s, res.Spill)
			if !tc.halted {
				require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
				return
			}
			require.Equal(t, []string{"session.halted"}, types(res))
			h := res.Outputs[0].Data.(*events.SessionHalted)
			assert.Equal(t, "req-1", h.RequestID)
			assert.Equal(t, rs(0, 8), h.Unrecoverable)
			assert.Contains(t, h.Message, "spill quota of 1000 bytes")
			assert.Zero(t, s.l.View().Spills, "a spill over the quota is not recorded")
		})
	}
	t.Run("used up", func(t *testing.T) {
		s := seed(t)
		s.cfg.Limits = Limits{SpillQuota: 1000}
		s.spillAs(s.request(seedReq).Spill, 1000, nil)
		s.turns(3)
		s.truncate(52, 53)
		res := s.request(req{id: "req-2", in: Range{Start: 20, End: 55}, summary: Range{Start: 20, End: 43}, tail: 43})
		assert.Nil(t, res.Spill, "no spill is asked for once the quota is used up")
		require.Equal(t, []string{"session.halted"}, types(res))
		h := res.Outputs[0].Data.(*events.SessionHalted)
		assert.Contains(t, h.Message, "spill quota of 1000 bytes is used up")
		assert.Equal(t, rs(52, 53), h.Unrecoverable)
	})
}

// loadOldSnapshot loads testdata/snapshot-v<version>/<name>.snap, checks
// that it is of that version, and that it is written back as the current
// version and reads back alike.
func loadOldSnapshot(t *testing.T, version byte, name string) *Ledger {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", fmt.Sprintf("snapshot-v%d", version), name+".snap"))
	require.NoError(t, err)
	require.Equal(t, version, b[0], "a version-%d snapshot", version)
	var l Ledger
	require.NoError(t, l.UnmarshalBinary(b))
	again, err := l.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, byte(snapshotVersion), again[0], "written back as the current version")
	var back Ledger
	require.NoError(t, back.UnmarshalBinary(again))
	assert.Equal(t, l, back)
	return &l
}

// TestSnapshotVersion1: snapshots written before spills were incremental
// still load; their newest spill counts as one full spill, and the next one
// continues its chain.
func TestSnapshotVersion1(t *testing.T) {
	load := func(t *testing.T, name string) *Ledger { return loadOldSnapshot(t, 1, name) }
	t.Run("spilled", func(t *testing.T) {
		l := load(t, "spilled")
		v := l.View()
		require.NotNil(t, v.LastSpill)
		assert.Nil(t, v.LastSpill.Previous)
		assert.Equal(t, uint32(2), v.Spills)
		assert.Equal(t, uint64(9000), v.SpilledBytes, "the newest spill's size, as one full spill")
		assert.Equal(t, v.LastSpill.Events, l.spillAccepted)
		assert.Len(t, l.Requests(), 2)
		s := &session{t: t, l: *l, id: "s1", seq: v.LastSeq}
		s.turns(2)
		s.truncate(56, 57)
		res := s.request(req{id: "req-3", in: Range{Start: 20, End: 57}, summary: Range{Start: 20, End: 45}, tail: 45})
		require.NotNil(t, res.Spill)
		assert.Equal(t, v.LastSpill.LastSeq+1, res.Spill.FirstSeq)
		assert.Equal(t, uint64(4), res.Spill.Events)
		assert.Equal(t, "s1/2.jsonl", res.Spill.Previous)
		assert.Equal(t, uint64(DefaultSpillQuota-9000), res.Spill.MaxBytes)
		out := s.spillAs(res.Spill, 100, nil)
		assert.Equal(t, "s1/2.jsonl", *out.Outputs[0].Data.(*events.SpillHandle).Previous)
	})
	t.Run("pending", func(t *testing.T) {
		l := load(t, "pending")
		require.True(t, l.Pending())
		s := &session{t: t, l: *l, id: "s1", seq: l.View().LastSeq}
		res := s.spill("")
		require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res))
		assert.Equal(t, map[events.ReasonCode][]Range{events.ReasonCoverageHole: rs(0, 8)}, reasons(t, res))
		assert.Nil(t, res.Outputs[0].Data.(*events.SpillHandle).Previous)
	})
	t.Run("halted", func(t *testing.T) {
		l := load(t, "halted")
		require.True(t, l.Halted())
		s := &session{t: t, l: *l, id: "s1", seq: l.View().LastSeq}
		require.True(t, s.send(&events.SessionResumed{Note: "ok"}, events.TypeSessionResumed).Accepted)
		assert.Equal(t, rs(0, 8), s.l.waived.Ranges())
	})
}

// TestSnapshotSizeIsEstimated: far from its limit, a session never encodes
// its snapshot to check it; near it, it measures and stays within.
func TestSnapshotSizeIsEstimated(t *testing.T) {
	s := newSession(t)
	s.open(events.UnitTokens, events.UnitTokens, 4)
	s.turn(0, 1)
	require.True(t, s.l.sized)
	measured := s.l.size
	for i := range 10_000 {
		s.turn(uint64(2*i+2), 1) // a new range each time
	}
	assert.Equal(t, measured, s.l.size, "no measurement while the estimate is far from the limit")
	assert.Positive(t, s.l.slack)

	b, _ := s.l.MarshalBinary()
	s.cfg.Limits = Limits{MaxRanges: 1 << 20, MaxSnapshotBytes: len(b) + 2000}
	rejected := 0
	for i := range 2000 {
		if res := s.turn(uint64(100_000+2*i), 1); !res.Accepted {
			assert.Equal(t, "ledger.snapshot", res.Outputs[0].Data.(*events.EventRejected).Field)
			rejected++
			break
		}
	}
	assert.Equal(t, 1, rejected, "the limit is reached")
	assert.NotEqual(t, measured, s.l.size, "measured near the limit")
	b, _ = s.l.MarshalBinary()
	assert.LessOrEqual(t, len(b), s.cfg.Limits.MaxSnapshotBytes)
	assert.Greater(t, len(b), s.cfg.Limits.MaxSnapshotBytes-haltReserve-2*rangeBytes, "and used up to it")
}

// TestRejectionEchoIsBounded: a rejection repeats at most an excerpt of each
// input value and a bounded set of headers.
func TestRejectionEchoIsBounded(t *testing.T) {
	huge := strings.Repeat("v", 600_000)
	h := map[string][]string{"Ce-Id": {huge}, "Nats-Msg-Id": {"m1"}}
	for i := range 100 {
		h[fmt.Sprintf("X-%03d", i)] = []string{huge, huge}
	}
	c := events.Cause{Meta: events.Meta{Subject: "seamguard.events." + huge, Seq: 7, Headers: h}}
	out := Rejection(c, "", events.Errorf(events.CodeTooLarge, huge, "id is %d bytes", len(huge)))
	d := out.Data.(*events.EventRejected)
	assert.Equal(t, events.Excerpt(huge), d.Field)
	assert.Equal(t, events.Excerpt(c.Meta.Subject), d.Input.Subject)
	assert.Equal(t, uint64(7), d.Input.Seq)
	assert.Equal(t, []string{"m1"}, d.Input.Headers["Nats-Msg-Id"])
	assert.Equal(t, []string{events.Excerpt(huge)}, d.Input.Headers["Ce-Id"])
	assert.Positive(t, d.Input.HeadersOmitted)
	assert.Equal(t, c, out.Cause, "the cause, from which the output id derives, is kept whole")
	_, _, body, err := events.Encoder{}.Encode(out)
	require.NoError(t, err)
	assert.Less(t, len(body), events.MaxOutputBytes)
}

// TestCutReasons: a refusal lists at most MaxAtRiskRanges ranges in all,
// each reason at least its share, a short list whole.
func TestCutReasons(t *testing.T) {
	list := func(n int) []Range {
		out := make([]Range, n)
		for i := range out {
			out[i] = Range{Start: uint64(2 * i), End: uint64(2*i + 1)}
		}
		return out
	}
	cases := []struct {
		name  string
		sizes []int
		want  []int
	}{
		{"under the bound", []int{10, 500, 490}, []int{10, 500, 490}},
		{"one long list", []int{5000}, []int{1000}},
		{"short lists kept whole", []int{3, 5000, 1, 5000}, []int{3, 498, 1, 498}},
		{"even split, the rest to the last", []int{5000, 5000, 5000}, []int{333, 333, 334}},
		{"seven long lists", []int{2000, 2000, 2000, 2000, 2000, 2000, 2000}, []int{142, 143, 143, 143, 143, 143, 143}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in []events.Reason
			for i, n := range tc.sizes {
				in = append(in, events.Reason{Code: events.ReasonCode(fmt.Sprint(i)), AtRisk: list(n)})
			}
			out := cutReasons(in, events.MaxAtRiskRanges)
			total := 0
			for i, r := range out {
				assert.Len(t, r.AtRisk, tc.want[i], "reason %d", i)
				total += len(r.AtRisk)
				cut := tc.want[i] < tc.sizes[i]
				assert.Equal(t, cut, r.AtRiskTruncated)
				if cut {
					assert.Equal(t, &events.AtRiskTotal{Ranges: uint64(tc.sizes[i]), Units: uint64(tc.sizes[i])}, r.AtRiskTotal)
				}
				assert.Len(t, in[i].AtRisk, tc.sizes[i], "the input is left as it was")
			}
			assert.LessOrEqual(t, total, events.MaxAtRiskRanges)
		})
	}
}

// TestWorstCaseOutputs builds the largest outputs sessions can make, with
// every input value at its bound and made to escape, offsets near 2^53,
// 100,000 disjoint truncations, 50,000 gaps, and requires each output,
// encoded with a time and a long source, to stay under MaxOutputBytes.
func TestWorstCaseOutputs(t *testing.T) {
	const n = 100_000
	top := events.MaxOffset
	base := top - 4*n - 16
	ugly := strings.Repeat("\x01", events.MaxIDBytes) // six bytes each in JSON
	session := strings.Repeat("s", events.MaxSessionIDLen)
	enc := events.Encoder{Source: strings.Repeat("p", 200), Now: func() time.Time { return time.Unix(1e9, 123456789) }}
	big := Limits{MaxRanges: 10 * n, MaxSnapshotBytes: 1 << 30}
	seq := uint64(0)
	largest := map[string]int{}
	check := func(t *testing.T, res Result) {
		t.Helper()
		for _, out := range res.Outputs {
			_, _, body, err := enc.Encode(out)
			require.NoError(t, err)
			require.Less(t, len(body), events.MaxOutputBytes, "%s of %d bytes", out.Type, len(body))
			largest[out.Type] = max(largest[out.Type], len(body))
		}
	}
	step := func(t *testing.T, l *Ledger, cfg Config, body any) Result {
		t.Helper()
		seq++
		id := fmt.Sprintf("%s%08d", ugly[:events.MaxIDBytes-8], seq)
		ev := &events.Event{ID: id, Source: ugly, Subject: session, Body: body, Meta: events.Meta{
			Subject: "seamguard.events." + session, Seq: seq, Headers: map[string][]string{"Ce-Id": {id}}, Control: onControl(body),
		}}
		res, err := Step(l, Input{Event: ev}, cfg)
		require.NoError(t, err)
		check(t, res)
		return res
	}
	// Received with n/2 gaps near the top, n truncations among them.
	build := func(t *testing.T, cfg Config, floorUnit events.Unit) *Ledger {
		var l Ledger
		require.True(t, step(t, &l, cfg, &events.SessionOpened{Unit: events.UnitTokens, RecoveryFloor: events.Floor{Span: 2 * n, Unit: floorUnit}}).Accepted)
		require.True(t, step(t, &l, cfg, &events.TurnAppended{Offset: 0, Size: base}).Accepted)
		for i := range uint64(n / 2) {
			require.True(t, step(t, &l, cfg, &events.TurnAppended{Offset: base + 8*i, Size: 4}).Accepted)
		}
		for i := range uint64(n) {
			require.True(t, step(t, &l, cfg, &events.ContextTruncated{Range: Range{Start: base + 3*i + 1, End: base + 3*i + 2}}).Accepted)
		}
		return &l
	}
	request := func(l *Ledger) *events.CompactionRequested {
		tail := l.head - n
		return &events.CompactionRequested{RequestID: ugly, SummarizerInput: Range{Start: base + 3, End: l.head},
			SummaryRange: Range{Start: base, End: tail - 10}, TailStart: tail}
	}
	t.Run("halted with a long list, the refusals and a state limit after it", func(t *testing.T) {
		cfg := Config{Policy: PolicyHalt, Limits: big}
		l := build(t, cfg, events.UnitTokens)
		res := step(t, l, cfg, request(l))
		require.Equal(t, []string{"session.halted"}, types(res))
		assert.True(t, res.Outputs[0].Data.(*events.SessionHalted).UnrecoverableTruncated)
		res = step(t, l, cfg, request(l))
		require.Equal(t, []string{"compaction.refused"}, types(res))
		assert.True(t, res.Outputs[0].Data.(*events.CompactionRefused).Reasons[0].AtRiskTruncated)
		cfg.Limits.MaxRanges = 1
		res = step(t, l, cfg, &events.TurnAppended{Offset: top - 2, Size: 1})
		require.Equal(t, []string{"event.rejected", "session.halted"}, types(res))
	})
	t.Run("every check failing, a spill, a cured allowance, a violation", func(t *testing.T) {
		// The floor in another unit fails unit_mismatch: a halt names all
		// of [0, head), and resuming it waives the gaps, so that a later
		// request with every check failing spills rather than halts.
		cfg := Config{Policy: PolicyHalt, Limits: big}
		l := build(t, cfg, events.UnitTurns)
		require.Equal(t, []string{"session.halted"}, types(step(t, l, cfg, request(l))))
		require.True(t, step(t, l, cfg, &events.SessionResumed{Note: strings.Repeat("\x01", events.MaxNoteBytes)}).Accepted)
		require.True(t, step(t, l, cfg, &events.TurnAppended{Offset: l.head, Size: 1}).Accepted)
		cfg.Policy = PolicySpill
		res := step(t, l, cfg, request(l))
		require.NotNil(t, res.Spill)
		res2, err := Step(l, Input{Spill: &SpillResult{Handle: events.SpillHandle{Bucket: "seamguard-spills", Name: res.Spill.Name,
			Digest: "SHA-256=" + strings.Repeat("d", 43), Size: 1 << 20, Range: res.Spill.Range, Events: res.Spill.Events,
			FirstSeq: res.Spill.FirstSeq, LastSeq: res.Spill.LastSeq}}}, cfg)
		require.NoError(t, err)
		check(t, res2)
		require.Equal(t, []string{"transcript.spilled", "compaction.refused"}, types(res2))
		ref := res2.Outputs[1].Data.(*events.CompactionRefused)
		assert.Len(t, ref.Reasons, 7, "every check fails")
		cut := 0
		for _, r := range ref.Reasons {
			if r.AtRiskTruncated {
				cut++
			}
		}
		assert.GreaterOrEqual(t, cut, 4)
		allowed := step(t, l, cfg, request(l))
		require.Equal(t, []string{"compaction.allowed"}, types(allowed))
		assert.True(t, allowed.Outputs[0].Data.(*events.CompactionAllowed).SummaryCoverageTruncated)
		require.Equal(t, []string{"compaction.violation"}, types(step(t, l, cfg, &events.CompactionCommitted{RequestID: ugly + "x"})))
	})
	for _, typ := range []string{events.TypeSessionHalted, events.TypeCompactionRefused, events.TypeTranscriptSpilled,
		events.TypeCompactionAllowed, events.TypeCompactionViolation, events.TypeEventRejected} {
		assert.Positive(t, largest[typ], "no %s was made", typ)
	}
	t.Logf("largest encoded outputs: %v (bound %d)", largest, events.MaxOutputBytes)
}

// TestSnapshotRoundTripNewFields: the spill chain, forgotten requests and a
// pending refusal with cut lists survive a snapshot.
func TestSnapshotRoundTripNewFields(t *testing.T) {
	s := seed(t)
	s.cfg.Limits = Limits{MaxRequests: 1, listed: 1}
	s.spillAs(s.request(seedReq).Spill, 300, nil)
	s.request(req{id: "other", in: Range{End: 52}, summary: Range{End: 40}, tail: 40})
	s.turns(3)
	s.truncate(52, 53)
	s.truncate(50, 51)
	res := s.request(req{id: "req-2", in: Range{Start: 20, End: 55}, summary: Range{Start: 20, End: 43}, tail: 43})
	require.NotNil(t, res.Spill)
	require.True(t, s.l.pending.reasons[0].AtRiskTruncated || s.l.pending.reasons[len(s.l.pending.reasons)-1].AtRiskTruncated)
	for _, stage := range []string{"pending", "spilled"} {
		b, err := s.l.MarshalBinary()
		require.NoError(t, err)
		var back Ledger
		require.NoError(t, back.UnmarshalBinary(b))
		b2, _ := back.MarshalBinary()
		require.True(t, bytes.Equal(b, b2), stage)
		assert.Equal(t, s.l.spillBytes, back.spillBytes, stage)
		assert.Equal(t, s.l.spillAccepted, back.spillAccepted, stage)
		assert.Equal(t, s.l.forgotten, back.forgotten, stage)
		assert.Equal(t, s.l.forgottenAll, back.forgottenAll, stage)
		assert.Equal(t, s.l.tick, back.tick, stage)
		if stage == "pending" {
			assert.Equal(t, s.l.pending, back.pending)
			s.spillAs(res.Spill, 200, nil)
		} else {
			assert.Equal(t, s.l.lastSpill, back.lastSpill)
			require.NotNil(t, back.lastSpill.Previous)
		}
	}
}
