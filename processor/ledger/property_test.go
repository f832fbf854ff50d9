package ledger

// Property tests: random sessions stepped through the core and the oracle of
// oracle_test.go side by side, and RangeSet against a bitmap.

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// orcChooser supplies every choice a generator makes, so that one generator
// serves both the seeded property test and the byte-driven fuzz target.
type orcChooser interface {
	intn(n int) int // a value in [0, n), n >= 1
	done() bool     // no more choices to make
}

// orcRandChooser draws from a PRNG and records each choice as the bytes
// orcByteChooser would need to make it again (fuzz seeds come from there).
type orcRandChooser struct {
	r   *rand.Rand
	rec []byte
}

func (c *orcRandChooser) intn(n int) int {
	v := c.r.IntN(n)
	if n <= 256 {
		c.rec = append(c.rec, byte(v))
	} else {
		c.rec = append(c.rec, byte(v>>8), byte(v))
	}
	return v
}

func (c *orcRandChooser) done() bool { return false }

// orcByteChooser reads choices from fuzz bytes: one byte per choice of at most
// 256 values, two for larger ones, zeros once the bytes run out.
type orcByteChooser struct{ b []byte }

func (c *orcByteChooser) next() int {
	if len(c.b) == 0 {
		return 0
	}
	x := int(c.b[0])
	c.b = c.b[1:]
	return x
}

func (c *orcByteChooser) intn(n int) int {
	if n <= 256 {
		return c.next() % n
	}
	hi := c.next()
	return (hi<<8 | c.next()) % n
}

func (c *orcByteChooser) done() bool { return len(c.b) == 0 }

// orcItem is one input event of a script; spillFail is what the spill comes
// back with if the core asks for one ("" for success), overQuota whether it
// says the quota stopped it.
type orcItem struct {
	ev        *events.Event
	spillFail string
	overQuota bool
}

// orcMaxHead keeps generated transcripts small: no turn ends past it.
const orcMaxHead = 240

// orcGen builds a session script. It steps a shadow oracle as it goes, so
// that it can aim events at the state it has built (gaps to fill, requests
// that were evaluated, a halt to resume).
type orcGen struct {
	c         orcChooser
	session   string
	cfg       Config
	o         *orcLedger
	items     []orcItem
	seq       uint64
	ids       int
	unit      events.Unit
	floorUnit events.Unit
	span      uint64
	lastReq   map[string]events.CompactionRequested
}

var orcUnits = []events.Unit{events.UnitTurns, events.UnitTokens, events.UnitMessages}

var orcSpans = []uint64{0, 1, 2, 3, 4, 6, 8, 12, 16, 24}

// orcGenerate builds one session script of at most maxItems events.
func orcGenerate(c orcChooser, session string, maxItems int) ([]orcItem, Config) {
	g := &orcGen{c: c, session: session, o: &orcLedger{}, lastReq: map[string]events.CompactionRequested{}}
	if c.intn(3) == 0 {
		g.cfg.Policy = PolicyHalt
	}
	if c.intn(2) == 0 {
		// Small limits, so that sessions reach them: a handful of ranges,
		// a few request ids, snapshots of a few hundred bytes, spill quotas
		// of a few spills (the driver's spills take 100 bytes an event),
		// outputs that list a few ranges.
		g.cfg.Limits = Limits{
			MaxRanges:        []int{0, 1, 2, 3, 5}[c.intn(5)],
			MaxRequests:      []int{0, 1, 2, 3}[c.intn(4)],
			MaxSnapshotBytes: []int{0, 250, 350, 500, 800}[c.intn(5)],
			SpillQuota:       []uint64{0, 300, 1000, 2500}[c.intn(4)],
			listed:           []int{0, 1, 2, 3}[c.intn(4)],
		}
	}
	g.unit = orcUnits[c.intn(len(orcUnits))]
	g.floorUnit = g.unit
	if c.intn(10) == 0 {
		g.floorUnit = orcUnits[c.intn(len(orcUnits))]
	}
	g.span = orcSpans[c.intn(len(orcSpans))]
	if c.intn(15) != 0 {
		g.open()
	}
	for len(g.items) < maxItems && !c.done() {
		if g.o.status == orcClosed && c.intn(2) == 0 {
			break
		}
		if g.o.status == orcHalted && c.intn(5) == 0 {
			g.resume()
			continue
		}
		switch k := c.intn(100); {
		case k < 38:
			g.turn()
		case k < 46:
			g.truncate()
		case k < 66:
			g.request()
		case k < 74:
			g.commit()
		case k < 77:
			g.resume()
		case k < 85:
			g.duplicate()
		case k < 88:
			g.open()
		case k < 89:
			g.emit(events.TypeSessionClosed, &events.SessionClosed{})
		case k < 90:
			g.emit(events.TypePrefix+"session.renamed", nil) // no body: unknown type
		case k < 95:
			g.pin()
		default:
			g.turn()
		}
	}
	return g.items, g.cfg
}

func (g *orcGen) rnd(n uint64) uint64 { return uint64(g.c.intn(int(max(n, 1)))) }

func (g *orcGen) emit(typ string, body any) {
	g.ids++
	g.seq++
	ev := &events.Event{
		ID: fmt.Sprintf("e%d", g.ids), Source: "agent", Type: typ, Subject: g.session, Body: body,
		Meta: events.Meta{Subject: "seamguard.events." + g.session, Seq: g.seq, Control: onControl(body)},
	}
	if g.c.intn(30) == 0 {
		// On the wrong subject: a resume an agent publishes on the events
		// subject, or another input an operator sends on the control one.
		ev.Meta.Control = !ev.Meta.Control
	}
	if g.ids > 1 && g.c.intn(40) == 0 {
		// An id already used, from another source: not a duplicate.
		ev.Source, ev.ID = "agent-b", fmt.Sprintf("e%d", 1+g.c.intn(g.ids-1))
	}
	g.push(ev)
}

