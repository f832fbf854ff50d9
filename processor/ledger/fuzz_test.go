package ledger

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/seamguard/seamguard/events"
)

// FuzzStep reads the fuzz bytes as a session: the first byte picks when a twin
// is restored from a snapshot, the rest are the choices of the generator of
// property_test.go (which event comes next, its offsets and ranges, whether a
// spill fails). The script is stepped through the core and the oracle with
// every check of the property test: no panic, no error while the protocol is
// followed, the same outputs as the oracle, RangeSets in their canonical form,
// head == received.Max(), truncated and spilled within [0, head), every
// allowed leaving [0, head) inside C ∪ R ∪ P ∪ W, events that are not
// accepted leaving the snapshot as it was, snapshots that round-trip and a
// restored twin that carries on identically.
func FuzzStep(f *testing.F) {
	for i := range 24 {
		r := rand.New(rand.NewPCG(0xf022, uint64(i)))
		c := &orcRandChooser{r: r}
		orcGenerate(c, "fz", 8+r.IntN(50))
		f.Add(append([]byte{byte(r.IntN(40))}, c.rec...))
	}
	f.Add([]byte{})
	f.Add([]byte{3, 1, 0, 0, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		twin := 0
		if len(data) > 0 {
			twin, data = int(data[0]), data[1:]
		}
		script, cfg := orcGenerate(&orcByteChooser{b: data}, "fz", 500)
		if _, fail := orcRun(script, orcRunOpts{cfg: cfg, twinAt: twin}); fail != "" {
			t.Fatalf("%s\nscript: %s", fail, orcDescribeAll(script, cfg))
		}
	})
}

