package ledger

import (
	"fmt"
	"strings"

	"github.com/seamguard/seamguard/events"
)

// Evaluation is the outcome of the checks of docs/contract.md for one
// compaction request against the ledger as it stands, before rules 2 to 5.
type Evaluation struct {
	Reasons []events.Reason // failed checks, sorted by code
	// AtRisk is the union of the at-risk ranges of every failed check but
	// pin_dropped: what rules 3 to 5 are about.
	AtRisk   RangeSet
	Dropped  RangeSet // pin_dropped's at-risk: N \ (R ∪ carried)
	Coverage RangeSet // C: the summary coverage this compaction would commit
}

// Evaluate runs every check on a request that passed rule 1 (see invalid). It
// does not change the ledger. Its cost is O(log n) in the number of ranges of
// the ledger, plus the size of what it reports: it never walks the truncated
// set, only looks up the windows the checks are about.
func (l *Ledger) Evaluate(b *events.CompactionRequested) Evaluation {
	w := l.windowsOf(b)
	var e Evaluation
	// Reasons are appended in the order of their codes.
	l.checkHeld(&e, b, w)
	l.checkSequence(&e, b, w)
	e.Coverage = w.C
	return e
}

// windows are the offsets one request's checks are about (the names are
// docs/contract.md's), computed once.
type windows struct {
	whole, in, tail, floor, reach, S Range
	T                                RangeSet // truncated
	R                                RangeSet // the retained tail: tail \ T
	C                                RangeSet // the coverage this compaction would commit
	dropped                          RangeSet // N \ (R ∪ carried)
}

func (l *Ledger) windowsOf(b *events.CompactionRequested) windows {
	h := l.head
	w := windows{
		whole: Range{Start: 0, End: h},
		in:    Range{Start: min(b.SummarizerInput.Start, h), End: min(b.SummarizerInput.End, h)}, // I
		tail:  Range{Start: min(b.TailStart, h), End: h},
		floor: Range{Start: h - min(l.span, h), End: h},                               // F
		reach: Range{Start: b.TailStart - min(l.span, b.TailStart), End: b.TailStart}, // reach
		S:     b.SummaryRange,
		T:     l.truncated,
	}
	w.R = RangeDiff(w.tail, w.T)
	// C = ((S ∩ I) \ T) ∪ (S ∩ K'), K' = K when the request carries it.
	w.C = RangeDiff(intersect(w.S, w.in), w.T)
	if b.CarriesPriorSummary {
		w.C.AddSet(l.committed.Within(w.S))
	}
	// N \ (R ∪ carried): the pinned offsets before the tail, and those in
	// it that are truncated, minus the carried ones.
	w.dropped = l.pinned.Within(Range{Start: 0, End: w.tail.Start})
	w.dropped.AddSet(Intersect(l.pinned.Within(w.tail), w.T))
	if !w.dropped.IsEmpty() && len(b.CarriedPins) > 0 {
		w.dropped = Diff(w.dropped, NewRangeSet(b.CarriedPins...))
	}
	return w
}

// notInInput is x \ I' for a window x: (x \ I) ∪ (x ∩ I ∩ T).
func (w windows) notInInput(x Range) RangeSet {
	out := RangeDiff(x, NewRangeSet(w.in))
	out.AddSet(w.T.Within(intersect(x, w.in)))
	return out
}

// fail records a failed check and its offsets at risk.
func (e *Evaluation) fail(code events.ReasonCode, risk RangeSet, msg string) {
	e.Reasons = append(e.Reasons, events.Reason{Code: code, Message: msg, AtRisk: nonNil(risk.Ranges())})
	if code == events.ReasonPinDropped {
		e.Dropped = risk
	} else {
		e.AtRisk.AddSet(risk)
	}
}

// checkHeld runs the checks of what holds each offset after the compaction
// (coverage_hole to reach_not_in_input, in the order of their codes).
func (l *Ledger) checkHeld(e *Evaluation, b *events.CompactionRequested, w windows) {
	floorUnit := l.floorUnit.unit()
	if risk := RangeDiff(w.whole, Union(w.C, w.R)); !risk.IsEmpty() {
		e.fail(events.ReasonCoverageHole, risk, coverageHoleMessage(risk, w.C, w.T.Within(w.whole), l.committed, b.CarriesPriorSummary))
	}
	if risk := w.notInInput(w.floor); !risk.IsEmpty() {
		e.fail(events.ReasonFloorNotInInput, risk, fmt.Sprintf(
			"the recovery floor [%d, %d) is not all in the summarizer's input: offsets %s are outside it or truncated; give the summarizer every turn of the floor",
			w.floor.Start, w.floor.End, FormatRanges(risk.Ranges())))
	}
	if risk := RangeDiff(w.floor, w.R); !risk.IsEmpty() {
		e.fail(events.ReasonFloorNotInTail, risk, fmt.Sprintf(
			"the recovery floor [%d, %d) is not all in the retained tail from %d: offsets %s are before the tail or truncated; keep the last %d %s verbatim",
			w.floor.Start, w.floor.End, b.TailStart, FormatRanges(risk.Ranges()), l.span, floorUnit))
	}
	if !w.dropped.IsEmpty() {
		e.fail(events.ReasonPinDropped, w.dropped, fmt.Sprintf(
			"pinned offsets %s would leave the working context: they are neither in the retained tail from %d (truncated offsets are not in it) nor in carried_pins. Put them back verbatim: send the compaction again with \"carried_pins\": %s. Unpin them with io.seamguard.context.unpinned once they no longer bind the agent. A spill does not cure this: it keeps the transcript, not the context",
			FormatRanges(w.dropped.Ranges()), b.TailStart, jsonRanges(w.dropped.Ranges())))
	}
	if risk := w.notInInput(w.reach); !risk.IsEmpty() {
		e.fail(events.ReasonReachNotInInput, risk, fmt.Sprintf(
			"the summarizer's input does not reach back %d %s before the tail start %d: offsets %s are outside it or truncated; start the summarizer's input at %d or earlier, with those turns present",
			l.span, floorUnit, b.TailStart, FormatRanges(risk.Ranges()), w.reach.Start))
	}
}

