package inspect

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const storiesDir = "../testdata/stories"

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			out = append(out, bytes.Clone(sc.Bytes()))
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./inspect -update")
	assert.Equal(t, string(want), got, "output differs from %s; if the change is deliberate, rerun with -update", path)
}

// story is a shipped story decided offline with the Deriver: each line is a
// structured CloudEvent published on its session's subject (a resume on its
// control subject), its sequence
// its line number, and spill outcomes are those of the story's golden
// check output.
type story struct {
	d        *Deriver
	outputs  [][]byte // every derived output, encoded as check encodes it
	verdicts []*events.Verdict
	session  string
	carried  map[string][]Range // carried_pins by request event id
}

func deriveStory(t *testing.T, name string) *story {
	t.Helper()
	recorded := readLines(t, filepath.Join(storiesDir, "golden", name+".out.jsonl"))
	o := &Outcomes{}
	for _, l := range recorded {
		v, err := events.DecodeVerdict(l)
		require.NoError(t, err)
		o.Add(v)
	}
	st := &story{d: &Deriver{Spill: func(_ context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
		r, ok := o.Answer(req)
		if !ok {
			return r, fmt.Errorf("no recorded outcome for %s", req.Name)
		}
		return r, nil
	}}}
	for i, l := range readLines(t, filepath.Join(storiesDir, name+".jsonl")) {
		var env struct{ Subject, Type string }
		_ = jsonUnmarshal(l, &env)
		sub := "seamguard.events." + env.Subject
		if env.Type == events.TypeSessionResumed {
			sub = "seamguard.control." + env.Subject // as an operator publishes it
		}
		if !events.ValidSessionID(env.Subject) {
			sub = "seamguard.events.unnamed"
		}
		a, err := st.d.Apply(context.Background(), sub, nil, l, uint64(i+1))
		require.NoError(t, err)
		if a.CarriedPins != nil {
			if st.carried == nil {
				st.carried = map[string][]Range{}
			}
			st.carried[a.EventID] = a.CarriedPins
		}
		if st.session == "" && a.Session != "" {
			st.session = a.Session
		}
		for _, out := range a.Outputs {
			_, _, body, err := events.Encoder{}.Encode(out)
			require.NoError(t, err)
			st.outputs = append(st.outputs, body)
			v, err := events.DecodeVerdict(body)
			require.NoError(t, err)
			st.verdicts = append(st.verdicts, v)
		}
	}
	return st
}

// model builds the model of the story's session, its history the derived
// verdicts numbered in order.
func (st *story) model(file string) *Model {
	var hist []Entry
	for i, v := range st.verdicts {
		if v.Session == st.session {
			hist = append(hist, EntryOf(uint64(i+1), v))
		}
	}
	AttachCarried(hist, st.carried)
	l := st.d.Ledger(st.session)
	v := l.View()
	return Build(v, Origin{From: "events", Name: file, Seq: v.LastSeq, Events: int(v.Accepted)}, "(derived)", hist)
}

// TestDeriverAgreesWithCheck: the Deriver, fed the stories as stream
// messages, gives byte for byte what `seamguard check` gave (the golden
// outputs), spills answered from the recorded outcomes. bad-input is left
// out: its rejections say where an input came from, a line offline and a
// subject here.
func TestDeriverAgreesWithCheck(t *testing.T) {
	for _, name := range []string{"seed-story", "healthy-chain", "gap-then-resume", "unit-mismatch", "committed-anyway", "pinned-story"} {
		t.Run(name, func(t *testing.T) {
			st := deriveStory(t, name)
			want := readLines(t, filepath.Join(storiesDir, "golden", name+".out.jsonl"))
			require.Len(t, st.outputs, len(want))
			for i := range want {
				assert.Equal(t, string(want[i]), string(st.outputs[i]))
			}
		})
	}
}

