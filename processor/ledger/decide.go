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
	h := l.head
	T := l.truncated
	whole := Range{Start: 0, End: h}
	in := Range{Start: min(b.SummarizerInput.Start, h), End: min(b.SummarizerInput.End, h)} // I
	tail := Range{Start: min(b.TailStart, h), End: h}
	floor := Range{Start: h - min(l.span, h), End: h}                               // F
	reach := Range{Start: b.TailStart - min(l.span, b.TailStart), End: b.TailStart} // reach
	S := b.SummaryRange

	// R = tail \ T; F \ I' = (F \ I) ∪ (F ∩ I ∩ T), likewise for reach.
	R := RangeDiff(tail, T)
	notInInput := func(w Range) RangeSet {
		out := RangeDiff(w, NewRangeSet(in))
		out.AddSet(T.Within(intersect(w, in)))
		return out
	}
	// C = ((S ∩ I) \ T) ∪ (S ∩ K'), K' = K when the request carries it.
	C := RangeDiff(intersect(S, in), T)
	if b.CarriesPriorSummary {
		C.AddSet(l.committed.Within(S))
	}

	// N \ (R ∪ carried): the pinned offsets before the tail, and those in
	// it that are truncated, minus the carried ones.
	dropped := l.pinned.Within(Range{Start: 0, End: tail.Start})
	dropped.AddSet(Intersect(l.pinned.Within(tail), T))
	if !dropped.IsEmpty() && len(b.CarriedPins) > 0 {
		dropped = Diff(dropped, NewRangeSet(b.CarriedPins...))
	}

	var e Evaluation
	fail := func(code events.ReasonCode, risk RangeSet, msg string) {
		e.Reasons = append(e.Reasons, events.Reason{Code: code, Message: msg, AtRisk: nonNil(risk.Ranges())})
		if code == events.ReasonPinDropped {
			e.Dropped = risk
		} else {
			e.AtRisk.AddSet(risk)
		}
	}
	unit, floorUnit := l.unit.unit(), l.floorUnit.unit()
	// Reasons are appended in the order of their codes.
	if risk := RangeDiff(whole, Union(C, R)); !risk.IsEmpty() {
		fail(events.ReasonCoverageHole, risk, coverageHoleMessage(risk, C, T.Within(whole), l.committed, b.CarriesPriorSummary))
	}
	if risk := notInInput(floor); !risk.IsEmpty() {
		fail(events.ReasonFloorNotInInput, risk, fmt.Sprintf(
			"the recovery floor [%d, %d) is not all in the summarizer's input: offsets %s are outside it or truncated; give the summarizer every turn of the floor",
			floor.Start, floor.End, FormatRanges(risk.Ranges())))
	}
	if risk := RangeDiff(floor, R); !risk.IsEmpty() {
		fail(events.ReasonFloorNotInTail, risk, fmt.Sprintf(
			"the recovery floor [%d, %d) is not all in the retained tail from %d: offsets %s are before the tail or truncated; keep the last %d %s verbatim",
			floor.Start, floor.End, b.TailStart, FormatRanges(risk.Ranges()), l.span, floorUnit))
	}
	if !dropped.IsEmpty() {
		fail(events.ReasonPinDropped, dropped, fmt.Sprintf(
			"pinned offsets %s would leave the working context: they are neither in the retained tail from %d (truncated offsets are not in it) nor in carried_pins. Put them back verbatim: send the compaction again with \"carried_pins\": %s. Unpin them with io.seamguard.context.unpinned once they no longer bind the agent. A spill does not cure this: it keeps the transcript, not the context",
			FormatRanges(dropped.Ranges()), b.TailStart, jsonRanges(dropped.Ranges())))
	}
	if risk := notInInput(reach); !risk.IsEmpty() {
		fail(events.ReasonReachNotInInput, risk, fmt.Sprintf(
			"the summarizer's input does not reach back %d %s before the tail start %d: offsets %s are outside it or truncated; start the summarizer's input at %d or earlier, with those turns present",
			l.span, floorUnit, b.TailStart, FormatRanges(risk.Ranges()), reach.Start))
	}
	if S.End < b.TailStart {
		risk := NewRangeSet(Range{Start: S.End, End: b.TailStart})
		fail(events.ReasonSeamGap, risk, fmt.Sprintf(
			"the summary ends at %d but the tail starts at %d: offsets %s fall in the seam between them; end the summary at the tail start",
			S.End, b.TailStart, FormatRanges(risk.Ranges())))
	}
	if risk := RangeDiff(whole, l.received); !risk.IsEmpty() {
		fail(events.ReasonSequenceGap, risk, fmt.Sprintf(
			"offsets %s were never received; publish the missing turns before compacting",
			FormatRanges(risk.Ranges())))
	}
	if unit != floorUnit {
		risk := NewRangeSet(whole)
		fail(events.ReasonUnitMismatch, risk, fmt.Sprintf(
			"the recovery floor counts %s but the session's truncator evicts %s, so the floor cannot be enforced and offsets %s are at risk; open the session with a floor in %s",
			floorUnit, unit, FormatRanges(risk.Ranges()), unit))
	}
	e.Coverage = C
	return e
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
