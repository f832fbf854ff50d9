package inspect

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor/ledger"
)

// DefaultWidth is the number of cells the bar takes when TextOptions.Width
// is 0.
const DefaultWidth = 64

// TextOptions says how WriteText draws. The zero value draws plain
// characters in DefaultWidth cells.
type TextOptions struct {
	// Color draws with ANSI colours (for a terminal).
	Color bool
	// Width is the most cells the bar over [0, head) takes; 0 means
	// DefaultWidth, and values under 16 are taken as 16. A head smaller
	// than Width gets up to 4 cells per offset; a larger one shares cells,
	// and a cell shows the most severe class among its offsets.
	Width int
}

// labelWidth is the width of the row names left of the bar.
const labelWidth = 12

// WriteText draws the model for a terminal: a header, the bar with its
// axis, the floor and the legend with every set's ranges, then the decision
// history. Every string of the model is printed escaped (see safe): ids,
// names and messages come from the wire.
func WriteText(w io.Writer, m *Model, o TextOptions) error {
	bw := bufio.NewWriter(w)
	t := &textWriter{w: bw, color: o.Color}
	t.header(m)
	if m.Head == 0 {
		t.line("  nothing received yet: the transcript [0, 0) is empty")
	} else {
		t.bar(m, o.Width)
	}
	t.legend(m)
	t.history(m)
	t.unattributed(m)
	return bw.Flush()
}

type textWriter struct {
	w     *bufio.Writer
	color bool
}

func (t *textWriter) line(format string, args ...any) {
	t.w.WriteString(strings.TrimRight(fmt.Sprintf(format, args...), " "))
	t.w.WriteByte('\n')
}

// safe escapes a string of the model for a terminal: request ids, event
// ids, field names and messages are the agents' to choose, and a control
// character in one must not act on the operator's terminal. Every string
// of the model that WriteText and WriteSVG print goes through it.
func safe[S ~string](s S) string { return termtext.Escape(string(s)) }

// paint wraps s in an SGR sequence when colours are on.
func (t *textWriter) paint(sgr, s string) string {
	if !t.color || sgr == "" {
		return s
	}
	return "\x1b[" + sgr + "m" + s + "\x1b[0m"
}

func (t *textWriter) header(m *Model) {
	status := safe(m.Status)
	if m.Status == "halted" {
		status = t.paint("31;1", "HALTED")
	}
	t.line("session %s: %s", safe(m.Session), status)
	t.line("  unit %s, head %d, %s", unitName(m.Unit), m.Head, floorText(m))
	switch m.State.From {
	case "events":
		t.line("  ledger rebuilt from stream %s: %d messages, applied up to seq %d (%d accepted events)", safe(m.State.Name), m.State.Events, m.State.Seq, m.Accepted)
	default:
		t.line("  ledger from bucket %s, applied up to events seq %d (%d accepted events)", safe(m.State.Name), m.State.Seq, m.Accepted)
	}
	if m.LastSpill != nil {
		t.line("  spills: %d, newest %s (%s)", m.Spills, safe(m.LastSpill.Name), safe(m.LastSpill.Digest))
		if m.LastSpill.Previous != nil {
			t.line("  it holds the events after %s: `seamguard spill get %s` reads the whole chain", safe(*m.LastSpill.Previous), safe(m.LastSpill.Name))
		}
	} else {
		t.line("  spills: none")
	}
	if m.Halt != nil {
		t.line("  %s by compaction \"%s\": offsets %s cannot be recovered; every compaction is refused until `seamguard resume %s --note ...`",
			t.paint("31;1", "halted"), safe(m.Halt.Request), ledger.FormatRanges(m.Halt.Unrecoverable), safe(m.Session))
	}
	if pk := m.Parked; pk != nil {
		t.line("  %s since %s (stuck since %s, by %s): %s; its inputs after events sequence %d wait in the events stream, unapplied, until `seamguard resume %s --note ...`",
			t.paint("31;1", "PARKED"), pk.ParkedAt.UTC().Format(time.RFC3339), pk.StuckSince.UTC().Format(time.RFC3339), safe(pk.By), safe(pk.Cause), pk.StoredSeq, safe(m.Session))
	}
	if m.Pending != "" {
		t.line("  a spill for compaction \"%s\" was asked for and its result is not applied yet", safe(m.Pending))
	}
	t.line("")
}

