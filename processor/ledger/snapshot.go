package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/seamguard/seamguard/events"
)

// ErrCorruptSnapshot is returned (wrapped) by UnmarshalBinary for bytes that
// are not a snapshot this version wrote.
var ErrCorruptSnapshot = errors.New("ledger: corrupt snapshot")

// snapshotVersion is the version MarshalBinary writes. Version 2 added the
// spill chain (each spill's previous, the accepted events and bytes the
// spills hold), the requests' use stamps, the forgotten request ids and the
// cut at-risk lists of a pending refusal. Version 3 added the pinned set N.
// UnmarshalBinary reads versions 1 and 2 too: they pin nothing. In version
// 1 the newest spill counts as one full spill (its events, its size), and
// the requests are stamped as used in the order of their ids.
const snapshotVersion = 3

// MarshalBinary encodes the ledger as a compact, deterministic snapshot: the
// same ledger always gives the same bytes. Range sets are delta-encoded
// varints, so an idle session takes a few dozen bytes.
func (l *Ledger) MarshalBinary() ([]byte, error) {
	w := writer{b: make([]byte, 0, 64)}
	w.u(snapshotVersion)
	w.s(l.session)
	w.u(uint64(l.status))
	w.u(uint64(l.unit))
	w.u(uint64(l.floorUnit))
	w.u(l.span)
	w.u(l.head)
	w.u(l.firstSeq)
	w.u(l.lastSeq)
	w.u(l.accepted)
	w.u(l.spillAccepted)
	w.u(l.spillBytes)
	for _, s := range []*RangeSet{&l.received, &l.truncated, &l.committed, &l.spilled, &l.waived} {
		w.set(*s)
	}
	w.set(l.pinned)
	w.u(uint64(l.spills))
	w.flag(l.lastSpill != nil)
	if l.lastSpill != nil {
		w.handle(l.lastSpill)
	}
	w.flag(l.halt != nil)
	if l.halt != nil {
		w.set(*l.halt)
	}
	w.s(l.haltReq)
	w.u(l.tick)
	keys := make([]string, 0, len(l.requests))
	for k := range l.requests {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w.u(uint64(len(keys)))
	for _, k := range keys {
		r := l.requests[k]
		w.s(k)
		w.flag(r.evaluated)
		w.flag(r.allowed)
		w.set(r.coverage)
		w.ids(r.ids)
		w.ids(r.commits)
		w.u(r.used)
	}
	w.ids(l.forgotten)
	w.u(l.forgottenAll)
	w.ids(l.resumes)
	w.flag(l.pending != nil)
	if p := l.pending; p != nil {
		w.s(p.cause.ID)
		w.s(p.cause.Source)
		w.s(p.cause.Meta.Subject)
		w.u(p.cause.Meta.Seq)
		w.s(p.requestID)
		w.u(uint64(len(p.reasons)))
		for _, r := range p.reasons {
			w.s(string(r.Code))
			w.s(r.Message)
			w.set(NewRangeSet(r.AtRisk...))
			w.flag(r.AtRiskTotal != nil)
			if t := r.AtRiskTotal; t != nil {
				w.u(t.Ranges)
				w.u(t.Units)
			}
		}
		w.set(p.atRisk)
	}
	for _, x := range l.recent {
		w.b = binary.LittleEndian.AppendUint64(w.b, x)
	}
	w.u(uint64(l.recentPos))
	return w.b, nil
}

// UnmarshalBinary replaces l with the ledger a snapshot holds. It checks every
// bound and invariant, so arbitrary bytes give ErrCorruptSnapshot, never a
// panic or a ledger Step could trip on.
func (l *Ledger) UnmarshalBinary(data []byte) error {
	r := reader{b: data}
	var n Ledger
	v := r.u()
	if (v < 1 || v > snapshotVersion) && r.err == nil {
		return fmt.Errorf("%w: version %d, this build reads 1 to %d", ErrCorruptSnapshot, v, snapshotVersion)
	}
	r.v = v
	n.session = r.s()
	n.status = status(r.small(uint64(statusClosed)))
	n.unit = unitCode(r.small(uint64(len(unitNames) - 1)))
	n.floorUnit = unitCode(r.small(uint64(len(unitNames) - 1)))
	n.span = r.u()
	n.head = r.u()
	n.firstSeq = r.u()
	n.lastSeq = r.u()
	n.accepted = r.u()
	if v >= 2 {
		n.spillAccepted = r.u()
		n.spillBytes = r.u()
	}
	for _, s := range []*RangeSet{&n.received, &n.truncated, &n.committed, &n.spilled, &n.waived} {
		*s = r.set()
	}
	if v >= 3 {
		n.pinned = r.set()
	}
	n.spills = uint32(r.small(math.MaxUint32))
	if r.flag() {
		n.lastSpill = r.handle()
	}
	if r.flag() {
		h := r.set()
		n.halt = &h
	}
	n.haltReq = r.s()
	if v >= 2 {
		n.tick = r.u()
	}
	n.requests = r.requests(&n.tick)
	if v >= 2 {
		n.forgotten = r.ids(maxForgotten)
		n.forgottenAll = r.u()
	} else if n.lastSpill != nil {
		// Version 1 spilled [0, head) in full each time: the newest spill
		// holds every event up to its last_seq.
		n.spillAccepted = n.lastSpill.Events
		n.spillBytes = n.lastSpill.Size
	}
	n.resumes = r.ids(maxResumeIDs)
	if r.flag() {
		n.pending = r.pending()
	}
	for i := range n.recent {
		n.recent[i] = r.fixed()
	}
	n.recentPos = uint8(r.small(recentIDs - 1))
	if r.err == nil && len(r.b) != 0 {
		r.fail("trailing bytes")
	}
	if r.err == nil {
		r.err = n.check()
	}
	if r.err != nil {
		return r.err
	}
	*l = n
	return nil
}

// requests reads a snapshot's requests; tick is the ledger's clock, which a
// version 1 snapshot (no use times) advances once per request, in order.
func (r *reader) requests(tick *uint64) map[string]*request {
	k := r.count()
	if k == 0 {
		return nil
	}
	reqs := make(map[string]*request, k)
	prev := ""
	for i := 0; i < k && r.err == nil; i++ {
		key := r.s()
		if i > 0 && key <= prev {
			r.fail("request ids out of order")
		}
		prev = key
		q := &request{evaluated: r.flag(), allowed: r.flag(), coverage: r.set()}
		q.ids = r.ids(maxEvalIDs)
		q.commits = r.ids(maxEvalIDs)
		if r.v >= 2 {
			q.used = r.u()
		} else {
			*tick++ // version 1: used in the order of the ids
			q.used = *tick
		}
		reqs[key] = q
	}
	return reqs
}

// pending reads a snapshot's pending request (one waiting for its spill).
func (r *reader) pending() *pending {
	p := &pending{}
	p.cause.ID = r.s()
	p.cause.Source = r.s()
	p.cause.Meta.Subject = r.s()
	p.cause.Meta.Seq = r.u()
	p.requestID = r.s()
	k := r.count()
	for i := 0; i < k && r.err == nil; i++ {
		reason := events.Reason{
			Code:    events.ReasonCode(r.s()),
			Message: r.s(),
			AtRisk:  nonNil(r.set().Ranges()),
		}
		if r.v >= 2 && r.flag() {
			reason.AtRiskTruncated = true
			reason.AtRiskTotal = &events.AtRiskTotal{Ranges: r.u(), Units: r.u()}
		}
		p.reasons = append(p.reasons, reason)
	}
	p.atRisk = r.set()
	return p
}

// check verifies the invariants that relate fields to one another.
func (l *Ledger) check() error {
	bad := func(what string) error { return fmt.Errorf("%w: %s", ErrCorruptSnapshot, what) }
	if l.status == statusNew && (l.head != 0 || !l.received.IsEmpty()) {
		return bad("offsets in a session that was never opened")
	}
	if l.received.Max() != l.head {
		return bad("head is not the end of the received offsets")
	}
	if l.truncated.Max() > l.head || l.spilled.Max() > l.head {
		return bad("truncated or spilled offsets beyond head")
	}
	if !l.pinned.SubsetOf(l.received) {
		return bad("pinned offsets that were never received")
	}
	// A closed session keeps the halt it was closed in.
	if (l.status == statusHalted && l.halt == nil) || (l.halt != nil && l.status != statusHalted && l.status != statusClosed) {
		return bad("halt ranges without a halted or closed status, or a halt without ranges")
	}
	if l.head > events.MaxOffset || l.span > events.MaxOffset {
		return bad("offset above the maximum")
	}
	if l.spillAccepted > l.accepted || (l.lastSpill == nil) != (l.spills == 0) || l.lastSpill == nil && (l.spillBytes != 0 || l.spillAccepted != 0) {
		return bad("spill counters that do not fit the spills")
	}
	if l.forgottenAll < uint64(len(l.forgotten)) {
		return bad("fewer request ids forgotten than remembered as forgotten")
	}
	for _, q := range l.requests {
		if q.used > l.tick || q.used == 0 {
			return bad("a request used later than the ledger's clock")
		}
	}
	return nil
}

type writer struct{ b []byte }

func (w *writer) u(x uint64) { w.b = binary.AppendUvarint(w.b, x) }
func (w *writer) s(x string) { w.u(uint64(len(x))); w.b = append(w.b, x...) }
func (w *writer) flag(x bool) {
	if x {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

// set writes the count, then each range as (gap from the previous end, length).
func (w *writer) set(s RangeSet) {
	w.u(uint64(s.Len()))
	var prev uint64
	for _, r := range s.r {
		w.u(r.Start - prev)
		w.u(r.End - r.Start)
		prev = r.End
	}
}

// ids writes a count and that many fixed-width hashes.
func (w *writer) ids(xs []uint64) {
	w.u(uint64(len(xs)))
	for _, x := range xs {
		w.b = binary.LittleEndian.AppendUint64(w.b, x)
	}
}

func (w *writer) handle(h *events.SpillHandle) {
	w.s(h.Bucket)
	w.s(h.Name)
	w.s(h.Digest)
	w.u(h.Size)
	w.u(h.Range.Start)
	w.u(h.Range.End)
	w.u(h.Events)
	w.u(h.FirstSeq)
	w.u(h.LastSeq)
	w.flag(h.Previous != nil)
	if h.Previous != nil {
		w.s(*h.Previous)
	}
}

type reader struct {
	b   []byte
	err error
	v   uint64 // the snapshot's version
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorruptSnapshot, what)
	}
	r.b = nil
}

func (r *reader) u() uint64 {
	if r.err != nil {
		return 0
	}
	x, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return x
}

// small reads a number that must not exceed limit.
func (r *reader) small(limit uint64) uint64 {
	x := r.u()
	if x > limit {
		r.fail(fmt.Sprintf("value %d above %d", x, limit))
		return 0
	}
	return x
}

// count reads a length that cannot exceed the bytes left (each item takes at
// least one byte), so hostile input cannot make it allocate without bound.
func (r *reader) count() int {
	x := r.u()
	if x > uint64(len(r.b)) {
		r.fail("count larger than the snapshot")
		return 0
	}
	return int(x)
}

func (r *reader) s() string {
	n := r.count()
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) flag() bool {
	if r.err != nil {
		return false
	}
	if len(r.b) == 0 || r.b[0] > 1 {
		r.fail("bad flag")
		return false
	}
	x := r.b[0] == 1
	r.b = r.b[1:]
	return x
}

func (r *reader) fixed() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("short")
		return 0
	}
	x := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return x
}

