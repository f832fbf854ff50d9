package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/seedref"
	"github.com/seamguard/seamguard/processor/ledger"
)

// DecisionResult is the cost of deciding one compaction request as the
// session's truncated ranges grow, for the ledger's Step and for the seed's
// reference check, which scans every prior truncation (and checks less).
type DecisionResult struct {
	Points []DecisionPoint `json:"points"`
}

// DecisionPoint is one session size.
type DecisionPoint struct {
	Truncated int     `json:"truncated_ranges"`
	StepNs    float64 `json:"step_ns"`      // ledger.Step of an allowed request
	ScanNs    float64 `json:"seed_scan_ns"` // the seed's check of the same request
	SnapBytes int     `json:"snapshot_bytes"`
}

func runDecision(ctx context.Context, sizes []int, each time.Duration) (*DecisionResult, error) {
	res := &DecisionResult{}
	for _, n := range sizes {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		l, req, prior, err := decisionLedger(n)
		if err != nil {
			return res, err
		}
		pt := DecisionPoint{Truncated: n}
		snap, err := l.MarshalBinary()
		if err != nil {
			return res, err
		}
		pt.SnapBytes = len(snap)
		i := 0
		pt.StepNs, err = timeIt(each, func() error {
			i++
			ev := &events.Event{ID: fmt.Sprintf("b%d", i), Source: "urn:bench", Subject: "bench", Type: events.TypeCompactionRequested, Body: req}
			out, err := ledger.Step(l, ledger.Input{Event: ev}, ledger.Config{})
			if err != nil {
				return err
			}
			if len(out.Outputs) != 1 || out.Outputs[0].Type != events.TypeCompactionAllowed {
				return fmt.Errorf("bench: the decision benchmark's request was not allowed: %+v", out.Outputs)
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		pt.ScanNs, err = timeIt(each, func() error {
			if r := seedref.Check(int64(req.SummarizerInput.Start), int64(req.TailStart), 12, prior, events.UnitTurns, events.UnitTurns); r != "" {
				return fmt.Errorf("bench: the seed's check refused the benchmark's request: %s", r)
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		res.Points = append(res.Points, pt)
	}
	return res, nil
}

// timeIt calls f repeatedly for about d and returns its mean time in ns.
func timeIt(d time.Duration, f func() error) (float64, error) {
	var n int
	start := time.Now()
	for batch := 1; ; batch *= 2 {
		for range batch {
			if err := f(); err != nil {
				return 0, err
			}
		}
		n += batch
		if el := time.Since(start); el >= d {
			return float64(el.Nanoseconds()) / float64(n), nil
		}
	}
}

// decisionLedger builds a session with n disjoint truncated ranges, all of
// them inside a committed summary, and returns it with a healthy request
// and the truncations as the seed's check keeps them.
func decisionLedger(n int) (*ledger.Ledger, *events.CompactionRequested, []events.Range, error) {
	var l ledger.Ledger
	var seq uint64
	step := func(typ string, body any) error {
		seq++
		ev := &events.Event{ID: fmt.Sprintf("e%d", seq), Source: "urn:bench", Subject: "bench", Type: typ, Body: body, Meta: events.Meta{Seq: seq}}
		res, err := ledger.Step(&l, ledger.Input{Event: ev}, ledger.Config{})
		if err != nil {
			return err
		}
		if !res.Accepted || res.Spill != nil {
			return fmt.Errorf("bench: setup event %d (%s) was not plainly accepted", seq, typ)
		}
		return nil
	}
	healthy := func(id string) *events.CompactionRequested {
		h := l.Head()
		return &events.CompactionRequested{RequestID: id, SummarizerInput: events.Range{Start: h - 50, End: h},
			SummaryRange: events.Range{End: h - 20}, TailStart: h - 20, CarriesPriorSummary: true}
	}
	if err := step(events.TypeSessionOpened, &events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 12, Unit: events.UnitTurns}}); err != nil {
		return nil, nil, nil, err
	}
	if err := step(events.TypeTurnAppended, &events.TurnAppended{Offset: 0, Size: uint64(2*n + 100)}); err != nil {
		return nil, nil, nil, err
	}
	first := healthy("c0")
	first.SummarizerInput.Start = 0
	if err := step(events.TypeCompactionRequested, first); err != nil {
		return nil, nil, nil, err
	}
	if err := step(events.TypeCompactionCommitted, &events.CompactionCommitted{RequestID: "c0"}); err != nil {
		return nil, nil, nil, err
	}
	prior := make([]events.Range, 0, n)
	for i := range n {
		r := events.Range{Start: uint64(2 * i), End: uint64(2*i + 1)}
		if err := step(events.TypeContextTruncated, &events.ContextTruncated{Range: r}); err != nil {
			return nil, nil, nil, err
		}
		prior = append(prior, r)
	}
	return &l, healthy("bench"), prior, nil
}