func (g *orcGen) push(ev *events.Event) {
	it := orcItem{ev: ev}
	if _, ok := ev.Body.(*events.CompactionRequested); ok && g.c.intn(7) == 0 {
		it.spillFail = "object store unavailable after 3 retries"
		if g.c.intn(3) == 0 {
			it.spillFail, it.overQuota = "the object would exceed its byte budget", true
		}
	}
	g.items = append(g.items, it)
	// The shadow oracle only aims the generator: it is told nothing of
	// snapshot sizes.
	if obs := g.o.event(ev, g.cfg, orcHint{room: true}); obs.Spill != nil {
		g.o.spillDone(&SpillResult{Handle: events.SpillHandle{Name: obs.Spill.Name, Range: obs.Spill.Range, Size: 100 * obs.Spill.Events,
			LastSeq: obs.Spill.LastSeq}, Failure: it.spillFail, OverQuota: it.overQuota}, g.cfg, orcHint{room: true})
	}
}

// open sends the session's configuration, or, on an open session, the same
// again or a conflicting or malformed one.
func (g *orcGen) open() {
	b := &events.SessionOpened{Unit: g.unit, RecoveryFloor: events.Floor{Span: g.span, Unit: g.floorUnit}}
	if g.o.status != orcNew || g.c.intn(20) == 0 {
		switch g.c.intn(5) {
		case 0:
			b.RecoveryFloor.Span++
		case 1:
			b.Unit = "bytes"
		case 2:
			b.RecoveryFloor.Unit = orcUnits[g.c.intn(len(orcUnits))]
		}
	}
	if g.c.intn(2) == 0 {
		w, tr := uint64(200000), uint64(160000)
		b.Window, b.Trigger = &w, &tr
	}
	g.emit(events.TypeSessionOpened, b)
}

func (g *orcGen) turn() {
	h := g.o.head
	size := uint64(1)
	switch g.unit {
	case events.UnitTokens:
		size = 1 + g.rnd(12)
	case events.UnitMessages:
		size = 1 + g.rnd(3)
	}
	off := h
	switch k := g.c.intn(20); {
	case k < 14:
	case k < 16: // leave a gap
		off = h + 1 + g.rnd(4)
	case k < 18: // fill (part of) a gap
		if gaps := orcSpan(0, h).minus(g.o.received).ranges(); len(gaps) > 0 {
			gp := gaps[g.c.intn(len(gaps))]
			off = gp.Start + g.rnd(gp.End-gp.Start)
			size = 1 + g.rnd(gp.End-off)
		}
	case k < 19: // overlap what was received
		off = g.rnd(h + 1)
	default:
		size = 0
	}
	if off+size > orcMaxHead {
		g.truncate()
		return
	}
	g.emit(events.TypeTurnAppended, &events.TurnAppended{Offset: off, Size: size, Role: "tool", Content: []byte(`{"k":1}`), Pinned: g.c.intn(6) == 0})
}

// pin pins or unpins a range: mostly within [0, head), sometimes past it or
// reversed.
func (g *orcGen) pin() {
	h := g.o.head
	a := g.rnd(h + 1)
	r := events.Range{Start: a, End: a + g.rnd(min(h-a, 6)+1)}
	switch g.c.intn(12) {
	case 0:
		r.End = h + 1 + g.rnd(3)
	case 1:
		r = events.Range{Start: a + 1 + g.rnd(3), End: a}
	}
	if g.c.intn(3) == 0 {
		g.emit(events.TypeContextUnpinned, &events.ContextUnpinned{Range: r})
		return
	}
	g.emit(events.TypeContextPinned, &events.ContextPinned{Range: r})
}

// carry picks what a request carries back of the pinned turns: mostly
// nothing or all of them, else some, a reversed range or a bad list.
func (g *orcGen) carry(b *events.CompactionRequested) {
	pinned := g.o.pinned.ranges()
	switch k := g.c.intn(12); {
	case k < 5:
	case k < 9:
		b.CarriedPins = pinned
	case k < 10 && len(pinned) > 0:
		b.CarriedPins = pinned[g.c.intn(len(pinned)):]
	case k < 11:
		b.CarriedPins = []events.Range{{Start: 0, End: g.rnd(g.o.head + 2)}, {Start: 3, End: 2}}
	default:
		b.CarriedPinsInvalid = "carried_pins is a string; send carried_pins as a list of ranges"
	}
}

func (g *orcGen) truncate() {
	h := g.o.head
	var r events.Range
	switch k := g.c.intn(20); {
	case k < 11: // the oldest offsets, as budget enforcement drops them
		r = events.Range{Start: 0, End: g.rnd(h + 1)}
	case k < 17:
		a := g.rnd(h + 1)
		r = events.Range{Start: a, End: a + g.rnd(h-a+1)}
	case k < 19:
		r = events.Range{Start: g.rnd(h + 1), End: h + 1 + g.rnd(4)}
	default:
		a := g.rnd(h + 1)
		r = events.Range{Start: a + 1 + g.rnd(3), End: a}
	}
	g.emit(events.TypeContextTruncated, &events.ContextTruncated{Range: r, Stage: "budget"})
}

