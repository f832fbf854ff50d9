package ledger

// A brute-force oracle of CONTRACT.md section 5 and of the lifecycle choices
// written down in doc.go. It shares no code with RangeSet or with Evaluate:
// every set is a bitmap over [0, orcWidth), every check is computed from the
// contract's definitions offset by offset, and at-risk ranges are read back out
// of the bitmaps. The property, seed and fuzz tests drive the core and the
// oracle side by side and compare what they say.

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"

	"github.com/seamguard/seamguard/events"
)

// orcWidth bounds the offsets the oracle can hold. The generators keep heads
// far below it; anything at or beyond it is dropped by orcSpan.
const orcWidth = 512

// orcBits is a set of offsets in [0, orcWidth), one bit per offset.
type orcBits [orcWidth / 64]uint64

// orcSpan is the set [lo, hi), empty when hi <= lo.
func orcSpan(lo, hi uint64) orcBits {
	var b orcBits
	hi = min(hi, orcWidth)
	for x := lo; x < hi; {
		if x%64 == 0 && hi-x >= 64 {
			b[x/64] = ^uint64(0)
			x += 64
			continue
		}
		b[x/64] |= 1 << (x % 64)
		x++
	}
	return b
}

// orcSub is max(0, a - b) without wrapping.
func orcSub(a, b uint64) uint64 {
	if b >= a {
		return 0
	}
	return a - b
}

func (b orcBits) has(x uint64) bool {
	return x < orcWidth && b[x/64]&(1<<(x%64)) != 0
}

func (b orcBits) or(c orcBits) orcBits {
	for i := range b {
		b[i] |= c[i]
	}
	return b
}

func (b orcBits) and(c orcBits) orcBits {
	for i := range b {
		b[i] &= c[i]
	}
	return b
}

func (b orcBits) minus(c orcBits) orcBits {
	for i := range b {
		b[i] &^= c[i]
	}
	return b
}

func (b orcBits) empty() bool {
	for _, w := range b {
		if w != 0 {
			return false
		}
	}
	return true
}

// within reports b ⊆ c.
func (b orcBits) within(c orcBits) bool { return b.minus(c).empty() }

func (b orcBits) count() int {
	n := 0
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	return n
}

// ranges reads the set back as sorted, merged half-open ranges, offset by
// offset (whole words of zeros or ones are stepped over at once).
func (b orcBits) ranges() []events.Range {
	var out []events.Range
	inRun := false
	var start uint64
	for x := uint64(0); x < orcWidth; {
		w := b[x/64]
		if x%64 == 0 && ((!inRun && w == 0) || (inRun && w == ^uint64(0))) {
			x += 64
			continue
		}
		on := w&(1<<(x%64)) != 0
		switch {
		case on && !inRun:
			inRun, start = true, x
		case !on && inRun:
			inRun = false
			out = append(out, events.Range{Start: start, End: x})
		}
		x++
	}
	if inRun {
		out = append(out, events.Range{Start: start, End: orcWidth})
	}
	return out
}

// orcFromRanges is the union of rs (reversed ranges hold nothing).
func orcFromRanges(rs []events.Range) orcBits {
	var b orcBits
	for _, r := range rs {
		b = b.or(orcSpan(r.Start, r.End))
	}
	return b
}

// Observations: what a Step said, reduced to the fields the tests compare.

type orcReason struct {
	Code   events.ReasonCode
	AtRisk []events.Range
}

type orcOut struct {
	Type          string
	Cause         string // id of the input event the output answers
	RequestID     string
	Reasons       []orcReason
	Spill         string // handle a refusal carries ("" for none)
	Next          string
	Head          uint64
	TailStart     uint64
	Coverage      []events.Range
	RecoveredBy   []string
	Cured         []events.ReasonCode
	Unrecoverable []events.Range
	Code          events.Code // rejection code
	Handle        string      // handle of transcript.spilled
}

