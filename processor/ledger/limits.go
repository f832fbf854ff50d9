package ledger

import (
	"errors"
	"fmt"
	"slices"

	"github.com/seamguard/seamguard/events"
)

// Defaults and floors of Limits.
const (
	// DefaultMaxRanges is the most ranges one range set may hold: enough
	// for 100,000 disjoint truncations (about 200 KiB of snapshot), which a
	// request is still decided against in microseconds. The snapshot limit
	// bounds what all the sets hold together.
	DefaultMaxRanges = 100_000
	// DefaultMaxRequests is how many request ids a ledger remembers; the
	// contract asks for at least the 256 most recent, so it is also the
	// least Validate accepts.
	DefaultMaxRequests = 256
	// DefaultMaxSnapshotBytes bounds a snapshot: half of NATS's default
	// max payload (1 MiB), so that the state fits a KV value with room to
	// spare.
	DefaultMaxSnapshotBytes = 512 << 10
	// MinSnapshotBytes is the least MaxSnapshotBytes Validate accepts.
	MinSnapshotBytes = 4 << 10
	// DefaultSpillQuota bounds the bytes of all the spills of one session.
	DefaultSpillQuota = 1 << 30
)

// Limits bound what one session's ledger may hold (docs/contract.md,
// "Bounds and failing closed"). The zero value of each field means its default; Step
// uses what it is given, and Validate refuses what a deployment must not
// run with.
//
// An event that would take the ledger past MaxRanges or MaxSnapshotBytes is
// rejected with state_limit and halts the session (see the package doc). Past
// MaxRequests the least recently used request id is forgotten instead. A
// spill that would take the session past SpillQuota halts it (rule 5).
type Limits struct {
	// MaxRanges is the most ranges any one range set may hold: received,
	// truncated, committed and each request's summary coverage, spilled,
	// waived, pinned, and the unrecoverable ranges of a halt.
	MaxRanges int
	// MaxRequests is how many request ids the ledger remembers, at least
	// DefaultMaxRequests (256).
	MaxRequests int
	// MaxSnapshotBytes bounds the ledger's snapshot (MarshalBinary). The
	// runtime passes the smaller of its configuration and the session
	// bucket's value limit.
	MaxSnapshotBytes int
	// SpillQuota bounds the bytes of all the spills of one session, the sum
	// of their handles' sizes.
	SpillQuota uint64

	// listed is how many ranges an output lists at most (tests lower it);
	// 0 means events.MaxAtRiskRanges.
	listed int
}

// Validate reports every problem of l at once.
func (l Limits) Validate() error {
	var errs []error
	if l.MaxRanges < 0 {
		errs = append(errs, fmt.Errorf("ledger: limits: MaxRanges is %d; use 0 for the default %d, or a positive number", l.MaxRanges, DefaultMaxRanges))
	}
	if l.MaxRequests < 0 || l.MaxRequests > 0 && l.MaxRequests < DefaultMaxRequests {
		errs = append(errs, fmt.Errorf("ledger: limits: MaxRequests is %d; the contract asks for at least %d (0 means %d)", l.MaxRequests, DefaultMaxRequests, DefaultMaxRequests))
	}
	if l.MaxSnapshotBytes < 0 || l.MaxSnapshotBytes > 0 && l.MaxSnapshotBytes < MinSnapshotBytes {
		errs = append(errs, fmt.Errorf("ledger: limits: MaxSnapshotBytes is %d; use at least %d (0 means %d)", l.MaxSnapshotBytes, MinSnapshotBytes, DefaultMaxSnapshotBytes))
	}
	return errors.Join(errs...)
}