func (g *orcGen) request() {
	h := g.o.head
	id := fmt.Sprintf("r%d", 1+g.c.intn(6))
	var b events.CompactionRequested
	prev, seen := g.lastReq[id]
	switch k := g.c.intn(20); {
	case k < 3 && seen: // a retry of the same compaction
		b = prev
	case k < 11: // shaped to pass: tail holds the floor, input reaches a span before it
		ts := orcSub(h, g.span+g.rnd(4))
		in0 := orcSub(ts, g.span+g.rnd(4))
		switch g.c.intn(4) {
		case 0:
			in0 = 0
		case 1: // start after the truncated prefix, as the seed's summarizer did
			in0 = 0
			for in0 < h && g.o.truncated.has(in0) {
				in0++
			}
		}
		s0 := uint64(0)
		if g.c.intn(3) == 0 {
			s0 = min(in0, ts)
		}
		b = events.CompactionRequested{SummarizerInput: events.Range{Start: in0, End: h + g.rnd(3)},
			SummaryRange: events.Range{Start: s0, End: ts}, TailStart: ts}
	case k < 18:
		a := g.rnd(h + 3)
		se := g.rnd(h + 1)
		b = events.CompactionRequested{SummarizerInput: events.Range{Start: a, End: a + g.rnd(h+3-a)},
			SummaryRange: events.Range{Start: g.rnd(se + 1), End: se}, TailStart: g.rnd(h + 1)}
	default: // break rule 1 one way or another
		b = events.CompactionRequested{SummarizerInput: events.Range{Start: 0, End: h},
			SummaryRange: events.Range{Start: 0, End: h / 2}, TailStart: h / 2}
		switch g.c.intn(5) {
		case 0:
			id = ""
		case 1:
			b.SummarizerInput = events.Range{Start: 3, End: 1}
		case 2:
			b.SummaryRange = events.Range{Start: h/2 + 1, End: h / 2}
		case 3:
			b.TailStart = h + 1 + g.rnd(3)
		case 4:
			b.SummaryRange.End = h + 1 + g.rnd(3)
		}
	}
	b.RequestID = id
	b.CarriesPriorSummary = g.c.intn(3) == 0
	if k := g.c.intn(4); k > 0 || !seen {
		b.CarriedPins, b.CarriedPinsInvalid = nil, ""
		g.carry(&b)
	}
	occ := uint64(163000)
	b.Occupancy = &occ
	g.lastReq[id] = b
	g.emit(events.TypeCompactionRequested, &b)
}

func (g *orcGen) commit() {
	var evaluated []string
	for id, r := range g.o.requests {
		if r.evaluated {
			evaluated = append(evaluated, id)
		}
	}
	sort.Strings(evaluated)
	var id string
	switch k := g.c.intn(10); {
	case k < 6 && len(evaluated) > 0:
		id = evaluated[g.c.intn(len(evaluated))]
	case k < 8:
		id = fmt.Sprintf("r%d", 1+g.c.intn(6))
	case k < 9:
		id = "never-requested"
	}
	g.emit(events.TypeCompactionCommitted, &events.CompactionCommitted{RequestID: id})
}

func (g *orcGen) resume() {
	note := "operator accepts the halted offsets as lost"
	switch g.c.intn(10) {
	case 0:
		note = ""
	case 1:
		note = " \t"
	}
	g.emit(events.TypeSessionResumed, &events.SessionResumed{Note: note})
}

// duplicate re-sends an earlier event (same source and id, a new stream
// sequence): usually a recent one, sometimes one long gone from the window.
func (g *orcGen) duplicate() {
	n := len(g.items)
	if n == 0 {
		g.turn()
		return
	}
	i := g.c.intn(n)
	if g.c.intn(10) < 7 {
		i = n - 1 - g.c.intn(min(n, orcRecent))
	}
	ev := *g.items[i].ev
	g.seq++
	ev.Meta.Seq = g.seq
	g.push(&ev)
}

// The driver.

type orcRunOpts struct {
	cfg Config
	// twinAt > 0 restores a second ledger from the snapshot taken after that
	// many steps and steps it alongside from then on.
	twinAt int
	// verdict, when set, sees every compaction request with the oracle after
	// it and all the outputs it led to (including those of its spill).
	verdict func(o *orcLedger, b *events.CompactionRequested, outs []events.Output)
	// stats, when set, counts outputs by type.
	stats map[string]int
}

type orcRunner struct {
	opts   orcRunOpts
	l      Ledger
	o      *orcLedger
	twin   *Ledger
	prev   []byte // snapshot after the last step
	steps  int
	spills int
}

// orcRun steps script through the core and the oracle and returns how many
// steps it took and the first thing that went wrong ("" if nothing did).
func orcRun(script []orcItem, opts orcRunOpts) (int, string) {
	r := &orcRunner{opts: opts, o: &orcLedger{}}
	r.prev, _ = r.l.MarshalBinary()
	for i, it := range script {
		if msg := r.item(it); msg != "" {
			return r.steps, fmt.Sprintf("at item #%d, %s:\n%s", i, orcDescribe(it), msg)
		}
	}
	return r.steps, ""
}

// hint measures what the oracle does not model: whether f, applied to the
// ledger as it stands, would take its snapshot past the limit (and grow it),
// which the core must then refuse; and whether the snapshot has room for a
// halt to name one range more.
func (r *orcRunner) hint(f func(*Ledger) Result) orcHint {
	lim := r.opts.cfg.Limits.orDefaults()
	var c Ledger
	if err := c.UnmarshalBinary(r.prev); err != nil {
		panic(err)
	}
	f(&c)
	after, _ := c.MarshalBinary()
	limit := lim.MaxSnapshotBytes - haltReserve
	return orcHint{
		over: len(after) > limit && len(after) > len(r.prev),
		room: len(r.prev)+rangeBytes+1 <= lim.MaxSnapshotBytes,
	}
}