type orcSpillReq struct {
	Cause    string // id of the compaction request the spill is for
	Session  string
	N        uint32
	Name     string
	Range    events.Range
	FirstSeq uint64
	LastSeq  uint64
	Events   uint64
}

type orcObs struct {
	Accepted  bool
	Duplicate bool
	Outs      []orcOut
	Spill     *orcSpillReq
}

// orcHandleKey names a spill handle in observations.
func orcHandleKey(h events.SpillHandle) string { return h.Name + "#" + h.Digest }

func orcNoEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// orcObserve reduces a core Result to an observation.
func orcObserve(r Result) orcObs {
	o := orcObs{Accepted: r.Accepted, Duplicate: r.Duplicate}
	if s := r.Spill; s != nil {
		o.Spill = &orcSpillReq{Cause: s.Cause.ID, Session: s.Session, N: s.N, Name: s.Name, Range: s.Range, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq, Events: s.Events}
	}
	for _, out := range r.Outputs {
		x := orcOut{Type: out.Type, Cause: out.Cause.ID}
		switch d := out.Data.(type) {
		case *events.CompactionAllowed:
			x.RequestID, x.Head, x.TailStart = d.RequestID, d.Head, d.TailStart
			x.Coverage = orcNoEmpty(d.SummaryCoverage)
			for _, h := range d.RecoveredBy {
				x.RecoveredBy = append(x.RecoveredBy, orcHandleKey(h))
			}
			x.Cured = orcNoEmpty(d.Cured)
		case *events.CompactionRefused:
			x.RequestID, x.Next = d.RequestID, d.Next
			for _, rs := range d.Reasons {
				x.Reasons = append(x.Reasons, orcReason{Code: rs.Code, AtRisk: orcNoEmpty(rs.AtRisk)})
			}
			if d.Spill != nil {
				x.Spill = orcHandleKey(*d.Spill)
			}
		case *events.SpillHandle:
			x.Handle = orcHandleKey(*d)
		case *events.SessionHalted:
			x.RequestID = d.RequestID
			x.Unrecoverable = orcNoEmpty(d.Unrecoverable)
		case *events.EventRejected:
			x.Code = d.Code
		case *events.CompactionViolation:
			x.RequestID = d.RequestID
		default:
			x.Type += fmt.Sprintf(" (unexpected data %T)", out.Data)
		}
		o.Outs = append(o.Outs, x)
	}
	return o
}

// The oracle's ledger.

type orcStatus int

const (
	orcNew orcStatus = iota
	orcOpen
	orcHalted
	orcClosed
)

// orcRecent and orcRequestIDs are the duplicate windows doc.go states.
const (
	orcRecent     = 8
	orcRequestIDs = 16
	orcResumeIDs  = 64
)

type orcPair struct{ source, id string }

type orcRequest struct {
	evaluated bool
	allowed   bool
	coverage  orcBits
	ids       []orcPair
	commits   []orcPair
}

type orcSpill struct {
	handle events.SpillHandle
	holds  orcBits
}

type orcPending struct {
	cause     string
	requestID string
	reasons   []orcReason
	atRisk    orcBits
}

type orcLedger struct {
	session   string
	status    orcStatus
	unit      events.Unit
	floorUnit events.Unit
	span      uint64
	head      uint64
	firstSeq  uint64
	lastSeq   uint64
	accepted  uint64

	received  orcBits
	truncated orcBits // T
	committed orcBits // K
	spilled   orcBits // P
	waived    orcBits // W

	spills   []orcSpill // successful spills, oldest first
	halt     orcBits    // unrecoverable ranges of the current halt
	haltReq  string
	requests map[string]*orcRequest
	pending  *orcPending
	recent   []orcPair // last accepted (source, id), oldest first
	resumes  []orcPair // session.resumed applied, oldest first
}

