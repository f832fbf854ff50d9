package ledger

import (
	"cmp"
	"slices"

	"github.com/seamguard/seamguard/events"
)

// View is a read-only copy of a ledger's state, for operators' tools
// (seamguard inspect). It shares no memory with the ledger: changing a View
// changes nothing, and a View stays as it was when the ledger moves on.
type View struct {
	Session   string
	Status    string // "new", "open", "halted" or "closed"
	Unit      events.Unit
	FloorUnit events.Unit
	Span      uint64 // the recovery floor's span, in FloorUnit
	Head      uint64
	FirstSeq  uint64 // stream sequence of session.opened
	LastSeq   uint64 // stream sequence of the last accepted event
	Accepted  uint64 // accepted events: the lines a spill of [0, head) holds

	Received  RangeSet
	Truncated RangeSet // T
	Committed RangeSet // K
	Spilled   RangeSet // P
	Waived    RangeSet // W
	Pinned    RangeSet // N: offsets pinned to the working context

	Spills    uint32              // spills written and verified
	LastSpill *events.SpillHandle // the newest spill, nil when none
	// SpilledBytes is the size of all the spills together, what the spill
	// quota is held against.
	SpilledBytes uint64
	// ForgottenRequests counts the request ids (decided under rules 2 to
	// 5) forgotten to keep at most Limits.MaxRequests.
	ForgottenRequests uint64
	// Halt holds the unrecoverable ranges of a halted session (and of one
	// closed while halted); HaltRequest is the compaction that halted it.
	Halt        *RangeSet
	HaltRequest string
	// Pending is true while a spill was asked for and its result not yet
	// stepped; PendingRequest names its compaction.
	Pending        bool
	PendingRequest string
}

// Floor returns the recovery floor F = [max(0, head - span), head).
func (v View) Floor() Range {
	return Range{Start: v.Head - min(v.Span, v.Head), End: v.Head}
}

// Gaps returns the offsets of [0, head) that were never received.
func (v View) Gaps() RangeSet {
	return RangeDiff(Range{Start: 0, End: v.Head}, v.Received)
}

// View returns a copy of the ledger's state. It does not change the ledger.
func (l *Ledger) View() View {
	v := View{
		Session:   l.session,
		Status:    l.status.String(),
		Unit:      l.unit.unit(),
		FloorUnit: l.floorUnit.unit(),
		Span:      l.span,
		Head:      l.head,
		FirstSeq:  l.firstSeq,
		LastSeq:   l.lastSeq,
		Accepted:  l.accepted,
		Received:  l.received.Clone(),
		Truncated: l.truncated.Clone(),
		Committed: l.committed.Clone(),
		Spilled:   l.spilled.Clone(),
		Waived:    l.waived.Clone(),
		Pinned:    l.pinned.Clone(),
		Spills:    l.spills,

		SpilledBytes:      l.spillBytes,
		ForgottenRequests: l.forgottenAll,
	}
	if l.lastSpill != nil {
		h := *l.lastSpill
		v.LastSpill = &h
	}
	if l.halt != nil {
		h := l.halt.Clone()
		v.Halt = &h
		v.HaltRequest = l.haltReq
	}
	if l.pending != nil {
		v.Pending = true
		v.PendingRequest = l.pending.requestID
	}
	return v
}

// Requests returns the request ids the ledger remembers, sorted, with
// whether their latest evaluation allowed them and the summary coverage it
// computed (empty for requests only ever refused under rule 1).
func (l *Ledger) Requests() []RequestView {
	out := make([]RequestView, 0, len(l.requests))
	for id, r := range l.requests {
		out = append(out, RequestView{ID: id, Evaluated: r.evaluated, Allowed: r.allowed, Coverage: r.coverage.Clone(), Commits: len(r.commits)})
	}
	slices.SortFunc(out, func(a, b RequestView) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// RequestView is what a ledger remembers of one request_id.
type RequestView struct {
	ID        string
	Evaluated bool     // decided under rules 2 to 5 at least once
	Allowed   bool     // the latest such decision allowed it
	Coverage  RangeSet // C of the latest such decision
	Commits   int      // commits of it remembered
}