// stateLimit reports whether res rejected its event at a state limit.
func stateLimit(res Result) bool {
	for _, out := range res.Outputs {
		if d, ok := out.Data.(*events.EventRejected); ok && d.Code == events.CodeStateLimit {
			return true
		}
	}
	return false
}

func (r *orcRunner) item(it orcItem) string {
	ev := it.ev
	before := r.prev
	in := Input{Event: ev}
	lim := r.opts.cfg.Limits.orDefaults()
	hint := r.hint(func(c *Ledger) Result { return c.apply(ev, idHash(ev.Source, ev.ID), r.opts.cfg, lim, nil) })
	res, err := Step(&r.l, in, r.opts.cfg)
	if err != nil {
		return "Step returned an error although the protocol was followed: " + err.Error()
	}
	if msg := r.check(in, res, r.o.event(ev, r.opts.cfg, hint)); msg != "" {
		return msg
	}
	if !res.Accepted && !bytes.Equal(before, r.prev) {
		if !stateLimit(res) {
			return "an event that was rejected, refused before/after the session's life, or a duplicate changed the snapshot"
		}
		// A state limit changes the halt and nothing else.
		var lb Ledger
		if err := lb.UnmarshalBinary(before); err != nil {
			return err.Error()
		}
		lb.status, lb.halt, lb.haltReq = r.l.status, r.l.halt, r.l.haltReq
		if b, _ := lb.MarshalBinary(); !bytes.Equal(b, r.prev) {
			return "an event rejected at a state limit changed more than the halt"
		}
	}
	b, isReq := ev.Body.(*events.CompactionRequested)
	outs := slices.Clone(res.Outputs)
	for _, out := range outs {
		if out.Type != events.TypeCompactionAllowed {
			continue
		}
		if ok, holes := r.o.safe(b); !ok {
			return fmt.Sprintf("compaction.allowed although offsets %v are in none of C, R, P, W", holes)
		}
		if ok, dropped := r.o.pinsKept(b); !ok {
			return fmt.Sprintf("compaction.allowed although pinned offsets %v are in neither R nor carried_pins", dropped)
		}
	}
	if res.Spill != nil {
		r.spills++
		s := res.Spill
		sr := &SpillResult{Failure: it.spillFail, OverQuota: it.overQuota, Handle: events.SpillHandle{
			Bucket: "seamguard-spills", Name: s.Name, Digest: fmt.Sprintf("sha256-%04d", r.spills),
			Size: 100 * s.Events, Range: s.Range, Events: s.Events, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq,
		}}
		if s.Events == 0 || s.FirstSeq > s.LastSeq || s.MaxBytes == 0 {
			return fmt.Sprintf("a spill of nothing, or with no byte budget: %+v", *s)
		}
		in := Input{Spill: sr}
		hint := r.hint(func(c *Ledger) Result { return c.spillDone(sr, lim) })
		res2, err := Step(&r.l, in, r.opts.cfg)
		if err != nil {
			return "Step of the spill result returned an error: " + err.Error()
		}
		if msg := r.check(in, res2, r.o.spillDone(sr, r.opts.cfg, hint)); msg != "" {
			return "after the spill result: " + msg
		}
		outs = append(outs, res2.Outputs...)
	}
	if r.opts.stats != nil {
		if stateLimit(res) && !hint.room {
			r.opts.stats["state_limit without room"]++
		}
		for _, out := range outs {
			r.opts.stats[out.Type]++
			switch d := out.Data.(type) {
			case *events.CompactionAllowed:
				if len(d.Cured) > 0 {
					r.opts.stats["allowed, cured"]++
				}
				if len(b.CarriedPins) > 0 && !r.o.pinned.empty() {
					r.opts.stats["allowed, carrying pins"]++
				}
				if d.SummaryCoverageTruncated {
					r.opts.stats["coverage cut"]++
				}
			case *events.EventRejected:
				if d.Code == events.CodeStateLimit {
					r.opts.stats["state_limit "+d.Field]++
				}
			case *events.CompactionViolation:
				r.opts.stats["violation "+orcViolation(d.Message)]++
			case *events.SpillHandle:
				if d.Previous != nil {
					r.opts.stats["spill with previous"]++
				}
			case *events.SessionHalted:
				if d.UnrecoverableTruncated {
					r.opts.stats["unrecoverable cut"]++
				}
				if strings.Contains(d.Message, "quota") {
					r.opts.stats["halted at the quota"]++
				}
			case *events.CompactionRefused:
				for _, x := range d.Reasons {
					if x.AtRiskTruncated {
						r.opts.stats["at_risk cut"]++
						break
					}
				}
				if len(d.Cured) > 0 {
					r.opts.stats["refused, pin_dropped alone, cured"]++
				}
				if d.Next == events.NextCarryPins {
					if d.Spill != nil {
						r.opts.stats["carry_pins with a spill"]++
					} else {
						r.opts.stats["carry_pins without a spill"]++
					}
				}
			}
		}
		if res.Duplicate {
			r.opts.stats["duplicate"]++
		}
	}
	if isReq && r.opts.verdict != nil {
		r.opts.verdict(r.o, b, outs)
	}
	return ""
}