// clone returns a deep copy.
func (o *orcLedger) clone() *orcLedger {
	c := *o
	c.spills = append([]orcSpill(nil), o.spills...)
	c.recent = append([]orcPair(nil), o.recent...)
	c.resumes = append([]orcPair(nil), o.resumes...)
	c.requests = make(map[string]*orcRequest, len(o.requests))
	for k, v := range o.requests {
		r := *v
		r.ids = append([]orcPair(nil), v.ids...)
		r.commits = append([]orcPair(nil), v.commits...)
		c.requests[k] = &r
	}
	if o.pending != nil {
		p := *o.pending
		c.pending = &p
	}
	return &c
}

func orcUnitValid(u events.Unit) bool {
	return u == events.UnitTurns || u == events.UnitTokens || u == events.UnitMessages
}

func orcReject(ev *events.Event, code events.Code) orcObs {
	return orcObs{Outs: []orcOut{{Type: events.TypeEventRejected, Cause: ev.ID, Code: code}}}
}

func orcOK(outs ...orcOut) orcObs { return orcObs{Accepted: true, Outs: outs} }

// event applies one input event, the way CONTRACT.md and doc.go say.
func (o *orcLedger) event(ev *events.Event, cfg Config) orcObs {
	// The ledger belongs to the session of its first accepted event (it
	// is opened then): a rejected event leaves no trace.
	if o.status == orcNew {
		o.session = ev.Subject
	}
	p := orcPair{ev.Source, ev.ID}
	for _, q := range o.recent {
		if q == p {
			return orcObs{Duplicate: true}
		}
	}
	var res orcObs
	switch b := ev.Body.(type) {
	case *events.SessionOpened:
		res = o.open(ev, b)
	case *events.TurnAppended:
		res = o.turn(ev, b)
	case *events.ContextTruncated:
		res = o.truncate(ev, b)
	case *events.CompactionRequested:
		res = o.request(ev, b, cfg)
	case *events.CompactionCommitted:
		res = o.commit(ev, b)
	case *events.SessionResumed:
		res = o.resume(ev, b)
	case *events.SessionClosed:
		res = o.close(ev)
	default:
		res = orcReject(ev, events.CodeUnknownType)
	}
	if res.Accepted {
		o.recent = append(o.recent, p)
		if len(o.recent) > orcRecent {
			o.recent = o.recent[1:]
		}
		o.accepted++
		o.lastSeq = ev.Meta.Seq
	}
	return res
}

// lifecycle is the rejection for a session that is not open or halted.
func (o *orcLedger) lifecycle() events.Code {
	switch o.status {
	case orcNew:
		return events.CodeUnknownSession
	case orcClosed:
		return events.CodeSessionClosed
	}
	return ""
}

func (o *orcLedger) open(ev *events.Event, b *events.SessionOpened) orcObs {
	if !orcUnitValid(b.Unit) || !orcUnitValid(b.RecoveryFloor.Unit) || b.RecoveryFloor.Span > events.MaxOffset {
		return orcReject(ev, events.CodeBadData)
	}
	switch o.status {
	case orcClosed:
		return orcReject(ev, events.CodeSessionClosed)
	case orcOpen, orcHalted:
		if b.Unit == o.unit && b.RecoveryFloor.Unit == o.floorUnit && b.RecoveryFloor.Span == o.span {
			return orcOK()
		}
		return orcReject(ev, events.CodeAlreadyOpen)
	}
	o.status = orcOpen
	o.unit, o.floorUnit, o.span = b.Unit, b.RecoveryFloor.Unit, b.RecoveryFloor.Span
	o.firstSeq = ev.Meta.Seq
	return orcOK()
}

func (o *orcLedger) turn(ev *events.Event, b *events.TurnAppended) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if b.Size == 0 || b.Offset > events.MaxOffset || b.Size > events.MaxOffset || b.Offset+b.Size > events.MaxOffset {
		return orcReject(ev, events.CodeBadData)
	}
	t := orcSpan(b.Offset, b.Offset+b.Size)
	if !t.and(o.received).empty() {
		return orcReject(ev, events.CodeOffsetConflict)
	}
	o.received = o.received.or(t)
	o.head = max(o.head, b.Offset+b.Size)
	return orcOK()
}