// checkSequence runs the checks of the request's and the session's
// sequence of offsets (seam_gap, sequence_gap, unit_mismatch).
func (l *Ledger) checkSequence(e *Evaluation, b *events.CompactionRequested, w windows) {
	if w.S.End < b.TailStart {
		risk := NewRangeSet(Range{Start: w.S.End, End: b.TailStart})
		e.fail(events.ReasonSeamGap, risk, fmt.Sprintf(
			"the summary ends at %d but the tail starts at %d: offsets %s fall in the seam between them; end the summary at the tail start",
			w.S.End, b.TailStart, FormatRanges(risk.Ranges())))
	}
	if risk := RangeDiff(w.whole, l.received); !risk.IsEmpty() {
		e.fail(events.ReasonSequenceGap, risk, fmt.Sprintf(
			"offsets %s were never received; publish the missing turns before compacting",
			FormatRanges(risk.Ranges())))
	}
	if unit, floorUnit := l.unit.unit(), l.floorUnit.unit(); unit != floorUnit {
		risk := NewRangeSet(w.whole)
		e.fail(events.ReasonUnitMismatch, risk, fmt.Sprintf(
			"the recovery floor counts %s but the session's truncator evicts %s, so the floor cannot be enforced and offsets %s are at risk; open the session with a floor in %s",
			floorUnit, unit, FormatRanges(risk.Ranges()), unit))
	}
}

// coverageHoleMessage says why offsets risk are in neither the coverage C
// nor the tail, and the way out that works for each cause: offsets
// truncated before any summary covered them can no longer be summarized (a
// truncated offset is never in the summarizer's effective input), so only a
// spill (and the same request again) or a prior summary that covers them
// helps; the others can still be put in the summarizer's input and the
// summary range.
func coverageHoleMessage(risk, C, truncated, committed RangeSet, carries bool) string {
	lost := Intersect(risk, truncated)
	rest := Diff(risk, lost)
	var b strings.Builder
	fmt.Fprintf(&b, "offsets %s are in neither the summary's coverage %s nor the retained tail, so nothing would hold them after this compaction",
		FormatRanges(risk.Ranges()), FormatRanges(C.Ranges()))
	if !lost.IsEmpty() {
		fmt.Fprintf(&b, ". Of them, %s were evicted by context.truncated (truncated %s) before any summary covered them; a truncated offset is never in the summarizer's input, so no summary can cover them now",
			FormatRanges(lost.Ranges()), FormatRanges(truncated.Ranges()))
		if k := Intersect(lost, committed); !k.IsEmpty() && !carries {
			fmt.Fprintf(&b, ". The committed summary covers %s: if the new summary carries it, set carries_prior_summary", FormatRanges(k.Ranges()))
		}
		b.WriteString(". The way out is the transcript: when this refusal holds a spill (next: retry), the spill keeps them recoverable, so send the same request again; when no spill can be written, the session halts")
	}
	if !rest.IsEmpty() {
		fmt.Fprintf(&b, ". Offsets %s can still be summarized: put them in the summarizer's input and the summary range, or carry a prior summary that covers them", FormatRanges(rest.Ranges()))
	} else if lost.IsEmpty() {
		b.WriteString("; put them in the summarizer's input and the summary range, or carry a prior summary that covers them")
	}
	return b.String()
}

func intersect(a, b Range) Range {
	r := Range{Start: max(a.Start, b.Start), End: min(a.End, b.End)}
	if r.End < r.Start {
		r.End = r.Start
	}
	return r
}

// jsonRanges writes ranges as a JSON list, the way carried_pins takes them;
// past maxListed it lists the first ones and says how many more at_risk
// names.
func jsonRanges(rs []Range) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, r := range rs {
		if i == maxListed {
			fmt.Fprintf(&b, ", ...] (and %d more ranges: every range of at_risk)", len(rs)-maxListed)
			return b.String()
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"start": %d, "end": %d}`, r.Start, r.End)
	}
	b.WriteByte(']')
	return b.String()
}