// check compares one Step with the oracle and checks the invariants, the
// snapshot round trip and the twin.
func (r *orcRunner) check(in Input, res Result, want orcObs) string {
	r.steps++
	if got := orcObserve(res); !reflect.DeepEqual(got, want) {
		return fmt.Sprintf("core and oracle differ\n  core:   %s\n  oracle: %s", orcFmtObs(got), orcFmtObs(want))
	}
	if msg := orcShape(&r.l, res, r.opts.cfg.Limits.orDefaults()); msg != "" {
		return msg
	}
	if msg := orcCompareState(&r.l, r.o); msg != "" {
		return "state differs from the oracle: " + msg
	}
	if msg := orcInvariants(&r.l); msg != "" {
		return "invariant broken: " + msg
	}
	b1, err := r.l.MarshalBinary()
	if err != nil {
		return "MarshalBinary: " + err.Error()
	}
	var l2 Ledger
	if err := l2.UnmarshalBinary(b1); err != nil {
		return "UnmarshalBinary of a fresh snapshot: " + err.Error()
	}
	if b2, _ := l2.MarshalBinary(); !bytes.Equal(b1, b2) {
		return "snapshot does not round-trip byte for byte"
	}
	if max := r.opts.cfg.Limits.orDefaults().MaxSnapshotBytes; len(b1) > max && len(b1) > len(r.prev) {
		return fmt.Sprintf("the snapshot grew to %d bytes, past its limit of %d", len(b1), max)
	}
	r.prev = b1
	if r.twin != nil {
		tres, err := Step(r.twin, in, r.opts.cfg)
		if err != nil {
			return "the restored twin returned an error: " + err.Error()
		}
		if !reflect.DeepEqual(tres, res) {
			return fmt.Sprintf("the ledger restored from a snapshot answers differently\n  original: %s\n  restored: %s",
				orcFmtObs(orcObserve(res)), orcFmtObs(orcObserve(tres)))
		}
		if tb, _ := r.twin.MarshalBinary(); !bytes.Equal(tb, b1) {
			return "the ledger restored from a snapshot diverged from the original"
		}
	}
	if r.steps == r.opts.twinAt {
		r.twin = &l2
	}
	return ""
}

// orcShape checks what the oracle does not model: JSON-facing lists are never
// null, messages are there and bounded, refusals say what to do next, a
// state limit halts with no request id, lists are cut short as doc.go says.
func orcShape(l *Ledger, res Result, lim Limits) string {
	for i, out := range res.Outputs {
		if l.session != "" && out.Session != l.session {
			return fmt.Sprintf("%s names session %q, the ledger is %q", out.Type, out.Session, l.session)
		}
		switch d := out.Data.(type) {
		case *events.CompactionAllowed:
			if d.SummaryCoverage == nil || d.RecoveredBy == nil || d.Cured == nil {
				return "compaction.allowed with a null list"
			}
		case *events.CompactionRefused:
			// next is retry with a spill, carry_pins exactly when pin_dropped
			// is listed (with a spill or not), none otherwise.
			pins := slices.ContainsFunc(d.Reasons, func(r events.Reason) bool { return r.Code == events.ReasonPinDropped })
			if d.Reasons == nil || pins != (d.Next == events.NextCarryPins) || (d.Next == events.NextRetry) != (d.Spill != nil && !pins) ||
				(d.Next != events.NextRetry && d.Next != events.NextNone && d.Next != events.NextCarryPins) {
				return fmt.Sprintf("compaction.refused with reasons %v, spill %v, next %q", d.Reasons, d.Spill, d.Next)
			}
			// cured only on a refusal that pin_dropped alone causes, and
			// then pin_dropped is its one reason and it has no spill.
			if len(d.Cured) > 0 && (len(d.Reasons) != 1 || d.Reasons[0].Code != events.ReasonPinDropped || d.Spill != nil ||
				slices.Contains(d.Cured, events.ReasonPinDropped) || !slices.IsSorted(d.Cured)) {
				return fmt.Sprintf("compaction.refused with cured %v beside reasons %v and spill %v", d.Cured, d.Reasons, d.Spill)
			}
			listed := 0
			for _, rs := range d.Reasons {
				if rs.AtRisk == nil || rs.Message == "" || len(rs.Message) > messageBytes {
					return fmt.Sprintf("reason %s without at_risk list or message, or with a message of %d bytes", rs.Code, len(rs.Message))
				}
				if rs.Code == events.ReasonPinDropped && !strings.Contains(rs.Message, "carried_pins") {
					return "a pin_dropped reason that does not say how to carry the pins: " + rs.Message
				}
				if rs.AtRiskTruncated != (rs.AtRiskTotal != nil) {
					return fmt.Sprintf("reason %s: at_risk_truncated %v with total %v", rs.Code, rs.AtRiskTruncated, rs.AtRiskTotal)
				}
				listed += len(rs.AtRisk)
			}
			if listed > lim.listed {
				return fmt.Sprintf("a refusal lists %d at-risk ranges, more than %d", listed, lim.listed)
			}
		case *events.SessionHalted:
			if d.Unrecoverable == nil || d.Message == "" {
				return "session.halted without unrecoverable list or message"
			}
			if len(d.Unrecoverable) > lim.listed || d.UnrecoverableTruncated != (d.UnrecoverableTotal != nil) {
				return fmt.Sprintf("session.halted lists %d ranges (truncated %v)", len(d.Unrecoverable), d.UnrecoverableTruncated)
			}
		case *events.EventRejected:
			if d.Message == "" || d.Input.Headers == nil {
				return "event.rejected without message or input headers"
			}
			if d.Code == events.CodeStateLimit {
				if !strings.Contains(d.Message, "limit") {
					return "a state_limit rejection that names no limit: " + d.Message
				}
				if l.status != statusNew && l.status != statusClosed {
					if i+1 >= len(res.Outputs) || res.Outputs[i+1].Type != events.TypeSessionHalted || res.Outputs[i+1].Data.(*events.SessionHalted).RequestID != "" {
						return "a state_limit rejection not followed by a session.halted without request id"
					}
				}
			}
		case *events.CompactionViolation:
			if d.Message == "" {
				return "compaction.violation without message"
			}
		}
	}
	return ""
}