func (o *orcLedger) truncate(ev *events.Event, b *events.ContextTruncated) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if b.Range.Start > b.Range.End {
		return orcReject(ev, events.CodeBadData)
	}
	if b.Range.End > o.head {
		return orcReject(ev, events.CodeRangeOutOfBounds)
	}
	o.truncated = o.truncated.or(orcSpan(b.Range.Start, b.Range.End))
	return orcOK()
}

func (o *orcLedger) resume(ev *events.Event, b *events.SessionResumed) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if strings.TrimSpace(b.Note) == "" {
		return orcReject(ev, events.CodeBadData)
	}
	// A resume is applied once however late a copy comes (doc.go).
	p := orcPair{ev.Source, ev.ID}
	for _, q := range o.resumes {
		if q == p {
			return orcObs{Duplicate: true}
		}
	}
	o.resumes = append(o.resumes, p)
	if len(o.resumes) > orcResumeIDs {
		o.resumes = o.resumes[1:]
	}
	if o.status == orcHalted {
		// The ranges unrecoverable at this moment become waived.
		o.waived = o.waived.or(o.halt)
		o.status, o.halt, o.haltReq = orcOpen, orcBits{}, ""
	}
	return orcOK()
}

func (o *orcLedger) close(ev *events.Event) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	o.status = orcClosed
	return orcOK()
}

func (o *orcLedger) commit(ev *events.Event, b *events.CompactionCommitted) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if b.RequestID == "" {
		return orcReject(ev, events.CodeBadData)
	}
	v := orcOut{Type: events.TypeCompactionViolation, Cause: ev.ID, RequestID: b.RequestID}
	rec := o.requests[b.RequestID]
	if rec == nil || !rec.evaluated {
		return orcOK(v) // never decided: a violation, nothing changes
	}
	// A commit is applied once however late a copy comes (doc.go).
	p := orcPair{ev.Source, ev.ID}
	for _, q := range rec.commits {
		if q == p {
			return orcObs{Duplicate: true}
		}
	}
	rec.commits = append(rec.commits, p)
	if len(rec.commits) > orcRequestIDs {
		rec.commits = rec.commits[1:]
	}
	o.committed = rec.coverage
	if rec.allowed {
		return orcOK()
	}
	return orcOK(v)
}

// orcEval is the outcome of the section 5 checks, with the sets they used.
type orcEval struct {
	reasons []orcReason
	atRisk  orcBits
	C, R    orcBits
	whole   orcBits
}

// evaluate computes every check of section 5 from the definitions.
func (o *orcLedger) evaluate(b *events.CompactionRequested) orcEval {
	h := o.head
	T := o.truncated
	whole := orcSpan(0, h)
	I := orcSpan(b.SummarizerInput.Start, b.SummarizerInput.End).and(whole)
	Ip := I.minus(T)
	R := orcSpan(b.TailStart, h).minus(T)
	F := orcSpan(orcSub(h, o.span), h)
	reach := orcSpan(orcSub(b.TailStart, o.span), b.TailStart)
	S := orcSpan(b.SummaryRange.Start, b.SummaryRange.End)
	var K orcBits
	if b.CarriesPriorSummary {
		K = o.committed
	}
	C := S.and(Ip.or(K))

	e := orcEval{C: C, R: R, whole: whole}
	fail := func(code events.ReasonCode, risk orcBits) {
		e.reasons = append(e.reasons, orcReason{Code: code, AtRisk: risk.ranges()})
		e.atRisk = e.atRisk.or(risk)
	}
	if o.floorUnit != o.unit {
		fail(events.ReasonUnitMismatch, whole)
	}
	if !F.within(R) {
		fail(events.ReasonFloorNotInTail, F.minus(R))
	}
	if !F.within(Ip) {
		fail(events.ReasonFloorNotInInput, F.minus(Ip))
	}
	if !reach.within(Ip) {
		fail(events.ReasonReachNotInInput, reach.minus(Ip))
	}
	if b.SummaryRange.End < b.TailStart {
		fail(events.ReasonSeamGap, orcSpan(b.SummaryRange.End, b.TailStart))
	}
	if CR := C.or(R); !whole.within(CR) {
		fail(events.ReasonCoverageHole, whole.minus(CR))
	}
	if !whole.within(o.received) {
		fail(events.ReasonSequenceGap, whole.minus(o.received))
	}
	sort.Slice(e.reasons, func(i, j int) bool { return e.reasons[i].Code < e.reasons[j].Code })
	return e
}

