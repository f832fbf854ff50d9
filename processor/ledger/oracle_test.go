package ledger

// A brute-force oracle of CONTRACT.md sections 5, 7 and 8 and of the choices
// written down in doc.go (lifecycle, limits, forgotten requests, incremental
// spills, lists cut short). It shares no code with RangeSet or with Evaluate:
// every set is a bitmap over [0, orcWidth), every check is computed from the
// contract's definitions offset by offset, and at-risk ranges are read back out
// of the bitmaps. The property, seed and fuzz tests drive the core and the
// oracle side by side and compare what they say.

import (
	"fmt"
	"math/bits"
	"slices"
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
	Code      events.ReasonCode
	AtRisk    []events.Range
	Truncated bool
	Total     events.AtRiskTotal // zero unless Truncated
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
	CoverageTotal events.AtRiskTotal // zero unless summary_coverage was cut
	RecoveredBy   []string
	Cured         []events.ReasonCode
	Unrecoverable []events.Range
	UnrecTotal    events.AtRiskTotal // zero unless unrecoverable was cut
	Code          events.Code        // rejection code
	Field         string             // rejection field, for state_limit
	Why           string             // which violation: never, forgotten, unsure, refused
	Handle        string             // handle of transcript.spilled
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
	Previous string
	MaxBytes uint64
}

type orcObs struct {
	Accepted  bool
	Duplicate bool
	Outs      []orcOut
	Spill     *orcSpillReq
}

// orcHandleKey names a spill handle in observations, with the spill before
// it in its chain.
func orcHandleKey(h events.SpillHandle) string {
	k := h.Name + "#" + h.Digest
	if h.Previous != nil {
		k += "<-" + *h.Previous
	}
	return k
}

func orcNoEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func orcTotal(t *events.AtRiskTotal) events.AtRiskTotal {
	if t == nil {
		return events.AtRiskTotal{}
	}
	return *t
}

// orcViolation classifies a violation by what its message says.
func orcViolation(msg string) string {
	switch {
	case strings.Contains(msg, "no longer remembers"):
		return "forgotten"
	case strings.Contains(msg, "has no record"):
		return "unsure"
	case strings.Contains(msg, "never decided"):
		return "never"
	case strings.Contains(msg, "refused"):
		return "refused"
	}
	return "unclassified: " + msg
}