// orcRepr checks the representation of a RangeSet: sorted, disjoint,
// non-adjacent, non-empty ranges.
func orcRepr(s RangeSet) string {
	for i, r := range s.r {
		if r.End <= r.Start {
			return fmt.Sprintf("empty range %v in %v", r, s.r)
		}
		if i > 0 && s.r[i-1].End >= r.Start {
			return fmt.Sprintf("ranges %v and %v out of order, overlapping or adjacent", s.r[i-1], r)
		}
	}
	return ""
}

// orcInvariants checks the ledger's own invariants.
func orcInvariants(l *Ledger) string {
	sets := map[string]RangeSet{"received": l.received, "truncated": l.truncated, "committed": l.committed, "spilled": l.spilled, "waived": l.waived, "pinned": l.pinned}
	if l.halt != nil {
		sets["halt"] = *l.halt
	}
	if l.pending != nil {
		sets["pending at-risk"] = l.pending.atRisk
	}
	for id, q := range l.requests {
		sets["coverage of "+id] = q.coverage
	}
	for name, s := range sets {
		if msg := orcRepr(s); msg != "" {
			return name + ": " + msg
		}
	}
	if l.head != l.received.Max() {
		return fmt.Sprintf("head %d but received ends at %d", l.head, l.received.Max())
	}
	// waived is not here: a halt at a state limit may name a turn beyond
	// head, and resuming it waives those offsets.
	if !l.pinned.SubsetOf(l.received) {
		return fmt.Sprintf("pinned %v holds offsets never received", l.pinned.Ranges())
	}
	for _, name := range []string{"truncated", "spilled", "committed", "pinned"} {
		if sets[name].Max() > l.head {
			return fmt.Sprintf("%s %v reaches beyond head %d", name, sets[name].Ranges(), l.head)
		}
	}
	// A closed session keeps the halt it was closed in.
	if (l.status == statusHalted && l.halt == nil) || (l.halt != nil && l.status != statusHalted && l.status != statusClosed) {
		return "halt ranges and halted status disagree"
	}
	return ""
}

func orcFmtObs(o orcObs) string {
	var b strings.Builder
	fmt.Fprintf(&b, "accepted=%v duplicate=%v", o.Accepted, o.Duplicate)
	if o.Spill != nil {
		fmt.Fprintf(&b, " spill=%+v", *o.Spill)
	}
	for _, out := range o.Outs {
		fmt.Fprintf(&b, "\n    %+v", out)
	}
	return b.String()
}

// orcDescribe writes one script item the way failure reports show it.
func orcDescribe(it orcItem) string {
	ev := it.ev
	var s string
	switch b := ev.Body.(type) {
	case *events.SessionOpened:
		s = fmt.Sprintf("session.opened unit=%s floor={%d %s}", b.Unit, b.RecoveryFloor.Span, b.RecoveryFloor.Unit)
	case *events.TurnAppended:
		s = fmt.Sprintf("turn.appended offset=%d size=%d pinned=%v", b.Offset, b.Size, b.Pinned)
	case *events.ContextPinned:
		s = fmt.Sprintf("context.pinned [%d, %d)", b.Range.Start, b.Range.End)
	case *events.ContextUnpinned:
		s = fmt.Sprintf("context.unpinned [%d, %d)", b.Range.Start, b.Range.End)
	case *events.ContextTruncated:
		s = fmt.Sprintf("context.truncated [%d, %d)", b.Range.Start, b.Range.End)
	case *events.CompactionRequested:
		s = fmt.Sprintf("compaction.requested %q summarizer_input=[%d, %d) summary_range=[%d, %d) tail_start=%d carries_prior_summary=%v",
			b.RequestID, b.SummarizerInput.Start, b.SummarizerInput.End, b.SummaryRange.Start, b.SummaryRange.End, b.TailStart, b.CarriesPriorSummary)
		if b.CarriedPins != nil || b.CarriedPinsInvalid != "" {
			s += fmt.Sprintf(" carried_pins=%v%s", b.CarriedPins, b.CarriedPinsInvalid)
		}
		if it.spillFail != "" {
			s += " (a spill would fail)"
		}
		if it.overQuota {
			s += " (over its quota)"
		}
	case *events.CompactionCommitted:
		s = fmt.Sprintf("compaction.committed %q", b.RequestID)
	case *events.SessionResumed:
		s = fmt.Sprintf("session.resumed note=%q", b.Note)
	case *events.SessionClosed:
		s = "session.closed"
	default:
		s = ev.Type + " (no data)"
	}
	return fmt.Sprintf("%s [%s/%s seq %d]", s, ev.Source, ev.ID, ev.Meta.Seq)
}

func orcDescribeAll(script []orcItem, cfg Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy %d, limits %+v:\n", cfg.Policy, cfg.Limits)
	for i, it := range script {
		fmt.Fprintf(&b, "  #%d %s\n", i, orcDescribe(it))
	}
	return b.String()
}

// orcShrink drops items one at a time while the script still fails.
func orcShrink(script []orcItem, opts orcRunOpts) []orcItem {
	opts.stats = nil
	cur := script
	for changed := true; changed; {
		changed = false
		for i := len(cur) - 1; i >= 0; i-- {
			cand := slices.Delete(slices.Clone(cur), i, i+1)
			if _, f := orcRun(cand, opts); f != "" {
				cur, changed = cand, true
			}
		}
	}
	return cur
}

// orcSession generates session i of the property test, deterministically.
func orcSession(i int) ([]orcItem, orcRunOpts) {
	r := rand.New(rand.NewPCG(0x5ea79a2d, uint64(i)))
	c := &orcRandChooser{r: r}
	script, cfg := orcGenerate(c, fmt.Sprintf("sess-%d", i), 12+r.IntN(60))
	opts := orcRunOpts{cfg: cfg}
	if r.IntN(4) == 0 {
		opts.twinAt = 1 + r.IntN(len(script)+1)
	}
	return script, opts
}