// safe is the property every allowed compaction must have: every offset of
// [0, head) is in C ∪ R ∪ P ∪ W.
func (o *orcLedger) safe(b *events.CompactionRequested) (bool, []events.Range) {
	e := o.evaluate(b)
	held := e.C.or(e.R).or(o.spilled).or(o.waived)
	return e.whole.within(held), e.whole.minus(held).ranges()
}

func (o *orcLedger) refusal(ev *events.Event, id string, code events.ReasonCode, risk []events.Range) orcOut {
	return orcOut{Type: events.TypeCompactionRefused, Cause: ev.ID, RequestID: id,
		Reasons: []orcReason{{Code: code, AtRisk: risk}}, Next: events.NextNone}
}

func (o *orcLedger) request(ev *events.Event, b *events.CompactionRequested, cfg Config) orcObs {
	// Rule 1, unknown or closed session: the event is no part of a transcript.
	switch o.status {
	case orcNew:
		return orcObs{Outs: []orcOut{o.refusal(ev, b.RequestID, events.ReasonUnknownSession, nil)}}
	case orcClosed:
		return orcObs{Outs: []orcOut{o.refusal(ev, b.RequestID, events.ReasonSessionClosed, nil)}}
	}
	p := orcPair{ev.Source, ev.ID}
	rec := o.requests[b.RequestID]
	if rec != nil {
		for _, q := range rec.ids {
			if q == p {
				return orcObs{Duplicate: true}
			}
		}
	}
	if rec == nil {
		rec = &orcRequest{}
		if o.requests == nil {
			o.requests = map[string]*orcRequest{}
		}
		o.requests[b.RequestID] = rec
	}
	rec.ids = append(rec.ids, p)
	if len(rec.ids) > orcRequestIDs {
		rec.ids = rec.ids[1:]
	}
	// Rule 1, invalid requests, then halted sessions.
	h := o.head
	if b.RequestID == "" || b.SummarizerInput.Start > b.SummarizerInput.End || b.SummaryRange.Start > b.SummaryRange.End ||
		b.TailStart > h || b.SummaryRange.End > h {
		return orcOK(o.refusal(ev, b.RequestID, events.ReasonInvalidRequest, nil))
	}
	if o.status == orcHalted {
		return orcOK(o.refusal(ev, b.RequestID, events.ReasonSessionHalted, o.halt.ranges()))
	}

	e := o.evaluate(b)
	rec.evaluated, rec.allowed, rec.coverage = true, false, e.C
	allowed := orcOut{Type: events.TypeCompactionAllowed, Cause: ev.ID, RequestID: b.RequestID,
		Head: h, TailStart: b.TailStart, Coverage: e.C.ranges()}
	// Rule 2.
	if len(e.reasons) == 0 {
		rec.allowed = true
		return orcOK(allowed)
	}
	// Rule 3.
	rest := e.atRisk.minus(o.spilled).minus(o.waived)
	if rest.empty() {
		rec.allowed = true
		for _, r := range e.reasons {
			allowed.Cured = append(allowed.Cured, r.Code)
		}
		// recovered_by: the newest of the spills that hold an at-risk offset.
		for i := len(o.spills) - 1; i >= 0; i-- {
			if !o.spills[i].holds.and(e.atRisk).empty() {
				allowed.RecoveredBy = []string{orcHandleKey(o.spills[i].handle)}
				break
			}
		}
		return orcOK(allowed)
	}
	// Rule 5 when some offset at risk was never received, or the policy halts.
	if !rest.within(o.received) || cfg.Policy == PolicyHalt {
		return orcOK(o.haltNow(ev.ID, b.RequestID, rest))
	}
	// Rule 4: ask for a spill of [0, head).
	o.pending = &orcPending{cause: ev.ID, requestID: b.RequestID, reasons: e.reasons, atRisk: e.atRisk}
	n := uint32(len(o.spills) + 1)
	res := orcOK()
	res.Spill = &orcSpillReq{
		Cause:    ev.ID,
		Session:  o.session,
		N:        n,
		Name:     fmt.Sprintf("%s/%d.jsonl", o.session, n),
		Range:    events.Range{Start: 0, End: h},
		FirstSeq: o.firstSeq,
		LastSeq:  ev.Meta.Seq,
		Events:   o.accepted + 1,
	}
	return res
}

