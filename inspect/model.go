package inspect

import (
	"slices"
	"time"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// Parked is a parked session's record, as the session bucket holds it.
type Parked struct {
	Cause      string    `json:"cause"`
	StuckSince time.Time `json:"stuck_since"`
	ParkedAt   time.Time `json:"parked_at"`
	StoredSeq  uint64    `json:"stored_seq"`
	By         string    `json:"by"`
}

// Range is a half-open offset interval.
type Range = events.Range

// Class is what the picture says about a stretch of offsets. Each offset of
// [0, head) has one class on the context track and at most one on the
// backup track.
type Class string

// Classes of the context track: what the agent's working context holds.
const (
	// Summary: in the committed summary's coverage K.
	Summary Class = "summary"
	// Tail: received, not truncated, not summarised: verbatim in the context.
	Tail Class = "tail"
	// Truncated: evicted by budget enforcement (T) and in no summary.
	Truncated Class = "truncated"
	// Gap: never received.
	Gap Class = "gap"
)

// Classes of the backup track: what holds an offset besides the context.
const (
	// Spilled: held by a verified spill (P).
	Spilled Class = "spilled"
	// Waived: accepted as lost by an operator (W).
	Waived Class = "waived"
	// Hole: in neither the summary nor the verbatim context, and in no spill
	// and no waiver: nothing holds it.
	Hole Class = "hole"
)

// Pinned is the class of the pinned track: offsets the agent pinned (N),
// turns that must stay in its working context.
const Pinned Class = "pinned"

// severity orders classes for a cell that covers several offsets: the cell
// shows the most severe class among them.
func (c Class) severity() int {
	switch c {
	case Hole:
		return 7
	case Gap:
		return 6
	case Truncated:
		return 5
	case Waived:
		return 4
	case Spilled:
		return 3
	case Tail:
		return 2
	case Summary, Pinned:
		return 1
	}
	return 0
}

// Segment is a maximal stretch of offsets of one class.
type Segment struct {
	Class Class  `json:"class"`
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

// Floor is the session's recovery floor.
type Floor struct {
	Span  uint64      `json:"span"`
	Unit  events.Unit `json:"unit"`
	Range Range       `json:"range"` // [max(0, head - span), head)
}

// Origin says where the ledger of a Model came from.
type Origin struct {
	// From is "kv" (the session bucket's snapshot) or "events" (rebuilt
	// from the events stream with the pure core).
	From string `json:"from"`
	// Name is the bucket or stream read.
	Name string `json:"name"`
	// Seq is the events stream sequence of the last input applied.
	Seq uint64 `json:"seq"`
	// Events is how many of the session's messages a rebuild read.
	Events int `json:"events,omitempty"`
}

// Sets are the ledger's range sets and what the picture derives from them.
type Sets struct {
	Received  []Range `json:"received"`
	Truncated []Range `json:"truncated"` // T
	Committed []Range `json:"committed"` // K
	Spilled   []Range `json:"spilled"`   // P
	Waived    []Range `json:"waived"`    // W
	Pinned    []Range `json:"pinned"`    // N
	Tail      []Range `json:"tail"`      // received, not in T, not in K
	Gaps      []Range `json:"gaps"`      // never received
	Holes     []Range `json:"holes"`     // held by nothing
}

// Halt describes a halted session.
type Halt struct {
	Request       string  `json:"request_id"`
	Unrecoverable []Range `json:"unrecoverable"`
}

// Entry is one verdict of the session's decision history, as recorded in
// the verdict stream.
type Entry struct {
	Seq         uint64    `json:"seq"` // verdict stream sequence
	Time        time.Time `json:"time,omitzero"`
	ID          string    `json:"id"`
	Type        string    `json:"type"`
	Kind        string    `json:"kind"`
	CausationID string    `json:"causation_id,omitempty"`
	// Data is the verdict's data: *events.CompactionAllowed,
	// *events.CompactionRefused, *events.SpillHandle, *events.SessionHalted,
	// *events.EventRejected or *events.CompactionViolation.
	Data any `json:"data"`
	// CarriedPins are the ranges the compaction request this verdict
	// answers carried back into the new context (carried_pins), as read
	// from the events stream; empty when it carried none or the request
	// could not be read.
	CarriedPins []Range `json:"carried_pins,omitempty"`
	// DroppedPins are the pinned offsets a refusal says the compaction
	// would drop (the at-risk offsets of its pin_dropped reason).
	DroppedPins []Range `json:"dropped_pins,omitempty"`
}

// RequestID returns the compaction the verdict is about, "" for rejections
// and spills (a spill's request is in the refusal that follows it).
func (e Entry) RequestID() string {
	switch d := e.Data.(type) {
	case *events.CompactionAllowed:
		return d.RequestID
	case *events.CompactionRefused:
		return d.RequestID
	case *events.SessionHalted:
		return d.RequestID
	case *events.CompactionViolation:
		return d.RequestID
	}
	return ""
}

// EntryOf turns a decoded verdict and its stream sequence into an Entry.
func EntryOf(seq uint64, v *events.Verdict) Entry {
	e := Entry{Seq: seq, Time: v.Time, ID: v.ID, Type: v.Type, Kind: v.Kind(), CausationID: v.Cause.ID, Data: v.Data}
	if d, ok := v.Data.(*events.CompactionRefused); ok {
		for _, r := range d.Reasons {
			if r.Code == events.ReasonPinDropped {
				e.DroppedPins = append(e.DroppedPins, r.AtRisk...)
			}
		}
	}
	return e
}

// AttachCarried sets the CarriedPins of the entries that answer a
// compaction request: carried maps a request event's id to the ranges it
// carried.
func AttachCarried(hist []Entry, carried map[string][]Range) {
	for i, e := range hist {
		switch e.Data.(type) {
		case *events.CompactionAllowed, *events.CompactionRefused, *events.SessionHalted:
			if c := carried[e.CausationID]; len(c) > 0 {
				hist[i].CarriedPins = c
			}
		}
	}
}

// Model is everything inspect shows about one session: the ledger's sets,
// the picture's three tracks, and the decision history. It is plain data;
// --json writes it as it is.
type Model struct {
	Session  string      `json:"session"`
	Status   string      `json:"status"` // new, open, halted or closed
	Unit     events.Unit `json:"unit"`
	Head     uint64      `json:"head"`
	Floor    Floor       `json:"recovery_floor"`
	State    Origin      `json:"state"`
	Accepted uint64      `json:"accepted_events"`
	Sets     Sets        `json:"sets"`
	// Context is the upper track: summary, tail, truncated and gap
	// segments covering [0, head) in order.
	Context []Segment `json:"context"`
	// Backup is the lower track: spilled, waived and hole segments, in
	// order; offsets in none of them are held by the context.
	Backup []Segment `json:"backup"`
	// Pins is the pinned track: the pinned offsets (N), turns that must
	// stay in the working context whatever the other tracks say.
	Pins      []Segment           `json:"pins"`
	Spills    uint32              `json:"spills"`
	LastSpill *events.SpillHandle `json:"last_spill"`
	Halt      *Halt               `json:"halt"`
	// Parked is the session's park record, when it is parked: stuck on a
	// failure retrying cannot fix, its inputs past the record's stored
	// sequence waiting in the events stream (see processor.ParkRecord).
	Parked *Parked `json:"parked,omitempty"`
	// Pending names a compaction whose spill was asked for and whose result
	// is not yet applied ("" when none).
	Pending string `json:"pending_spill_for,omitempty"`
	// Verdicts is the verdict stream the history was read from.
	Verdicts string  `json:"verdict_stream"`
	History  []Entry `json:"history"`
	// Unattributed are the messages on the session's verdict subjects
	// that failed verification (package attest): unsigned, signed by a
	// key not trusted, changed, or a verdict of another session or kind.
	// They are not in History and count for nothing in the model.
	Unattributed []Unattributed `json:"unattributed,omitempty"`
}

// Unattributed is a message of the verdict stream that failed
// verification: what it claims to be, where it was, and why it failed.
type Unattributed struct {
	Seq     uint64 `json:"seq"` // verdict stream sequence
	Subject string `json:"subject"`
	// Reason is attest's: unsigned, bad_signature, untrusted_signer,
	// misrouted or malformed.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Signer  string `json:"signer,omitempty"` // the key it names, if any
	// ID, Type and Session are what its body claims, when it decodes as
	// a verdict.
	ID      string `json:"id,omitempty"`
	Type    string `json:"type,omitempty"`
	Session string `json:"session,omitempty"`
}

// Build derives the model of a ledger view. history is the session's
// verdicts in stream order; origin says where the view came from.
func Build(v ledger.View, origin Origin, verdicts string, history []Entry) *Model {
	whole := ledger.NewRangeSet(Range{Start: 0, End: v.Head})
	gaps := v.Gaps()
	received := v.Received
	verbatim := ledger.Diff(received, v.Truncated)
	tail := ledger.Diff(verbatim, v.Committed)
	summary := ledger.Intersect(v.Committed, received)
	// Held by the context: the summary of received offsets, and the
	// verbatim ones.
	held := ledger.Union(summary, verbatim)
	lost := ledger.Diff(whole, held)
	holes := ledger.Diff(ledger.Diff(lost, v.Spilled), v.Waived)

	m := &Model{
		Session:  v.Session,
		Status:   v.Status,
		Unit:     v.Unit,
		Head:     v.Head,
		Floor:    Floor{Span: v.Span, Unit: v.FloorUnit, Range: v.Floor()},
		State:    origin,
		Accepted: v.Accepted,
		Sets: Sets{
			Received:  ranges(received),
			Truncated: ranges(v.Truncated),
			Committed: ranges(v.Committed),
			Spilled:   ranges(v.Spilled),
			Waived:    ranges(v.Waived),
			Pinned:    ranges(v.Pinned),
			Tail:      ranges(tail),
			Gaps:      ranges(gaps),
			Holes:     ranges(holes),
		},
		Spills:    v.Spills,
		LastSpill: v.LastSpill,
		Pending:   v.PendingRequest,
		Verdicts:  verdicts,
		History:   history,
	}
	if m.History == nil {
		m.History = []Entry{}
	}
	if v.Halt != nil {
		m.Halt = &Halt{Request: v.HaltRequest, Unrecoverable: ranges(*v.Halt)}
	}
	// The context track: a gap first (it never existed), then the summary,
	// then truncation; what is left of [0, head) is the verbatim tail.
	m.Context = segments(v.Head, []layer{
		{Gap, gaps},
		{Summary, v.Committed},
		{Truncated, v.Truncated},
		{Tail, whole},
	})
	m.Backup = segments(v.Head, []layer{
		{Spilled, v.Spilled},
		{Waived, v.Waived},
		{Hole, holes},
	})
	m.Pins = segments(v.Head, []layer{{Pinned, v.Pinned}})
	return m
}

// classRanges returns the ranges the picture shows in class c.
func (m *Model) classRanges(c Class) []Range {
	segs := m.Context
	switch c {
	case Spilled, Waived, Hole:
		segs = m.Backup
	case Pinned:
		segs = m.Pins
	}
	out := []Range{}
	for _, g := range segs {
		if g.Class == c {
			out = append(out, Range{Start: g.Start, End: g.End})
		}
	}
	return out
}

// layer is one class and the offsets it claims, in order of precedence.
type layer struct {
	class Class
	set   ledger.RangeSet
}

// segments splits [0, head) into maximal stretches where the first layer
// that holds an offset is the same; offsets no layer holds are left out.
func segments(head uint64, layers []layer) []Segment {
	cuts := map[uint64]struct{}{0: {}, head: {}}
	for _, l := range layers {
		for _, r := range l.set.Within(Range{Start: 0, End: head}).Ranges() {
			cuts[r.Start] = struct{}{}
			cuts[r.End] = struct{}{}
		}
	}
	points := make([]uint64, 0, len(cuts))
	for p := range cuts {
		points = append(points, p)
	}
	slices.Sort(points)
	out := []Segment{}
	for i := 0; i+1 < len(points); i++ {
		a, b := points[i], points[i+1]
		var c Class
		for _, l := range layers {
			if l.set.Has(a) {
				c = l.class
				break
			}
		}
		if c == "" {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Class == c && out[n-1].End == a {
			out[n-1].End = b
			continue
		}
		out = append(out, Segment{Class: c, Start: a, End: b})
	}
	return out
}

func ranges(s ledger.RangeSet) []Range {
	r := s.Ranges()
	out := make([]Range, len(r))
	copy(out, r)
	return out
}