func unitName(u events.Unit) string {
	if u == "" {
		return "(none)"
	}
	return safe(u)
}

func floorText(m *Model) string {
	f := m.Floor
	if f.Span == 0 {
		return "no recovery floor (span 0)"
	}
	s := fmt.Sprintf("recovery floor %d %s %s", f.Span, unitName(f.Unit), fmtRange(f.Range))
	if f.Unit != m.Unit {
		s += fmt.Sprintf(" (the floor counts %s but the session counts %s: unit_mismatch)", unitName(f.Unit), unitName(m.Unit))
	}
	return s
}

func fmtRange(r Range) string { return fmt.Sprintf("[%d, %d)", r.Start, r.End) }

// scale maps the cells of the bar to offsets of [0, head).
type scale struct {
	head  uint64
	cells int
}

func newScale(head uint64, width int) scale {
	if width == 0 {
		width = DefaultWidth
	}
	width = max(width, 16)
	cells := width
	if head <= uint64(width) {
		k := min(4, width/int(head))
		cells = int(head) * k
	}
	return scale{head: head, cells: cells}
}

// lo is the first offset of cell i; cell i covers [lo(i), hi(i)).
func (s scale) lo(i int) uint64 { return uint64(i) * s.head / uint64(s.cells) }

func (s scale) hi(i int) uint64 {
	return max(uint64(i+1)*s.head/uint64(s.cells), s.lo(i)+1)
}

// first and last return the first and the last cell that show offset x.
func (s scale) first(x uint64) int {
	return sort.Search(s.cells, func(i int) bool { return s.hi(i) > x })
}

func (s scale) last(x uint64) int {
	return sort.Search(s.cells, func(i int) bool { return s.lo(i) > x }) - 1
}

// row draws one track: each cell shows the most severe class among the
// segments that overlap it, blank where there is none.
func (s scale) row(segs []Segment) []Class {
	out := make([]Class, s.cells)
	j := 0
	for i := range out {
		a, b := s.lo(i), s.hi(i)
		for j < len(segs) && segs[j].End <= a {
			j++
		}
		for k := j; k < len(segs) && segs[k].Start < b; k++ {
			if segs[k].Class.severity() > out[i].severity() {
				out[i] = segs[k].Class
			}
		}
	}
	return out
}

// ticks returns the offsets to label on the axis: multiples of a round step
// far enough apart for their labels, and head.
func (s scale) ticks() []uint64 {
	space := max(8, len(strconv.FormatUint(s.head, 10))+2)
	need := (uint64(space)*s.head + uint64(s.cells) - 1) / uint64(s.cells)
	step := uint64(1)
	for m := uint64(1); ; m *= 10 {
		if c := niceAbove(m, need); c != 0 {
			step = c
			break
		}
	}
	var out []uint64
	for x := uint64(0); x < s.head; x += step {
		out = append(out, x)
	}
	return append(out, s.head)
}

// niceAbove returns the first of m, 2m, 5m that is at least need, or 0.
func niceAbove(m, need uint64) uint64 {
	for _, f := range []uint64{1, 2, 5} {
		if f*m >= need {
			return f * m
		}
	}
	return 0
}