func (o *orcLedger) haltNow(cause, requestID string, lost orcBits) orcOut {
	o.status, o.halt, o.haltReq = orcHalted, lost, requestID
	return orcOut{Type: events.TypeSessionHalted, Cause: cause, RequestID: requestID, Unrecoverable: lost.ranges()}
}

// spillDone applies the result of the spill the last request asked for.
func (o *orcLedger) spillDone(r *SpillResult) orcObs {
	p := o.pending
	o.pending = nil
	if r.Failure != "" {
		return orcObs{Outs: []orcOut{o.haltNow(p.cause, p.requestID, p.atRisk.minus(o.spilled).minus(o.waived))}}
	}
	// The spill holds every received offset of [0, head).
	holds := o.received.and(orcSpan(0, o.head))
	o.spilled = o.spilled.or(holds)
	o.spills = append(o.spills, orcSpill{handle: r.Handle, holds: holds})
	key := orcHandleKey(r.Handle)
	return orcObs{Outs: []orcOut{
		{Type: events.TypeTranscriptSpilled, Cause: p.cause, Handle: key},
		{Type: events.TypeCompactionRefused, Cause: p.cause, RequestID: p.requestID, Reasons: p.reasons, Spill: key, Next: events.NextRetry},
	}}
}

// orcCompareState reports where the core's ledger and the oracle's state
// differ, or "".
func orcCompareState(l *Ledger, o *orcLedger) string {
	var d []string
	eq := func(name string, got RangeSet, want orcBits) {
		// The core's ranges are read into a bitmap only to compare them.
		if orcFromRanges(got.Ranges()) != want || orcRepr(got) != "" {
			d = append(d, fmt.Sprintf("%s: core %v, oracle %v", name, got.Ranges(), want.ranges()))
		}
	}
	if int(l.status) != int(o.status) {
		d = append(d, fmt.Sprintf("status: core %v, oracle %d", l.status, o.status))
	}
	if l.head != o.head {
		d = append(d, fmt.Sprintf("head: core %d, oracle %d", l.head, o.head))
	}
	eq("received", l.received, o.received)
	eq("truncated", l.truncated, o.truncated)
	eq("committed", l.committed, o.committed)
	eq("spilled", l.spilled, o.spilled)
	eq("waived", l.waived, o.waived)
	if o.status == orcHalted {
		var got RangeSet
		if l.halt != nil {
			got = *l.halt
		}
		eq("halt", got, o.halt)
	}
	if l.Pending() != (o.pending != nil) {
		d = append(d, fmt.Sprintf("pending: core %v, oracle %v", l.Pending(), o.pending != nil))
	}
	if int(l.spills) != len(o.spills) {
		d = append(d, fmt.Sprintf("spills: core %d, oracle %d", l.spills, len(o.spills)))
	}
	if l.accepted != o.accepted || l.lastSeq != o.lastSeq || l.firstSeq != o.firstSeq {
		d = append(d, fmt.Sprintf("accepted/firstSeq/lastSeq: core %d/%d/%d, oracle %d/%d/%d",
			l.accepted, l.firstSeq, l.lastSeq, o.accepted, o.firstSeq, o.lastSeq))
	}
	return strings.Join(d, "; ")
}
