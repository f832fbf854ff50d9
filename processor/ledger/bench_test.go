package ledger

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/seamguard/seamguard/events"
)

// benchLedger builds a session with truncs disjoint truncated ranges and
// commits prior committed compactions, all healthy, and returns it with the
// request that the benchmark decides again and again.
func benchLedger(tb testing.TB, truncs, commits int) (*Ledger, *events.CompactionRequested) {
	var l Ledger
	var seq uint64
	step := func(body any) Result {
		seq++
		ev := &events.Event{ID: fmt.Sprintf("e%d", seq), Source: "urn:bench", Subject: "bench", Body: body, Meta: events.Meta{Seq: seq}}
		res, err := Step(&l, Input{Event: ev}, Config{})
		if err != nil {
			tb.Fatal(err)
		}
		if !res.Accepted || res.Spill != nil {
			tb.Fatalf("setup event %d not plainly accepted: %+v", seq, res)
		}
		return res
	}
	step(&events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 12, Unit: events.UnitTurns}})
	step(&events.TurnAppended{Offset: 0, Size: uint64(2*truncs + 100)})
	healthy := func(id string) *events.CompactionRequested {
		h := l.Head()
		return &events.CompactionRequested{RequestID: id, SummarizerInput: Range{Start: h - 50, End: h}, SummaryRange: Range{End: h - 20}, TailStart: h - 20, CarriesPriorSummary: true}
	}
	first := healthy("c0")
	first.SummarizerInput.Start = 0
	step(first)
	step(&events.CompactionCommitted{RequestID: "c0"})
	for i := 1; i < commits; i++ {
		step(&events.TurnAppended{Offset: l.Head(), Size: 1})
		id := fmt.Sprintf("c%d", i)
		if out := step(healthy(id)).Outputs; len(out) != 1 || out[0].Type != events.TypeCompactionAllowed {
			tb.Fatalf("setup compaction %s not allowed: %+v", id, out)
		}
		step(&events.CompactionCommitted{RequestID: id})
	}
	for i := 0; i < truncs; i++ {
		step(&events.ContextTruncated{Range: Range{Start: uint64(2 * i), End: uint64(2*i + 1)}})
	}
	if l.truncated.Len() != truncs {
		tb.Fatalf("want %d truncated ranges, have %d", truncs, l.truncated.Len())
	}
	return &l, healthy("bench")
}

// stepRequest decides req on l under a fresh event id and fails unless allowed.
func stepRequest(tb testing.TB, l *Ledger, req *events.CompactionRequested, i int) {
	ev := &events.Event{ID: "b" + fmt.Sprint(i), Source: "urn:bench", Subject: "bench", Body: req}
	res, err := Step(l, Input{Event: ev}, Config{})
	if err != nil || len(res.Outputs) != 1 || res.Outputs[0].Type != events.TypeCompactionAllowed {
		tb.Fatalf("bench request not allowed: %v %+v", err, res)
	}
}

// BenchmarkStep decides a compaction request on sessions with 1,000, 10,000
// and 100,000 disjoint truncated ranges and 10,000 prior commits.
func BenchmarkStep(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("truncated=%d", n), func(b *testing.B) {
			l, req := benchLedger(b, n, 10_000)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				stepRequest(b, l, req, i)
			}
		})
	}
}

// BenchmarkStepGrowth measures the 1,000 and 100,000 range sessions in the same
// run, interleaved, and reports their ratio: the target is at most 3.
func BenchmarkStepGrowth(b *testing.B) {
	small, sreq := benchLedger(b, 1_000, 10_000)
	large, lreq := benchLedger(b, 100_000, 10_000)
	var ts, tl time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		stepRequest(b, small, sreq, i)
		t1 := time.Now()
		stepRequest(b, large, lreq, i)
		tl += time.Since(t1)
		ts += t1.Sub(t0)
	}
	b.ReportMetric(float64(ts.Nanoseconds())/float64(b.N), "ns/step@1k")
	b.ReportMetric(float64(tl.Nanoseconds())/float64(b.N), "ns/step@100k")
	b.ReportMetric(float64(tl)/float64(ts), "ratio(100k/1k)")
}

// BenchmarkIdleLedger reports the heap an idle session's ledger holds: opened,
// 300 turns, no truncation. The target is under 512 bytes.
func BenchmarkIdleLedger(b *testing.B) {
	const n = 2_000
	for b.Loop() {
		ledgers := make([]*Ledger, n)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range ledgers {
			l := new(Ledger)
			sid := fmt.Sprintf("session-%06d", i)
			var seq uint64
			step := func(body any) {
				seq++
				ev := &events.Event{ID: "x", Source: "s", Subject: sid, Body: body, Meta: events.Meta{Seq: seq}}
				if _, err := Step(l, Input{Event: ev}, Config{}); err != nil {
					b.Fatal(err)
				}
			}
			step(&events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 12, Unit: events.UnitTurns}})
			for t := range 300 {
				step(&events.TurnAppended{Offset: uint64(t), Size: 1})
			}
			ledgers[i] = l
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/ledger")
		runtime.KeepAlive(ledgers)
	}
}