func (t *textWriter) bar(m *Model, width int) {
	s := newScale(m.Head, width)
	pad := strings.Repeat(" ", labelWidth)

	// The axis: labels over ticks. head sits just past the last cell.
	type label struct {
		col  int
		text string
	}
	var labels []label
	for _, x := range s.ticks() {
		col := s.cells
		if x < m.Head {
			col = s.first(x)
		}
		l := label{col, strconv.FormatUint(x, 10)}
		for len(labels) > 1 && labels[len(labels)-1].col+len(labels[len(labels)-1].text) >= col {
			labels = labels[:len(labels)-1] // head wins over the tick before it
		}
		labels = append(labels, l)
	}
	n := s.cells + len(labels[len(labels)-1].text) + 1
	nums, marks := []byte(strings.Repeat(" ", n)), []byte(strings.Repeat(" ", n))
	for _, l := range labels {
		copy(nums[l.col:], l.text)
		marks[l.col] = '|'
	}
	t.line("%s%s", pad, strings.TrimRight(string(nums), " "))
	t.line("%s%s", pad, strings.TrimRight(string(marks), " "))

	t.track("context", s.row(m.Context))
	if len(m.Backup) == 0 {
		t.line("  %-*s(nothing else needed: the context holds every offset)", labelWidth-2, "backup")
	} else {
		t.track("backup", s.row(m.Backup))
	}
	if len(m.Pins) == 0 {
		t.line("  %-*s(no pinned turns)", labelWidth-2, "pinned")
	} else {
		t.track("pinned", s.row(m.Pins))
	}

	f := m.Floor
	if f.Span > 0 && !f.Range.Empty() {
		a, b := s.first(f.Range.Start), s.last(f.Range.End-1)
		row := []byte(strings.Repeat(" ", b+1))
		for i := a; i <= b; i++ {
			row[i] = '-'
		}
		row[a], row[b] = '[', ')'
		if a == b {
			row[a] = '^'
		}
		t.line("  %-*s%s%s  %s", labelWidth-2, "floor", row[:a], t.paint("1", string(row[a:])), fmtRange(f.Range))
	}
	t.line("")
}

func (t *textWriter) track(name string, cells []Class) {
	var b strings.Builder
	for i := 0; i < len(cells); {
		c := cells[i]
		j := i
		for j < len(cells) && cells[j] == c {
			j++
		}
		if c == "" {
			b.WriteString(strings.Repeat(" ", j-i))
		} else {
			st := styles[c]
			b.WriteString(t.paint(st.sgr, strings.Repeat(string(st.mark), j-i)))
		}
		i = j
	}
	t.line("  %-*s%s", labelWidth-2, name, strings.TrimRight(b.String(), " "))
}

// legend lists each class with its mark and the ranges the bar shows in
// it, then the ledger's own sets.
func (t *textWriter) legend(m *Model) {
	for _, group := range []struct {
		name    string
		classes []Class
	}{{"context track (what the working context holds)", contextOrder}, {"backup track (what else holds an offset)", backupOrder},
		{"pinned track (turns that must stay in the working context)", pinnedOrder}} {
		t.line("  %s:", group.name)
		for _, c := range group.classes {
			st := styles[c]
			t.line("    %s %-36s %s", t.paint(st.sgr, string(st.mark)), st.legend, ledger.FormatRanges(m.classRanges(c)))
		}
	}
	t.line("  ledger sets: received %s; truncated T %s; committed K %s; spilled P %s; waived W %s; pinned N %s",
		ledger.FormatRanges(m.Sets.Received), ledger.FormatRanges(m.Sets.Truncated), ledger.FormatRanges(m.Sets.Committed),
		ledger.FormatRanges(m.Sets.Spilled), ledger.FormatRanges(m.Sets.Waived), ledger.FormatRanges(m.Sets.Pinned))
	t.line("")
}

// unattributed lists the messages that failed verification, which the
// history leaves out.
func (t *textWriter) unattributed(m *Model) {
	if len(m.Unattributed) == 0 {
		return
	}
	t.line("%s %d message(s) on this session's verdict subjects failed verification and are left out above: no trusted seamguard processor published them as they are",
		t.paint(kindSGR[events.KindHalted], "UNATTRIBUTED:"), len(m.Unattributed))
	for _, u := range m.Unattributed {
		claims := ""
		if u.Type != "" {
			claims = fmt.Sprintf(" (claims %s %s of session %s)", safe(strings.TrimPrefix(u.Type, events.TypePrefix)), safe(u.ID), safe(u.Session))
		}
		t.line("  #%-4d %s on %s%s: %s", u.Seq, safe(u.Reason), safe(u.Subject), claims, safe(u.Message))
	}
}