// set reads what writer.set wrote and checks that the ranges are sorted,
// disjoint, non-adjacent and non-empty, and bounded by MaxOffset.
func (r *reader) set() RangeSet {
	k := r.count()
	if k == 0 || r.err != nil {
		return RangeSet{}
	}
	out := make([]Range, 0, k)
	var prev uint64
	for i := 0; i < k && r.err == nil; i++ {
		gap, n := r.u(), r.u()
		if (i > 0 && gap == 0) || n == 0 || gap > events.MaxOffset || n > events.MaxOffset || prev+gap+n > events.MaxOffset {
			r.fail("range set out of order or out of bounds")
			break
		}
		start := prev + gap
		out = append(out, Range{Start: start, End: start + n})
		prev = start + n
	}
	return RangeSet{r: out}
}

// ids reads what writer.ids wrote, at most limit hashes; nil for none.
func (r *reader) ids(limit int) []uint64 {
	k := r.count()
	if k > limit {
		r.fail("too many ids")
		return nil
	}
	var out []uint64
	for j := 0; j < k && r.err == nil; j++ {
		out = append(out, r.fixed())
	}
	return out
}

func (r *reader) handle() *events.SpillHandle {
	h := &events.SpillHandle{
		Bucket: r.s(), Name: r.s(), Digest: r.s(), Size: r.u(),
		Range:  Range{Start: r.u(), End: r.u()},
		Events: r.u(), FirstSeq: r.u(), LastSeq: r.u(),
	}
	if r.v >= 2 && r.flag() {
		prev := r.s()
		h.Previous = &prev
	}
	return h
}