// TestStoryPictures draws every story (bar the hostile one) offline as
// text and SVG; the goldens under testdata/ show what each state looks
// like: a spill, a halt and its waiver, a gap, a unit mismatch, a commit of
// a refused compaction.
func TestStoryPictures(t *testing.T) {
	for _, name := range []string{"seed-story", "healthy-chain", "gap-then-resume", "unit-mismatch", "committed-anyway", "pinned-story"} {
		t.Run(name, func(t *testing.T) {
			m := deriveStory(t, name).model(name + ".jsonl")
			var text, colored, svg bytes.Buffer
			require.NoError(t, WriteText(&text, m, TextOptions{}))
			require.NoError(t, WriteText(&colored, m, TextOptions{Color: true}))
			require.NoError(t, WriteSVG(&svg, m))
			golden(t, filepath.Join("testdata", name+".txt"), text.String())
			golden(t, filepath.Join("testdata", name+".svg"), svg.String())
			assert.Equal(t, text.String(), regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(colored.String(), ""))
			wellFormed(t, svg.Bytes())
		})
	}
}

func wellFormed(t *testing.T, b []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	depth := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch tok.(type) {
		case xml.StartElement:
			depth++
		case xml.EndElement:
			depth--
		}
	}
	assert.Equal(t, 0, depth)
}

// randomView is a ledger view with arbitrary sets inside [0, head).
func randomView(r *rand.Rand) ledger.View {
	head := uint64(r.IntN(60))
	set := func(density int) ledger.RangeSet {
		var s ledger.RangeSet
		for range r.IntN(density + 1) {
			if head == 0 {
				break
			}
			a := r.Uint64N(head)
			s.Add(Range{Start: a, End: a + 1 + r.Uint64N(min(head-a, 12))})
		}
		return s
	}
	v := ledger.View{Session: "s", Status: "open", Unit: events.UnitTurns, FloorUnit: events.UnitTurns, Span: uint64(r.IntN(20)), Head: head}
	v.Received = ledger.RangeDiff(Range{Start: 0, End: head}, set(2))
	if head > 0 {
		v.Received.Add(Range{Start: head - 1, End: head}) // head is the end of a turn
	}
	v.Truncated, v.Committed, v.Waived = set(4), set(3), set(2)
	v.Spilled = ledger.Intersect(set(2), v.Received) // spills hold received offsets
	v.Pinned = ledger.Intersect(set(2), v.Received)  // only received offsets are pinned
	return v
}

// TestBuildAgainstAnOracle checks both tracks offset by offset against a
// direct reading of the definitions, on random ledgers.
func TestBuildAgainstAnOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := range 2000 {
		v := randomView(r)
		m := Build(v, Origin{}, "", nil)
		classAt := func(segs []Segment, x uint64) Class {
			for _, g := range segs {
				if g.Start <= x && x < g.End {
					return g.Class
				}
			}
			return ""
		}
		for x := range v.Head {
			var ctx, back Class
			switch {
			case !v.Received.Has(x):
				ctx = Gap
			case v.Committed.Has(x):
				ctx = Summary
			case v.Truncated.Has(x):
				ctx = Truncated
			default:
				ctx = Tail
			}
			held := ctx == Summary || ctx == Tail
			switch {
			case v.Spilled.Has(x):
				back = Spilled
			case v.Waived.Has(x):
				back = Waived
			case !held:
				back = Hole
			}
			require.Equal(t, ctx, classAt(m.Context, x), "case %d offset %d: %+v", i, x, v)
			require.Equal(t, back, classAt(m.Backup, x), "case %d offset %d: %+v", i, x, v)
			var pin Class
			if v.Pinned.Has(x) {
				pin = Pinned
			}
			require.Equal(t, pin, classAt(m.Pins, x), "case %d offset %d: %+v", i, x, v)
		}
		// Segments are maximal, ordered and inside [0, head).
		for _, segs := range [][]Segment{m.Context, m.Backup, m.Pins} {
			for j, g := range segs {
				require.Less(t, g.Start, g.End)
				require.LessOrEqual(t, g.End, v.Head)
				if j > 0 {
					require.LessOrEqual(t, segs[j-1].End, g.Start)
					require.False(t, segs[j-1].End == g.Start && segs[j-1].Class == g.Class, "segments not merged")
				}
			}
		}
		// The text picture of any of them draws, and its SVG parses.
		var b bytes.Buffer
		require.NoError(t, WriteText(&b, m, TextOptions{Width: 16 + r.IntN(80)}))
		if i%100 == 0 {
			b.Reset()
			require.NoError(t, WriteSVG(&b, m))
			wellFormed(t, b.Bytes())
		}
	}
}