// orDefaults returns l with every zero (or negative) field set to its default.
func (l Limits) orDefaults() Limits {
	if l.MaxRanges <= 0 {
		l.MaxRanges = DefaultMaxRanges
	}
	if l.MaxRequests <= 0 {
		l.MaxRequests = DefaultMaxRequests
	}
	if l.MaxSnapshotBytes <= 0 {
		l.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	if l.SpillQuota == 0 {
		l.SpillQuota = DefaultSpillQuota
	}
	if l.listed <= 0 {
		l.listed = events.MaxAtRiskRanges
	}
	return l
}

// The snapshot size is checked without encoding the ledger on every Step:
// the ledger keeps the size it last measured, plus slack, a bound on what
// the Steps since may have added, each Step's share computed before it
// from the ledger and the event. While that estimate stays within the
// limit the Step runs as usual. Otherwise the ledger measures its snapshot
// again, and if the Step may still not fit, it runs on a copy whose
// snapshot is measured; the copy replaces the ledger when it fits. So a
// session pays for encoding only when it comes near its limit, and then
// about once per (limit - size) / growth Steps.
const (
	// rangeBytes bounds one range in a snapshot: two varints of values up
	// to MaxOffset (2^53), 8 bytes each.
	rangeBytes = 16
	// numBytes bounds one varint.
	numBytes = 10
	// fixedBytes bounds all the fixed-size fields together (head,
	// sequences, counters, flags), counted once in the estimate.
	fixedBytes = 160
	// haltReserve is kept free below MaxSnapshotBytes for the halt a
	// state_limit adds (one range more, at most): the snapshot of a halted
	// session stays within the limit.
	haltReserve = 64
	// messageBytes bounds one reason's message.
	messageBytes = 2048
)

func setBytes(ranges int) int { return numBytes + ranges*rangeBytes }

func strBytes(s string) int { return numBytes + len(s) }

// measure records the snapshot's exact size.
func (l *Ledger) measure() int {
	b, _ := l.MarshalBinary()
	l.sized, l.size, l.slack = true, len(b), 0
	return len(b)
}

// roomFor reports whether the snapshot can take n bytes more within
// MaxSnapshotBytes, measuring it only when the estimate cannot tell.
func (l *Ledger) roomFor(n int, lim Limits) bool {
	if !l.sized {
		l.measure()
	}
	if l.size+fixedBytes+l.slack+n <= lim.MaxSnapshotBytes {
		return true
	}
	return l.measure()+n <= lim.MaxSnapshotBytes
}

// fits runs f on the ledger if the snapshot stays within limit after it,
// or does not grow; growth bounds what f may add. ok is false, and the
// ledger unchanged, when f would take the snapshot past limit; size is
// then the size it would have had.
func (l *Ledger) fits(limit, growth int, f func(*Ledger) Result) (res Result, ok bool, size int) {
	if !l.sized || l.slack > 0 && l.size+fixedBytes+l.slack+growth > limit {
		l.measure() // the slack may be what is in the way
	}
	if l.size+fixedBytes+l.slack+growth <= limit {
		res = f(l)
		l.slack += growth
		return res, true, 0
	}
	before, _ := l.MarshalBinary()
	var c Ledger
	if err := c.UnmarshalBinary(before); err != nil {
		// Cannot happen: every snapshot a ledger writes reads back (the
		// property and fuzz tests hold it to that). Fail closed.
		l.sized, l.size, l.slack = true, len(before), 0
		return Result{}, false, len(before)
	}
	res = f(&c)
	after, _ := c.MarshalBinary()
	if len(after) <= limit || len(after) <= len(before) {
		*l = c
		l.sized, l.size, l.slack = true, len(after), 0
		return res, true, len(after)
	}
	l.sized, l.size, l.slack = true, len(before), 0
	return Result{}, false, len(after)
}

// growth bounds how many bytes applying ev can add to the snapshot, the
// fixed-size fields aside.
func (l *Ledger) growth(ev *events.Event) int {
	g := 0
	if l.session == "" {
		g += strBytes(ev.Subject)
	}
	switch b := ev.Body.(type) {
	case *events.TurnAppended:
		g += rangeBytes + 1
		if b.Pinned {
			g += rangeBytes + 1
		}
	case *events.ContextTruncated:
		g += rangeBytes + 1
	case *events.ContextPinned:
		// At most one range more for every received range it overlaps.
		g += l.received.overlapping(b.Range)*rangeBytes + numBytes
	case *events.ContextUnpinned:
		g += rangeBytes + 1 // a pinned range split in two
	case *events.CompactionRequested:
		g += l.recordGrowth(b.RequestID, 0) // refused under rule 1 (see requestGrowth)
	case *events.CompactionCommitted:
		g += 8 + 1
		if rec := l.requests[b.RequestID]; rec != nil {
			g += setBytes(rec.coverage.Len())
		}
	case *events.SessionResumed:
		g += 8 + 1
		if l.halt != nil {
			g += setBytes(l.halt.Len())
		}
	}
	return g
}

// recordGrowth bounds what remembering a request adds: its key, flags,
// coverage, an event id, its use stamp, and the hash of an id forgotten for
// it.
func (l *Ledger) recordGrowth(id string, coverage int) int {
	return strBytes(id) + 2 + setBytes(coverage) + 8 + 2 + numBytes + 8
}

// evaluates reports whether a request would be decided under rules 2 to 5,
// its checks run: the session open, not halted, the request valid and no
// duplicate.
func (l *Ledger) evaluates(b *events.CompactionRequested, h uint64) bool {
	if l.status != statusOpen || l.invalid(b) != "" {
		return false
	}
	rec := l.requests[b.RequestID]
	return rec == nil || !slices.Contains(rec.ids, h)
}

// prejudge evaluates a request that evaluates says will be decided, before
// it is applied: what it may add to the snapshot follows from that, and the
// decision then uses it rather than evaluating again.
func (l *Ledger) prejudge(b *events.CompactionRequested) *prejudged {
	e := l.Evaluate(b)
	return &prejudged{e: e, rest: Diff(Diff(e.AtRisk, l.spilled), l.waived)}
}

// prejudged is a request's evaluation and the at-risk offsets that no spill
// or waiver covers (rule 3), against the ledger as it stands.
type prejudged struct {
	e    Evaluation
	rest RangeSet
}

// requestGrowth bounds what deciding a request adds: its record with the
// summary coverage, and, when rule 3 does not allow it, the pending
// refusal of a spill (its reasons cut short, all its at-risk ranges) or the
// ranges of a halt.
func (l *Ledger) requestGrowth(b *events.CompactionRequested, ev *events.Event, p *prejudged, lim Limits) int {
	g := l.recordGrowth(b.RequestID, p.e.Coverage.Len())
	if p.rest.IsEmpty() {
		return g // rules 2 and 3: allowed
	}
	listed := 0
	pending := 1 + strBytes(ev.ID) + strBytes(ev.Source) + strBytes(ev.Meta.Subject) + numBytes + strBytes(b.RequestID) + numBytes +
		setBytes(p.e.AtRisk.Len())
	for _, r := range p.e.Reasons {
		pending += strBytes(string(r.Code)) + strBytes(r.Message) + numBytes + 1 + 2*numBytes
		listed += len(r.AtRisk)
	}
	pending += min(listed, lim.listed) * rangeBytes
	halt := 1 + strBytes(b.RequestID) + setBytes(p.rest.Len())
	return g + max(pending, halt)
}

// spillGrowth bounds what a spill result can add: its handle, the spilled
// set, or a halt.
func (l *Ledger) spillGrowth(r *SpillResult) int {
	h := r.Handle
	g := strBytes(h.Bucket) + strBytes(h.Name) + strBytes(h.Digest) + 6*numBytes + 1 + setBytes(l.received.Len())
	if l.lastSpill != nil {
		g += strBytes(l.lastSpill.Name)
	}
	if p := l.pending; p != nil {
		g += 1 + strBytes(p.requestID) + setBytes(p.atRisk.Len()+l.spilled.Len()+l.waived.Len())
	}
	return g
}

// concerned returns the offsets an event that hit a limit concerned: a
// turn's or a truncation's range, else the whole transcript [0, head).
func (l *Ledger) concerned(ev *events.Event) RangeSet {
	switch b := ev.Body.(type) {
	case *events.TurnAppended:
		if b.Size > 0 && b.Offset <= events.MaxOffset && b.Size <= events.MaxOffset-b.Offset {
			return NewRangeSet(Range{Start: b.Offset, End: b.Offset + b.Size})
		}
	case *events.ContextTruncated:
		if !b.Range.Empty() {
			return NewRangeSet(b.Range)
		}
	case *events.ContextPinned:
		if !b.Range.Empty() {
			return NewRangeSet(b.Range)
		}
	case *events.ContextUnpinned:
		if !b.Range.Empty() {
			return NewRangeSet(b.Range)
		}
	}
	return NewRangeSet(Range{Start: 0, End: l.head})
}

// limitHit rejects ev with state_limit and halts the session at once: the
// offsets it concerned (added to those of a halt already in force) are
// unrecoverable until an operator resumes it. field names the set or the
// limit, what says how the event would exceed it.
func (l *Ledger) limitHit(ev *events.Event, field, what string, concerned RangeSet, lim Limits) Result {
	c := events.CauseOf(ev)
	rej := Rejection(c, ev.Subject, events.Errorf(events.CodeStateLimit, field,
		"%s; seamguard can no longer vouch for session %q and halts it: offsets %s are treated as unrecoverable. An operator must publish io.seamguard.session.resumed on the session's control subject (seamguard resume) to accept them as lost; see the ledger's limits",
		what, events.Excerpt(ev.Subject), FormatRanges(concerned.Ranges())))
	if l.status == statusNew || l.status == statusClosed {
		return Result{Outputs: []events.Output{rej}} // there is no session to halt
	}
	lost := concerned
	if l.halt != nil {
		// A halt in force gains the event's offsets. The halt kept free
		// room for one range (haltReserve); past that, the halt names the
		// hull of its offsets rather than take the snapshot past its limit.
		lost = Union(*l.halt, concerned)
		if lost.Len() > l.halt.Len() && !l.roomFor(rangeBytes+1, lim) {
			lost = NewRangeSet(Range{Start: lost.Ranges()[0].Start, End: lost.Max()})
		}
	}
	return Result{Outputs: []events.Output{rej, l.halted(c, "", lost, what, lim)}}
}

// cutRanges returns at most limit ranges of rs, with the count of them all
// when it cut.
func cutRanges(rs []Range, limit int) ([]Range, *events.AtRiskTotal) {
	if len(rs) <= limit {
		return nonNil(rs), nil
	}
	total := &events.AtRiskTotal{Ranges: uint64(len(rs))}
	for _, r := range rs {
		total.Units += r.Len()
	}
	return slices.Clone(rs[:limit]), total
}

// cutReasons bounds the at-risk lists of an output's reasons: together at
// most limit (MaxAtRiskRanges) ranges, shared out so that a reason with few
// ranges lists them all and the rest is split evenly. A reason cut short
// says so.
func cutReasons(rs []events.Reason, limit int) []events.Reason {
	total := 0
	for _, r := range rs {
		total += len(r.AtRisk)
	}
	out := slices.Clone(rs)
	if total <= limit {
		return out
	}
	order := make([]int, len(rs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return len(rs[a].AtRisk) - len(rs[b].AtRisk) })
	left := limit
	for k, i := range order {
		share := min(len(rs[i].AtRisk), left/(len(order)-k))
		left -= share
		if cut, t := cutRanges(rs[i].AtRisk, share); t != nil {
			out[i].AtRisk, out[i].AtRiskTruncated, out[i].AtRiskTotal = cut, true, t
		}
	}
	return out
}