// orcObserve reduces a core Result to an observation.
func orcObserve(r Result) orcObs {
	o := orcObs{Accepted: r.Accepted, Duplicate: r.Duplicate}
	if s := r.Spill; s != nil {
		o.Spill = &orcSpillReq{Cause: s.Cause.ID, Session: s.Session, N: s.N, Name: s.Name, Range: s.Range, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq,
			Events: s.Events, Previous: s.Previous, MaxBytes: s.MaxBytes}
	}
	for _, out := range r.Outputs {
		x := orcOut{Type: out.Type, Cause: out.Cause.ID}
		switch d := out.Data.(type) {
		case *events.CompactionAllowed:
			x.RequestID, x.Head, x.TailStart = d.RequestID, d.Head, d.TailStart
			x.Coverage = orcNoEmpty(d.SummaryCoverage)
			x.CoverageTotal = orcTotal(d.SummaryCoverageTotal)
			for _, h := range d.RecoveredBy {
				x.RecoveredBy = append(x.RecoveredBy, orcHandleKey(h))
			}
			x.Cured = orcNoEmpty(d.Cured)
		case *events.CompactionRefused:
			x.RequestID, x.Next = d.RequestID, d.Next
			for _, rs := range d.Reasons {
				x.Reasons = append(x.Reasons, orcReason{Code: rs.Code, AtRisk: orcNoEmpty(rs.AtRisk), Truncated: rs.AtRiskTruncated, Total: orcTotal(rs.AtRiskTotal)})
			}
			if d.Spill != nil {
				x.Spill = orcHandleKey(*d.Spill)
			}
			x.Cured = orcNoEmpty(d.Cured)
		case *events.SpillHandle:
			x.Handle = orcHandleKey(*d)
		case *events.SessionHalted:
			x.RequestID = d.RequestID
			x.Unrecoverable = orcNoEmpty(d.Unrecoverable)
			x.UnrecTotal = orcTotal(d.UnrecoverableTotal)
		case *events.EventRejected:
			x.Code = d.Code
			if d.Code == events.CodeStateLimit {
				x.Field = d.Field
			}
		case *events.CompactionViolation:
			x.RequestID = d.RequestID
			x.Why = orcViolation(d.Message)
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

// orcRecent and orcRequestIDs are the duplicate windows doc.go states;
// orcForgotten is how many forgotten request ids a ledger can still name.
const (
	orcRecent     = 8
	orcRequestIDs = 16
	orcResumeIDs  = 64
	orcForgotten  = 1024
)

// orcLimits are the limits doc.go states, with their defaults.
type orcLimits struct {
	ranges, requests int
	quota            uint64
	listed           int // ranges an output lists at most
}

func orcLimitsOf(cfg Config) orcLimits {
	l := cfg.Limits
	o := orcLimits{ranges: l.MaxRanges, requests: l.MaxRequests, quota: l.SpillQuota, listed: l.listed}
	if o.ranges <= 0 {
		o.ranges = 100_000
	}
	if o.requests <= 0 {
		o.requests = 256
	}
	if o.quota == 0 {
		o.quota = 1 << 30
	}
	if o.listed <= 0 {
		o.listed = events.MaxAtRiskRanges
	}
	return o
}

// orcHint is what the test driver measured of the snapshot, which the oracle
// does not encode: whether the event (or spill result) would take it past
// its limit, and whether a halt in force has room to name one range more.
type orcHint struct {
	over bool
	room bool
}

type orcPair struct{ source, id string }

type orcRequest struct {
	evaluated bool
	allowed   bool
	coverage  orcBits
	ids       []orcPair
	commits   []orcPair
	used      int // when it was last requested or committed
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
	pinned    orcBits // N

	spills        []orcSpill // successful spills, oldest first
	spillBytes    uint64     // their sizes together
	spillAccepted uint64     // accepted events up to the newest spill
	halt          orcBits    // unrecoverable ranges of the current halt
	haltReq       string
	requests      map[string]*orcRequest
	clock         int      // the last used stamp given out
	forgotten     []string // evaluated request ids forgotten, oldest first, the last orcForgotten
	forgottenAll  int
	pending       *orcPending
	recent        []orcPair // last accepted (source, id), oldest first
	resumes       []orcPair // session.resumed applied, oldest first
}

// clone returns a deep copy.
func (o *orcLedger) clone() *orcLedger {
	c := *o
	c.spills = append([]orcSpill(nil), o.spills...)
	c.recent = append([]orcPair(nil), o.recent...)
	c.resumes = append([]orcPair(nil), o.resumes...)
	c.forgotten = append([]string(nil), o.forgotten...)
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

// orcCount is how many ranges b holds.
func orcCount(b orcBits) int { return len(b.ranges()) }

func orcMax(b orcBits) uint64 {
	rs := b.ranges()
	if len(rs) == 0 {
		return 0
	}
	return rs[len(rs)-1].End
}

// orcCutList keeps the first limit ranges of rs and counts them all if it
// cut.
func orcCutList(rs []events.Range, limit int) ([]events.Range, events.AtRiskTotal) {
	if len(rs) <= limit {
		return rs, events.AtRiskTotal{}
	}
	var t events.AtRiskTotal
	for _, r := range rs {
		t.Ranges++
		t.Units += r.End - r.Start
	}
	return orcNoEmpty(rs[:limit]), t
}

// orcCutReasons shares out limit ranges among reasons as doc.go says: the
// largest cap c that the reasons' min(need, c) fit under, and what is left
// one range each to the largest reasons (ties: the later one).
func orcCutReasons(rs []orcReason, limit int) []orcReason {
	need := 0
	for _, r := range rs {
		need += len(r.AtRisk)
	}
	if need <= limit {
		return rs
	}
	sum := func(c int) int {
		n := 0
		for _, r := range rs {
			n += min(len(r.AtRisk), c)
		}
		return n
	}
	c := 0
	for sum(c+1) <= limit {
		c++
	}
	shares := make([]int, len(rs))
	var big []int
	for i, r := range rs {
		shares[i] = min(len(r.AtRisk), c)
		if len(r.AtRisk) > c {
			big = append(big, i)
		}
	}
	sort.SliceStable(big, func(a, b int) bool { return len(rs[big[a]].AtRisk) < len(rs[big[b]].AtRisk) })
	for k := len(big) - (limit - sum(c)); k < len(big); k++ {
		shares[big[k]]++
	}
	out := make([]orcReason, len(rs))
	for i, r := range rs {
		out[i] = r
		if list, t := orcCutList(r.AtRisk, shares[i]); t.Ranges > 0 {
			out[i].AtRisk, out[i].Truncated, out[i].Total = list, true, t
		}
	}
	return out
}

// event applies one input event, the way CONTRACT.md and doc.go say.
func (o *orcLedger) event(ev *events.Event, cfg Config, hint orcHint) orcObs {
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
	// Authority: a resume counts on the control subject only, and the
	// control subject carries nothing else.
	if _, resumed := ev.Body.(*events.SessionResumed); resumed != ev.Meta.Control {
		return orcReject(ev, events.CodeNotPermitted)
	}
	lim := orcLimitsOf(cfg)
	if hint.over {
		return o.limitHit(ev, "ledger.snapshot", o.concerned(ev), lim, hint)
	}
	var res orcObs
	switch b := ev.Body.(type) {
	case *events.SessionOpened:
		res = o.open(ev, b)
	case *events.TurnAppended:
		res = o.turn(ev, b, lim, hint)
	case *events.ContextTruncated:
		res = o.truncate(ev, b, lim, hint)
	case *events.ContextPinned:
		res = o.pin(ev, b.Range, true, lim, hint)
	case *events.ContextUnpinned:
		res = o.pin(ev, b.Range, false, lim, hint)
	case *events.CompactionRequested:
		res = o.request(ev, b, cfg, lim, hint)
	case *events.CompactionCommitted:
		res = o.commit(ev, b, lim, hint)
	case *events.SessionResumed:
		res = o.resume(ev, b, lim, hint)
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

// concerned is what an event over a limit concerned: a turn's or a
// truncation's offsets, else the whole transcript.
func (o *orcLedger) concerned(ev *events.Event) orcBits {
	switch b := ev.Body.(type) {
	case *events.TurnAppended:
		if b.Size > 0 && b.Offset+b.Size <= events.MaxOffset {
			return orcSpan(b.Offset, b.Offset+b.Size)
		}
	case *events.ContextTruncated:
		if b.Range.Start < b.Range.End {
			return orcSpan(b.Range.Start, b.Range.End)
		}
	case *events.ContextPinned:
		if b.Range.Start < b.Range.End {
			return orcSpan(b.Range.Start, b.Range.End)
		}
	case *events.ContextUnpinned:
		if b.Range.Start < b.Range.End {
			return orcSpan(b.Range.Start, b.Range.End)
		}
	}
	return orcSpan(0, o.head)
}

// limitHit is the state_limit rejection and the halt that comes with it
// (doc.go): a halt in force gains the event's offsets, or becomes their
// hull when it has no room for another range.
func (o *orcLedger) limitHit(ev *events.Event, field string, concerned orcBits, lim orcLimits, hint orcHint) orcObs {
	rej := orcOut{Type: events.TypeEventRejected, Cause: ev.ID, Code: events.CodeStateLimit, Field: field}
	if o.status == orcNew || o.status == orcClosed {
		return orcObs{Outs: []orcOut{rej}}
	}
	lost := concerned
	if o.status == orcHalted {
		lost = o.halt.or(concerned)
		if orcCount(lost) > orcCount(o.halt) && !hint.room {
			rs := lost.ranges()
			lost = orcSpan(rs[0].Start, rs[len(rs)-1].End)
		}
	}
	return orcObs{Outs: []orcOut{rej, o.haltNow(ev.ID, "", lost, lim)}}
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

func (o *orcLedger) turn(ev *events.Event, b *events.TurnAppended, lim orcLimits, hint orcHint) orcObs {
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
	if orcCount(o.received.or(t)) > lim.ranges {
		return o.limitHit(ev, "ledger.received", t, lim, hint)
	}
	if b.Pinned && orcCount(o.pinned.or(t)) > lim.ranges {
		return o.limitHit(ev, "ledger.pinned", t, lim, hint)
	}
	o.received = o.received.or(t)
	o.head = max(o.head, b.Offset+b.Size)
	if b.Pinned {
		o.pinned = o.pinned.or(t)
	}
	return orcOK()
}

// pin applies context.pinned (on) or context.unpinned (CONTRACT.md section
// 8): the received offsets of r are pinned, or every offset of r released.
func (o *orcLedger) pin(ev *events.Event, r events.Range, on bool, lim orcLimits, hint orcHint) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if r.Start > r.End {
		return orcReject(ev, events.CodeBadData)
	}
	if r.End > o.head {
		return orcReject(ev, events.CodeRangeOutOfBounds)
	}
	t := orcSpan(r.Start, r.End)
	next := o.pinned.minus(t)
	if on {
		next = o.pinned.or(t.and(o.received))
	}
	if orcCount(next) > lim.ranges {
		return o.limitHit(ev, "ledger.pinned", t, lim, hint)
	}
	o.pinned = next
	return orcOK()
}

func (o *orcLedger) truncate(ev *events.Event, b *events.ContextTruncated, lim orcLimits, hint orcHint) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if b.Range.Start > b.Range.End {
		return orcReject(ev, events.CodeBadData)
	}
	if b.Range.End > o.head {
		return orcReject(ev, events.CodeRangeOutOfBounds)
	}
	t := orcSpan(b.Range.Start, b.Range.End)
	if orcCount(o.truncated.or(t)) > lim.ranges {
		return o.limitHit(ev, "ledger.truncated", t, lim, hint)
	}
	o.truncated = o.truncated.or(t)
	return orcOK()
}

func (o *orcLedger) resume(ev *events.Event, b *events.SessionResumed, lim orcLimits, hint orcHint) orcObs {
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
	if o.status == orcHalted && orcCount(o.waived.or(o.halt)) > lim.ranges {
		return o.limitHit(ev, "ledger.waived", o.halt, lim, hint)
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

func (o *orcLedger) commit(ev *events.Event, b *events.CompactionCommitted, lim orcLimits, hint orcHint) orcObs {
	if c := o.lifecycle(); c != "" {
		return orcReject(ev, c)
	}
	if b.RequestID == "" {
		return orcReject(ev, events.CodeBadData)
	}
	v := orcOut{Type: events.TypeCompactionViolation, Cause: ev.ID, RequestID: b.RequestID}
	rec := o.requests[b.RequestID]
	if rec == nil {
		// Forgotten (or perhaps forgotten): the summary is unknown now,
		// so no prior summary is credited (doc.go).
		known := slices.Contains(o.forgotten, b.RequestID)
		if known || o.forgottenAll > len(o.forgotten) {
			v.Why = "unsure"
			if known {
				v.Why = "forgotten"
			}
			o.committed = orcBits{}
			return orcOK(v)
		}
	}
	if rec == nil || !rec.evaluated {
		v.Why = "never"
		return orcOK(v) // never decided: a violation, nothing changes
	}
	// A commit is applied once however late a copy comes (doc.go).
	p := orcPair{ev.Source, ev.ID}
	for _, q := range rec.commits {
		if q == p {
			return orcObs{Duplicate: true}
		}
	}
	if orcCount(rec.coverage) > lim.ranges {
		return o.limitHit(ev, "ledger.committed", orcSpan(0, o.head), lim, hint)
	}
	rec.commits = append(rec.commits, p)
	if len(rec.commits) > orcRequestIDs {
		rec.commits = rec.commits[1:]
	}
	o.clock++
	rec.used = o.clock
	o.committed = rec.coverage
	if rec.allowed {
		return orcOK()
	}
	v.Why = "refused"
	return orcOK(v)
}

// orcEval is the outcome of the section 5 checks, with the sets they used.
type orcEval struct {
	reasons []orcReason
	atRisk  orcBits // of every failed check but pin_dropped
	dropped orcBits // of pin_dropped
	C, R    orcBits
	carried orcBits
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

	carried := orcFromRanges(b.CarriedPins)
	e := orcEval{C: C, R: R, carried: carried, whole: whole}
	fail := func(code events.ReasonCode, risk orcBits) {
		e.reasons = append(e.reasons, orcReason{Code: code, AtRisk: risk.ranges()})
		if code == events.ReasonPinDropped {
			e.dropped = risk
		} else {
			e.atRisk = e.atRisk.or(risk)
		}
	}
	if kept := R.or(carried); !o.pinned.within(kept) {
		fail(events.ReasonPinDropped, o.pinned.minus(kept))
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

// pinsKept is the property of section 8 every allowed compaction must have:
// every pinned offset is in R ∪ carried.
func (o *orcLedger) pinsKept(b *events.CompactionRequested) (bool, []events.Range) {
	e := o.evaluate(b)
	kept := e.R.or(e.carried)
	return o.pinned.within(kept), o.pinned.minus(kept).ranges()
}

func (o *orcLedger) refusal(ev *events.Event, id string, code events.ReasonCode, risk []events.Range, lim orcLimits) orcOut {
	return orcOut{Type: events.TypeCompactionRefused, Cause: ev.ID, RequestID: id,
		Reasons: orcCutReasons([]orcReason{{Code: code, AtRisk: risk}}, lim.listed), Next: events.NextNone}
}

// touch marks a request id as asked for by the event p, now; a new one past
// the limit forgets the least recently used.
func (o *orcLedger) touch(id string, p orcPair, lim orcLimits) *orcRequest {
	rec := o.requests[id]
	if rec == nil {
		for len(o.requests) >= lim.requests {
			oldest, first := "", true
			for k, r := range o.requests {
				if first || r.used < o.requests[oldest].used {
					oldest, first = k, false
				}
			}
			if o.requests[oldest].evaluated {
				o.forgotten = append(o.forgotten, oldest)
				if len(o.forgotten) > orcForgotten {
					o.forgotten = o.forgotten[1:]
				}
				o.forgottenAll++
			}
			delete(o.requests, oldest)
		}
		rec = &orcRequest{}
		if o.requests == nil {
			o.requests = map[string]*orcRequest{}
		}
		o.requests[id] = rec
	}
	rec.ids = append(rec.ids, p)
	if len(rec.ids) > orcRequestIDs {
		rec.ids = rec.ids[1:]
	}
	o.clock++
	rec.used = o.clock
	return rec
}

func (o *orcLedger) request(ev *events.Event, b *events.CompactionRequested, cfg Config, lim orcLimits, hint orcHint) orcObs {
	// Rule 1, unknown or closed session: the event is no part of a transcript.
	switch o.status {
	case orcNew:
		return orcObs{Outs: []orcOut{o.refusal(ev, b.RequestID, events.ReasonUnknownSession, nil, lim)}}
	case orcClosed:
		return orcObs{Outs: []orcOut{o.refusal(ev, b.RequestID, events.ReasonSessionClosed, nil, lim)}}
	}
	p := orcPair{ev.Source, ev.ID}
	if rec := o.requests[b.RequestID]; rec != nil {
		for _, q := range rec.ids {
			if q == p {
				return orcObs{Duplicate: true}
			}
		}
	}
	// Rule 1, invalid requests, then halted sessions.
	h := o.head
	reversedPin := false
	for _, r := range b.CarriedPins {
		reversedPin = reversedPin || r.Start > r.End
	}
	if b.RequestID == "" || b.SummarizerInput.Start > b.SummarizerInput.End || b.SummaryRange.Start > b.SummaryRange.End ||
		b.TailStart > h || b.SummaryRange.End > h || b.CarriedPinsInvalid != "" || reversedPin {
		o.touch(b.RequestID, p, lim)
		return orcOK(o.refusal(ev, b.RequestID, events.ReasonInvalidRequest, nil, lim))
	}
	if o.status == orcHalted {
		o.touch(b.RequestID, p, lim)
		return orcOK(o.refusal(ev, b.RequestID, events.ReasonSessionHalted, o.halt.ranges(), lim))
	}

	e := o.evaluate(b)
	whole := orcSpan(0, h)
	if orcCount(e.C) > lim.ranges {
		return o.limitHit(ev, "ledger.coverage", whole, lim, hint)
	}
	decided := func(allowed bool) {
		rec := o.touch(b.RequestID, p, lim)
		rec.evaluated, rec.allowed, rec.coverage = true, allowed, e.C
	}
	cov, covTotal := orcCutList(e.C.ranges(), lim.listed)
	allowed := orcOut{Type: events.TypeCompactionAllowed, Cause: ev.ID, RequestID: b.RequestID,
		Head: h, TailStart: b.TailStart, Coverage: cov, CoverageTotal: covTotal}
	// Rule 2.
	if len(e.reasons) == 0 {
		decided(true)
		return orcOK(allowed)
	}
	// Rules 3 to 5 look at the other checks alone; a request that rule 2
	// or 3 would allow but that drops pins is refused, with no spill.
	rest := e.atRisk.minus(o.spilled).minus(o.waived)
	if rest.empty() && !e.dropped.empty() {
		decided(false)
		// pin_dropped alone is listed; the other failed checks are cured.
		ref := orcOut{Type: events.TypeCompactionRefused, Cause: ev.ID, RequestID: b.RequestID, Next: events.NextCarryPins}
		var pins []orcReason
		for _, r := range e.reasons {
			if r.Code == events.ReasonPinDropped {
				pins = append(pins, r)
			} else {
				ref.Cured = append(ref.Cured, r.Code)
			}
		}
		ref.Reasons = orcCutReasons(pins, lim.listed)
		return orcOK(ref)
	}
	// Rule 3.
	if rest.empty() {
		decided(true)
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
	// Rule 5 when some offset at risk was never received, the policy
	// halts, or the spill quota is used up.
	if !rest.within(o.received) || cfg.Policy == PolicyHalt || o.spillBytes >= lim.quota {
		if orcCount(rest) > lim.ranges {
			return o.limitHit(ev, "ledger.halt", whole, lim, hint)
		}
		decided(false)
		return orcOK(o.haltNow(ev.ID, b.RequestID, rest, lim))
	}
	// Rule 4: ask for a spill of what no earlier spill holds.
	decided(false)
	o.pending = &orcPending{cause: ev.ID, requestID: b.RequestID, reasons: orcCutReasons(e.reasons, lim.listed), atRisk: e.atRisk}
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
		Events:   o.accepted + 1 - o.spillAccepted,
		MaxBytes: lim.quota - o.spillBytes,
	}
	if k := len(o.spills); k > 0 {
		res.Spill.FirstSeq = o.spills[k-1].handle.LastSeq + 1
		res.Spill.Previous = o.spills[k-1].handle.Name
	}
	return res
}

// haltNow halts with lost as the unrecoverable offsets, or the whole
// transcript (up to lost's end) when lost has too many ranges.
func (o *orcLedger) haltNow(cause, requestID string, lost orcBits, lim orcLimits) orcOut {
	if orcCount(lost) > lim.ranges {
		lost = orcSpan(0, max(o.head, orcMax(lost)))
	}
	o.status, o.halt, o.haltReq = orcHalted, lost, requestID
	list, total := orcCutList(lost.ranges(), lim.listed)
	return orcOut{Type: events.TypeSessionHalted, Cause: cause, RequestID: requestID, Unrecoverable: list, UnrecTotal: total}
}

// spillDone applies the result of the spill the last request asked for.
func (o *orcLedger) spillDone(r *SpillResult, cfg Config, hint orcHint) orcObs {
	lim := orcLimitsOf(cfg)
	p := o.pending
	o.pending = nil
	if hint.over { // recording it would take the snapshot past its limit
		return orcObs{Outs: []orcOut{o.haltNow(p.cause, p.requestID, orcSpan(0, o.head), lim)}}
	}
	left := uint64(0)
	if o.spillBytes < lim.quota {
		left = lim.quota - o.spillBytes
	}
	if r.Failure != "" || r.OverQuota || r.Handle.Size > left {
		return orcObs{Outs: []orcOut{o.haltNow(p.cause, p.requestID, p.atRisk.minus(o.spilled).minus(o.waived), lim)}}
	}
	// The chain holds every received offset of [0, head).
	holds := o.received.and(orcSpan(0, min(o.head, r.Handle.Range.End)))
	if orcCount(o.spilled.or(holds)) > lim.ranges {
		return orcObs{Outs: []orcOut{o.haltNow(p.cause, p.requestID, orcSpan(0, o.head), lim)}}
	}
	handle := r.Handle
	handle.Previous = nil
	if k := len(o.spills); k > 0 {
		prev := o.spills[k-1].handle.Name
		handle.Previous = &prev
	}
	o.spilled = o.spilled.or(holds)
	o.spills = append(o.spills, orcSpill{handle: handle, holds: holds})
	o.spillBytes += handle.Size
	o.spillAccepted = o.accepted
	key := orcHandleKey(handle)
	next := events.NextRetry
	for _, r := range p.reasons {
		if r.Code == events.ReasonPinDropped {
			next = events.NextCarryPins
		}
	}
	return orcObs{Outs: []orcOut{
		{Type: events.TypeTranscriptSpilled, Cause: p.cause, Handle: key},
		{Type: events.TypeCompactionRefused, Cause: p.cause, RequestID: p.requestID, Reasons: orcCutReasons(p.reasons, lim.listed), Spill: key, Next: next},
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
	eq("pinned", l.pinned, o.pinned)
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
	if l.spillBytes != o.spillBytes || l.spillAccepted != o.spillAccepted {
		d = append(d, fmt.Sprintf("spilled bytes/events: core %d/%d, oracle %d/%d", l.spillBytes, l.spillAccepted, o.spillBytes, o.spillAccepted))
	}
	if int(l.forgottenAll) != o.forgottenAll || len(l.forgotten) != len(o.forgotten) {
		d = append(d, fmt.Sprintf("forgotten: core %d (%d held), oracle %d (%d held)", l.forgottenAll, len(l.forgotten), o.forgottenAll, len(o.forgotten)))
	}
	var got, want []string
	for id, q := range l.requests {
		got = append(got, fmt.Sprintf("%q evaluated=%v allowed=%v", id, q.evaluated, q.allowed))
	}
	for id, q := range o.requests {
		want = append(want, fmt.Sprintf("%q evaluated=%v allowed=%v", id, q.evaluated, q.allowed))
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		d = append(d, fmt.Sprintf("requests: core %v, oracle %v", got, want))
	}
	return strings.Join(d, "; ")
}