// TestTextScalesWithoutLosingAHole: on a long session one cell covers many
// offsets, and shows the most severe class among them, so a one-token hole
// in 200,000 tokens is still drawn.
func TestTextScalesWithoutLosingAHole(t *testing.T) {
	v := ledger.View{Session: "long", Status: "open", Unit: events.UnitTokens, FloorUnit: events.UnitTokens, Span: 16000, Head: 200000}
	v.Received = ledger.NewRangeSet(Range{Start: 0, End: 200000})
	v.Committed = ledger.NewRangeSet(Range{Start: 0, End: 150000})
	v.Truncated = ledger.NewRangeSet(Range{Start: 0, End: 150000}, Range{Start: 170001, End: 170002})
	m := Build(v, Origin{From: "kv", Name: "b", Seq: 9}, "V", nil)
	assert.Equal(t, []Range{{Start: 170001, End: 170002}}, m.Sets.Holes)
	var b bytes.Buffer
	require.NoError(t, WriteText(&b, m, TextOptions{Width: 40}))
	out := b.String()
	rows := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		for _, name := range []string{"context", "backup", "floor"} {
			if strings.HasPrefix(l, fmt.Sprintf("  %-*s", labelWidth-2, name)) {
				rows[name] = l[labelWidth:]
			}
		}
	}
	require.Len(t, rows["context"], 40, out)
	assert.Equal(t, 1, strings.Count(rows["context"], "x"), out)
	assert.Equal(t, "!", strings.TrimSpace(rows["backup"]), out)
	assert.Equal(t, 34, strings.Index(rows["context"], "x"), "offset 170001 of 200000 is in cell 34 of 40")
	assert.Contains(t, out, "0         50000     100000    150000    200000")
	assert.Contains(t, out, "[--)  [184000, 200000)")
}

func TestTextOfAnEmptySession(t *testing.T) {
	var b bytes.Buffer
	m := Build(ledger.View{Session: "s", Status: "open", Unit: events.UnitTurns, FloorUnit: events.UnitTurns, Span: 4}, Origin{From: "kv"}, "V", nil)
	require.NoError(t, WriteText(&b, m, TextOptions{}))
	assert.Contains(t, b.String(), "nothing received yet")
	assert.Contains(t, b.String(), "decisions: none in V")
	b.Reset()
	require.NoError(t, WriteSVG(&b, m))
	wellFormed(t, b.Bytes())
}

func TestSpillFailureComesBackOut(t *testing.T) {
	const failure = "object store said no (twice); giving up"
	lines := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	d := &Deriver{Spill: func(context.Context, ledger.SpillRequest) (ledger.SpillResult, error) {
		return ledger.SpillResult{Failure: failure}, nil
	}}
	var halted []byte
	var req ledger.SpillRequest
	for i, l := range lines[:55] {
		a, err := d.Apply(context.Background(), "seamguard.events.ops-agent-42", nil, l, uint64(i+1))
		require.NoError(t, err)
		for _, o := range a.Outputs {
			if o.Type == events.TypeSessionHalted {
				_, _, halted, err = events.Encoder{}.Encode(o)
				require.NoError(t, err)
				ev, err := events.DecodeJSON(l, events.Meta{Subject: "seamguard.events.ops-agent-42", Seq: uint64(i + 1)})
				require.NoError(t, err)
				req.Cause = events.CauseOf(ev)
			}
		}
	}
	require.NotNil(t, halted)
	v, err := events.DecodeVerdict(halted)
	require.NoError(t, err)
	var o Outcomes
	o.Add(v)
	r, ok := o.Answer(req)
	require.True(t, ok)
	assert.Equal(t, failure, r.Failure)
	assert.Equal(t, "not the core's wording", spillFailure("not the core's wording"))
}