func (t *textWriter) history(m *Model) {
	if len(m.History) == 0 {
		t.line("decisions: none in %s", safe(m.Verdicts))
		return
	}
	t.line("decisions: %d verdict(s) in %s, by verdict stream sequence", len(m.History), safe(m.Verdicts))
	for _, e := range m.History {
		when := ""
		if !e.Time.IsZero() {
			when = e.Time.UTC().Format("2006-01-02T15:04:05Z") + "  "
		}
		kind := t.paint(kindSGR[e.Kind], fmt.Sprintf("%-9s", safe(e.Kind)))
		head := fmt.Sprintf("  #%-4d %s%s", e.Seq, when, kind)
		cause := ""
		if e.CausationID != "" {
			cause = " (event " + safe(e.CausationID) + ")"
		}
		switch d := e.Data.(type) {
		case *events.CompactionAllowed:
			s := fmt.Sprintf("%s %s%s: summary %s, tail from %d, head %d", head, safe(d.RequestID), cause, ledger.FormatRanges(d.SummaryCoverage), d.TailStart, d.Head)
			if len(d.Cured) > 0 {
				codes := make([]string, len(d.Cured))
				for i, c := range d.Cured {
					codes[i] = safe(c)
				}
				s += "; cured " + strings.Join(codes, ", ")
				for _, h := range d.RecoveredBy {
					s += " by " + safe(h.Name)
				}
			}
			t.line("%s%s", s, t.pins(e))
		case *events.CompactionRefused:
			s := fmt.Sprintf("%s %s%s: next %s", head, safe(d.RequestID), cause, safe(d.Next))
			if d.Spill != nil {
				s += ", spill " + safe(d.Spill.Name)
			}
			if len(d.Cured) > 0 {
				codes := make([]string, len(d.Cured))
				for i, c := range d.Cured {
					codes[i] = safe(c)
				}
				s += "; cured " + strings.Join(codes, ", ")
			}
			t.line("%s%s", s, t.pins(e))
			for _, r := range d.Reasons {
				t.line("          %-20s at risk %s", safe(r.Code), ledger.FormatRanges(r.AtRisk))
			}
		case *events.SpillHandle:
			t.line("%s %s%s: %s in bucket %s, %d events (seq %d to %d), %d bytes, %s%s", head, safe(d.Name), cause, fmtRange(d.Range), safe(d.Bucket), d.Events, d.FirstSeq, d.LastSeq, d.Size, safe(d.Digest), afterSpill(d))
		case *events.SessionHalted:
			t.line("%s %s%s: unrecoverable %s", head, safe(d.RequestID), cause, ledger.FormatRanges(d.Unrecoverable))
		case *events.EventRejected:
			t.line("%s %s at %s, input seq %d%s: %s", head, safe(d.Code), safe(d.Field), d.Input.Seq, cause, safe(d.Message))
		case *events.CompactionViolation:
			t.line("%s %s%s: %s", head, safe(d.RequestID), cause, safe(d.Message))
		default:
			t.line("%s %s%s", head, safe(e.Type), cause)
		}
	}
}

// pins says which pinned offsets a verdict's request carried and which it
// would drop.
func (t *textWriter) pins(e Entry) string {
	s := ""
	if len(e.CarriedPins) > 0 {
		s += "; carried pins " + ledger.FormatRanges(e.CarriedPins)
	}
	if len(e.DroppedPins) > 0 {
		s += "; " + t.paint(styles[Hole].sgr, "DROPS PINNED "+ledger.FormatRanges(e.DroppedPins))
	}
	return s
}

// afterSpill names the spill before h in its chain, if any.
func afterSpill(h *events.SpillHandle) string {
	if h.Previous == nil {
		return ""
	}
	return ", after " + safe(*h.Previous)
}