// orcPropSessions is how many random sessions the property test runs.
const orcPropSessions = 10000

func TestPropSessionsMatchOracle(t *testing.T) {
	start := time.Now()
	var (
		next, steps atomic.Int64
		failed      atomic.Bool
		mu          sync.Mutex
		failAt      = -1
		failMsg     string
		stats       = map[string]int{}
		wg          sync.WaitGroup
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			local := map[string]int{}
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= orcPropSessions {
					break
				}
				script, opts := orcSession(i)
				opts.stats = local
				n, f := orcRun(script, opts)
				steps.Add(int64(n))
				if f != "" {
					mu.Lock()
					if failAt < 0 || i < failAt {
						failAt, failMsg = i, f
					}
					mu.Unlock()
					failed.Store(true)
				}
			}
			mu.Lock()
			for k, v := range local {
				stats[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if failAt >= 0 {
		script, opts := orcSession(failAt)
		small := orcShrink(script, opts)
		_, f := orcRun(small, opts)
		t.Fatalf("session %d: %s\nminimal script (%d of %d events), %s", failAt, failMsg, len(small), len(script), orcDescribeAll(small, opts.cfg)+f)
	}
	keys := make([]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", strings.TrimPrefix(k, events.TypePrefix), stats[k])
	}
	t.Logf("%d sessions, %d steps in %v;%s", orcPropSessions, steps.Load(), time.Since(start).Round(time.Millisecond), b.String())
	// Every kind of outcome must have been reached, or the generator is too tame.
	for _, typ := range []string{events.TypeCompactionAllowed, "allowed, cured", events.TypeCompactionRefused, events.TypeTranscriptSpilled,
		events.TypeSessionHalted, events.TypeEventRejected, events.TypeCompactionViolation, "duplicate",
		"state_limit ledger.received", "state_limit ledger.truncated", "state_limit ledger.coverage", "state_limit ledger.halt",
		"state_limit ledger.waived", "state_limit ledger.snapshot", "violation forgotten", "violation never", "violation refused",
		"spill with previous", "halted at the quota", "at_risk cut", "unrecoverable cut", "coverage cut",
		"state_limit ledger.pinned", "carry_pins with a spill", "carry_pins without a spill", "refused, pin_dropped alone, cured", "allowed, carrying pins"} {
		require.Positive(t, stats[typ], "no %s in %d sessions", typ, orcPropSessions)
	}
}

// TestOracleRejectedFirstEventLeavesNoTrace: CONTRACT.md section 6 says a
// rejected event changes no state, not even for the first event a zero Ledger
// sees (found by the oracle: the ledger used to bind itself to its session).
func TestOracleRejectedFirstEventLeavesNoTrace(t *testing.T) {
	var l Ledger
	before, err := l.MarshalBinary()
	require.NoError(t, err)
	ev := &events.Event{ID: "e1", Source: "agent", Type: events.TypeTurnAppended, Subject: "s1",
		Body: &events.TurnAppended{Offset: 0, Size: 1}, Meta: events.Meta{Seq: 1}}
	res, err := Step(&l, Input{Event: ev}, Config{})
	require.NoError(t, err)
	require.False(t, res.Accepted)
	require.Len(t, res.Outputs, 1)
	require.Equal(t, events.TypeEventRejected, res.Outputs[0].Type)
	after, err := l.MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, before, after, "a rejected first event must not bind the ledger to its session")
}

func TestPropRangeSetMatchesBitmap(t *testing.T) {
	r := rand.New(rand.NewPCG(0xb17, 0x5e7))
	const width = 80
	randRange := func() Range {
		a := uint64(r.IntN(width + 1))
		b := a + uint64(r.IntN(width+1-int(a)))
		if r.IntN(12) == 0 {
			return Range{Start: b + 1, End: a} // reversed: holds nothing
		}
		if r.IntN(3) == 0 {
			b = min(a+uint64(r.IntN(4)), width) // short
		}
		return Range{Start: a, End: b}
	}
	randSet := func() (RangeSet, orcBits, []Range) {
		rs := make([]Range, r.IntN(7))
		for i := range rs {
			rs[i] = randRange()
		}
		return NewRangeSet(rs...), orcFromRanges(rs), rs
	}
	same := func(what string, got RangeSet, want orcBits, ctx ...any) {
		t.Helper()
		if msg := orcRepr(got); msg != "" {
			t.Fatalf("%s: representation broken: %s (%v)", what, msg, ctx)
		}
		if orcFromRanges(got.Ranges()) != want {
			t.Fatalf("%s = %v, bitmap says %v (%v)", what, got.Ranges(), want.ranges(), ctx)
		}
	}
	maxOf := func(b orcBits) uint64 {
		rs := b.ranges()
		if len(rs) == 0 {
			return 0
		}
		return rs[len(rs)-1].End
	}
	for iter := 0; iter < 20000; iter++ {
		s, sb, srs := randSet()
		u, ub, urs := randSet()
		q := randRange()
		qb := orcSpan(q.Start, q.End)
		x := uint64(r.IntN(width + 2))
		ctx := []any{"s from", srs, "u from", urs, "q", q, "x", x}
		sCopy := slices.Clone(s.r)

		same("NewRangeSet", s, sb, ctx...)
		same("Union", Union(s, u), sb.or(ub), ctx...)
		same("Intersect", Intersect(s, u), sb.and(ub), ctx...)
		same("Diff", Diff(s, u), sb.minus(ub), ctx...)
		same("RangeDiff", RangeDiff(q, u), qb.minus(ub), ctx...)
		same("Within", s.Within(q), sb.and(qb), ctx...)
		c := s.Clone()
		c.Add(q)
		same("Add", c, sb.or(qb), ctx...)
		c2 := s.Clone()
		c2.AddSet(u)
		same("AddSet", c2, sb.or(ub), ctx...)
		// A walk of single Adds, checking the representation at each.
		var w RangeSet
		var wb orcBits
		for range r.IntN(10) {
			a := randRange()
			w.Add(a)
			wb = wb.or(orcSpan(a.Start, a.End))
			same("Add walk", w, wb, ctx...)
		}
		if !slices.Equal(s.r, sCopy) {
			t.Fatalf("an operation changed its operand: %v became %v (%v)", sCopy, s.r, ctx)
		}
		checks := []struct {
			name      string
			got, want bool
		}{
			{"Has", s.Has(x), sb.has(x)},
			{"Covers", s.Covers(q), qb.within(sb)},
			{"Overlaps", s.Overlaps(q), !sb.and(qb).empty()},
			{"SubsetOf", s.SubsetOf(u), sb.within(ub)},
			{"Equal", s.Equal(u), sb == ub},
			{"Intersects", Intersects(s, u), !sb.and(ub).empty()},
			{"IsEmpty", s.IsEmpty(), sb.empty()},
		}
		for _, ch := range checks {
			if ch.got != ch.want {
				t.Fatalf("%s = %v, bitmap says %v (%v)", ch.name, ch.got, ch.want, ctx)
			}
		}
		if s.Count() != uint64(sb.count()) || s.Max() != maxOf(sb) || s.Len() != len(sb.ranges()) {
			t.Fatalf("Count/Max/Len = %d/%d/%d, bitmap says %d/%d/%d (%v)", s.Count(), s.Max(), s.Len(), sb.count(), maxOf(sb), len(sb.ranges()), ctx)
		}
	}
}

// TestOracleClosedWhileHaltedSnapshot: session.closed on a halted session
// keeps the halt ranges with the status closed, and the snapshot of that must
// read back (found by the property test: it used to be refused as corrupt).
func TestOracleClosedWhileHaltedSnapshot(t *testing.T) {
	var l Ledger
	seq := uint64(0)
	send := func(typ string, body any) Result {
		seq++
		ev := &events.Event{ID: fmt.Sprintf("e%d", seq), Source: "agent", Type: typ, Subject: "s1", Body: body, Meta: events.Meta{Seq: seq, Control: onControl(body)}}
		res, err := Step(&l, Input{Event: ev}, Config{Policy: PolicyHalt})
		require.NoError(t, err)
		return res
	}
	send(events.TypeSessionOpened, &events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 1, Unit: events.UnitTurns}})
	send(events.TypeTurnAppended, &events.TurnAppended{Offset: 0, Size: 2})
	send(events.TypeContextTruncated, &events.ContextTruncated{Range: events.Range{Start: 0, End: 1}})
	res := send(events.TypeCompactionRequested, &events.CompactionRequested{RequestID: "r1",
		SummarizerInput: events.Range{Start: 0, End: 2}, SummaryRange: events.Range{Start: 0, End: 1}, TailStart: 1})
	require.Len(t, res.Outputs, 1)
	require.Equal(t, events.TypeSessionHalted, res.Outputs[0].Type)
	require.True(t, send(events.TypeSessionClosed, &events.SessionClosed{}).Accepted)
	snap, err := l.MarshalBinary()
	require.NoError(t, err)
	var back Ledger
	require.NoError(t, back.UnmarshalBinary(snap), "a session closed while halted must restore from its snapshot")
	again, err := back.MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, snap, again)
}