func TestFieldDiff(t *testing.T) {
	a, _ := normalise([]byte(`{"id":"x","time":"t1","source":"a","data":{"head":5,"cov":[{"start":0,"end":4}],"gone":1}}`))
	b, _ := normalise([]byte(`{"id":"x","time":"t2","source":"b","data":{"head":5,"cov":[{"start":0,"end":3}],"new":true}}`))
	assert.Equal(t, []string{
		`data.cov: derived [{"end":4,"start":0}], recorded [{"end":3,"start":0}]`,
		`data.gone: derived 1, recorded (absent)`,
		`data.new: derived (absent), recorded true`,
	}, fieldDiff(a, b))
	c, _ := normalise([]byte(`{"id":"x","time":"t3","source":"c","data":{"head":5,"cov":[{"start":0,"end":4}],"gone":1}}`))
	assert.Equal(t, a, c, "time and source are not compared")
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// TestPinnedTrack: pinned offsets get their own track in text, SVG and
// JSON, and the history says which pins a refusal drops and which a
// request carried. The pinned story ends unpinned, so its goldens show the
// history; this shows the track.
func TestPinnedTrack(t *testing.T) {
	v := ledger.View{Session: "s", Status: "open", Unit: events.UnitTurns, FloorUnit: events.UnitTurns, Span: 12, Head: 52}
	v.Received = ledger.NewRangeSet(Range{Start: 0, End: 52})
	v.Truncated = ledger.NewRangeSet(Range{Start: 0, End: 8})
	v.Pinned = ledger.NewRangeSet(Range{Start: 0, End: 1}, Range{Start: 30, End: 32})
	refused := &events.Verdict{ID: "r1", Output: events.Output{Type: events.TypeCompactionRefused, Cause: events.Cause{ID: "e1"}, Data: &events.CompactionRefused{RequestID: "p1", Next: events.NextCarryPins,
		Reasons: []events.Reason{{Code: events.ReasonCoverageHole, AtRisk: []Range{{Start: 0, End: 8}}}, {Code: events.ReasonPinDropped, AtRisk: []Range{{Start: 0, End: 1}}}}}}}
	allowed := &events.Verdict{ID: "a1", Output: events.Output{Type: events.TypeCompactionAllowed, Cause: events.Cause{ID: "e2"}, Data: &events.CompactionAllowed{RequestID: "p2", Head: 52, TailStart: 40}}}
	hist := []Entry{EntryOf(1, refused), EntryOf(2, allowed)}
	AttachCarried(hist, map[string][]Range{"e2": {{Start: 0, End: 1}, {Start: 30, End: 32}}, "e1": nil})
	m := Build(v, Origin{}, "V", hist)

	assert.Equal(t, []Segment{{Class: Pinned, Start: 0, End: 1}, {Class: Pinned, Start: 30, End: 32}}, m.Pins)
	assert.Equal(t, []Range{{Start: 0, End: 1}, {Start: 30, End: 32}}, m.Sets.Pinned)
	assert.Equal(t, []Range{{Start: 0, End: 1}}, m.History[0].DroppedPins)
	assert.Empty(t, m.History[0].CarriedPins)
	assert.Equal(t, []Range{{Start: 0, End: 1}, {Start: 30, End: 32}}, m.History[1].CarriedPins)

	js, err := json.Marshal(m)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"pins":[{"class":"pinned","start":0,"end":1},{"class":"pinned","start":30,"end":32}]`)
	assert.Contains(t, string(js), `"dropped_pins":[{"start":0,"end":1}]`)
	assert.Contains(t, string(js), `"carried_pins":[{"start":0,"end":1},{"start":30,"end":32}]`)

	var b bytes.Buffer
	require.NoError(t, WriteText(&b, m, TextOptions{Width: 52}))
	out := b.String()
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  pinned    ") {
			row = l[labelWidth:]
		}
	}
	assert.Equal(t, "*"+strings.Repeat(" ", 29)+"**", row, out)
	assert.Contains(t, out, "* pinned (N): kept in the context      [0, 1), [30, 32)")
	assert.Contains(t, out, "pinned N [0, 1), [30, 32)")
	assert.Contains(t, out, "p1 (event e1): next carry_pins; DROPS PINNED [0, 1)")
	assert.Contains(t, out, "head 52; carried pins [0, 1), [30, 32)")

	b.Reset()
	require.NoError(t, WriteSVG(&b, m))
	wellFormed(t, b.Bytes())
	svg := b.String()
	assert.Contains(t, svg, "<title>pinned [30, 32)</title>")
	assert.Contains(t, svg, "<title>dropped pins [0, 1)</title>")
	assert.Contains(t, svg, "p1: coverage_hole at risk [0, 8); pin_dropped at risk [0, 1); next carry_pins; DROPS PINNED [0, 1)")
	assert.Contains(t, svg, "carried pins [0, 1), [30, 32)")
	if p := os.Getenv("SEAMGUARD_PINS_SVG"); p != "" {
		require.NoError(t, os.WriteFile(p, b.Bytes(), 0o644)) // to look at it
	}
}