// FuzzSnapshot feeds arbitrary bytes to UnmarshalBinary: it must never panic;
// what it accepts (versions 1 to the current one) must re-encode to bytes
// that decode to the same ledger and encode identically again, and Step
// must not panic on it. The seeds hold spill chains, forgotten request ids
// and pending refusals with cut lists (orcSession's limits), pinned sets,
// and the version-1 and version-2 fixtures.
func FuzzSnapshot(f *testing.F) {
	var zero Ledger
	b, _ := zero.MarshalBinary()
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0})
	// Version-1 and version-2 snapshots, which load as the current version.
	v1, _ := filepath.Glob(filepath.Join("testdata", "snapshot-v[12]", "*.snap"))
	for _, name := range v1 {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// A spill chain, forgotten request ids and a pending refusal with its
	// lists cut short.
	{
		s := &orcBuilder{session: "chain"}
		s.open(events.UnitTurns, events.UnitTurns, 2)
		s.turns(0, 10)
		s.truncate(0, 2)
		s.request("a", Range{Start: 2, End: 10}, Range{Start: 2, End: 8}, 8, false)
		s.request("b", Range{Start: 0, End: 10}, Range{Start: 0, End: 8}, 8, false)
		s.turns(10, 14)
		s.truncate(4, 5)
		s.truncate(12, 13)
		s.request("c", Range{Start: 5, End: 14}, Range{Start: 5, End: 12}, 12, false)
		s.add(events.TypeContextPinned, &events.ContextPinned{Range: Range{Start: 1, End: 6}})
		s.add(events.TypeTurnAppended, &events.TurnAppended{Offset: 14, Size: 1, Pinned: true})
		s.request("d", Range{Start: 5, End: 15}, Range{Start: 5, End: 13}, 13, false)
		cfg := Config{Limits: Limits{MaxRequests: 1, listed: 1}}
		var l Ledger
		for _, it := range s.items {
			res, err := Step(&l, Input{Event: it.ev}, cfg)
			if err != nil {
				f.Fatal(err)
			}
			if res.Spill != nil {
				snap, _ := l.MarshalBinary()
				f.Add(snap)
				if _, err := Step(&l, Input{Spill: &SpillResult{Handle: events.SpillHandle{Name: res.Spill.Name, Range: res.Spill.Range,
					Size: 10, Events: res.Spill.Events, FirstSeq: res.Spill.FirstSeq, LastSeq: res.Spill.LastSeq}}}, cfg); err != nil {
					f.Fatal(err)
				}
			}
		}
		if l.spills < 2 || l.forgottenAll == 0 {
			f.Fatalf("the chain seed has %d spills and %d forgotten ids", l.spills, l.forgottenAll)
		}
		snap, _ := l.MarshalBinary()
		f.Add(snap)
	}
	// Snapshots from a few generated sessions, including pending spills,
	// halts, waivers and closed sessions.
	for i := range 6 {
		script, opts := orcSession(2_000_000 + i)
		var l Ledger
		for j, it := range script {
			res, err := Step(&l, Input{Event: it.ev}, opts.cfg)
			if err != nil {
				f.Fatal(err)
			}
			if res.Spill != nil {
				if j%3 == 0 {
					snap, _ := l.MarshalBinary()
					f.Add(snap)
				}
				if _, err := Step(&l, Input{Spill: &SpillResult{Handle: events.SpillHandle{Name: res.Spill.Name, Range: res.Spill.Range,
					Size: 100 * res.Spill.Events, LastSeq: res.Spill.LastSeq}, Failure: it.spillFail, OverQuota: it.overQuota}}, opts.cfg); err != nil {
					f.Fatal(err)
				}
			}
			if j%7 == 0 || j == len(script)-1 {
				snap, _ := l.MarshalBinary()
				f.Add(snap)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var l Ledger
		if err := l.UnmarshalBinary(data); err != nil {
			return
		}
		b1, err := l.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary of a decoded ledger: %v", err)
		}
		var l2 Ledger
		if err := l2.UnmarshalBinary(b1); err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
		if !reflect.DeepEqual(l, l2) {
			t.Fatalf("re-encoded snapshot decodes to another ledger:\n%+v\n%+v", l, l2)
		}
		b2, _ := l2.MarshalBinary()
		if !bytes.Equal(b1, b2) {
			t.Fatalf("re-encoding is not stable:\n%x\n%x", b1, b2)
		}
		// A decoded ledger must be one Step can work on.
		session := l.Session()
		if session == "" {
			session = "fz"
		}
		seq := uint64(1 << 40)
		step := func(in Input) {
			_, _ = Step(&l, in, Config{Policy: Policy(len(data) % 2)})
		}
		if l.Pending() {
			step(Input{Spill: &SpillResult{Handle: events.SpillHandle{Name: "x", Range: Range{Start: 0, End: l.Head()}}}})
		}
		h := l.Head()
		for i, body := range []any{
			&events.TurnAppended{Offset: h, Size: 1, Pinned: true},
			&events.ContextPinned{Range: Range{Start: 0, End: h / 3}},
			&events.ContextTruncated{Range: Range{Start: 0, End: h / 2}},
			&events.CompactionRequested{RequestID: "fz", SummarizerInput: Range{Start: 0, End: h}, SummaryRange: Range{Start: 0, End: h / 2}, TailStart: h / 2},
			&events.CompactionCommitted{RequestID: "fz"},
			&events.SessionResumed{Note: "fuzz"},
			&events.CompactionRequested{RequestID: "fz", SummarizerInput: Range{Start: 0, End: h}, SummaryRange: Range{Start: 0, End: h / 2}, TailStart: h / 2},
			&events.ContextUnpinned{Range: Range{Start: 0, End: h}},
		} {
			seq++
			step(Input{Event: &events.Event{ID: fmt.Sprintf("fz-%d", i), Source: "fz", Subject: session, Body: body, Meta: events.Meta{Seq: seq, Control: onControl(body)}}})
			if l.Pending() {
				step(Input{Spill: &SpillResult{Failure: "fz"}})
			}
		}
		if _, err := l.MarshalBinary(); err != nil {
			t.Fatalf("MarshalBinary after stepping a decoded ledger: %v", err)
		}
	})
}