// TestOracleOldDuplicateResumeLiftsHalt: CONTRACT.md says duplicate (source,
// id) pairs are applied once. Past the last-8-ids window and JetStream's dedupe
// window, a re-published session.resumed must still not lift a later halt: the
// ledger remembers every resume id (found by the oracle).
func TestOracleOldDuplicateResumeLiftsHalt(t *testing.T) {
	s := &orcBuilder{session: "s1"}
	s.open(events.UnitTurns, events.UnitTurns, 1)
	s.add(events.TypeTurnAppended, &events.TurnAppended{Offset: 1, Size: 1}) // [0, 1) never arrives
	s.request("r1", Range{Start: 0, End: 2}, Range{Start: 0, End: 1}, 1, false)
	resume := s.add(events.TypeSessionResumed, &events.SessionResumed{Note: "accept [0, 1) as lost"})
	s.turns(2, 11)
	s.add(events.TypeTurnAppended, &events.TurnAppended{Offset: 12, Size: 1}) // [11, 12) never arrives
	s.request("r2", Range{Start: 0, End: 13}, Range{Start: 0, End: 12}, 12, false)
	again := *resume
	s.seq++
	again.Meta.Seq = s.seq
	s.items = append(s.items, orcItem{ev: &again})
	s.request("r3", Range{Start: 0, End: 13}, Range{Start: 0, End: 12}, 12, false)
	var l Ledger
	var last Result
	for _, it := range s.items {
		res, err := Step(&l, Input{Event: it.ev}, Config{Policy: PolicyHalt})
		require.NoError(t, err)
		last = res
	}
	require.Len(t, last.Outputs, 1)
	ref, ok := last.Outputs[0].Data.(*events.CompactionRefused)
	require.True(t, ok, "%s→ the re-sent resume %s must not lift the later halt; r3 got %s",
		orcDescribeAll(s.items, Config{Policy: PolicyHalt}), again.ID, last.Outputs[0].Type)
	require.Equal(t, events.ReasonSessionHalted, ref.Reasons[0].Code)
}
