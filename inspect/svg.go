package inspect

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// SVG geometry, in pixels.
const (
	svgWidth   = 1000.0
	svgLeft    = 24.0  // left margin, where row names start
	svgBarX0   = 150.0 // where [0, head) starts
	svgBarX1   = 970.0 // where it ends
	svgCtxH    = 36.0  // context track height
	svgBackH   = 16.0  // backup track height
	svgPinH    = 12.0  // pinned track height
	svgRowH    = 50.0  // one decision
	svgFont    = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
	svgInk     = "#222222"
	svgMuted   = "#5F5F5F"
	svgTrackBG = "#F2F2F2"
)

// textOn is the ink that reads on each fill.
var textOn = map[Class]string{
	Summary: "#FFFFFF", Tail: "#FFFFFF", Truncated: "#000000", Gap: "#000000",
	Spilled: "#000000", Waived: "#FFFFFF", Hole: "#FFFFFF", Pinned: "#000000",
}

// WriteSVG draws the same picture as WriteText as a standalone SVG
// document: the three tracks over an axis of offsets, the recovery floor, a
// legend with every set's ranges, and the decision history as a timeline of
// rows, each with the offsets its verdict names drawn to the same scale.
func WriteSVG(w io.Writer, m *Model) error {
	bw := bufio.NewWriter(w)
	s := &svgWriter{m: m}
	height := s.draw()
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="%s">`+"\n",
		num(svgWidth), num(height), num(svgWidth), num(height), svgFont)
	fmt.Fprintf(bw, "<title>seamguard ledger of session %s</title>\n", esc(m.Session))
	bw.WriteString(s.body.String())
	bw.WriteString("</svg>\n")
	return bw.Flush()
}

// svgWriter writes the body of the document; its height is known at the
// end.
type svgWriter struct {
	body strings.Builder
	m    *Model
}

func (s *svgWriter) p(format string, args ...any) {
	fmt.Fprintf(&s.body, format, args...)
	s.body.WriteByte('\n')
}

// esc escapes text for XML, after safe: XML 1.0 allows no control
// character, not even as a character reference.
func esc(v string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(safe(v)))
	return b.String()
}

func num(f float64) string { return strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64) }

// x maps an offset to its position on the bar.
func (s *svgWriter) x(off uint64) float64 {
	if s.m.Head == 0 {
		return svgBarX0
	}
	return svgBarX0 + float64(off)*(svgBarX1-svgBarX0)/float64(s.m.Head)
}

func (s *svgWriter) text(x, y float64, size int, fill, anchor, weight, v string) {
	attrs := ""
	if anchor != "" && anchor != "start" {
		attrs += ` text-anchor="` + anchor + `"`
	}
	if weight != "" {
		attrs += ` font-weight="` + weight + `"`
	}
	s.p(`<text x="%s" y="%s" font-size="%d" fill="%s"%s>%s</text>`, num(x), num(y), size, fill, attrs, esc(v))
}

// draw writes the body and returns the height it takes.
func (s *svgWriter) draw() float64 {
	m := s.m
	s.p("%s", `<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">`+
		`<rect width="6" height="6" fill="`+styles[Hole].fill+`"/><rect width="2.5" height="6" fill="#FFFFFF" fill-opacity="0.55"/></pattern></defs>`)
	s.p(`<rect width="100%%" height="100%%" fill="#FFFFFF"/>`)

	y := 32.0
	title := fmt.Sprintf("%s: %s", m.Session, m.Status)
	s.text(svgLeft, y, 20, svgInk, "", "bold", title)
	y += 22
	s.text(svgLeft, y, 13, svgMuted, "", "", fmt.Sprintf("unit %s · head %d · %s", unitName(m.Unit), m.Head, floorText(m)))
	y += 18
	origin := fmt.Sprintf("ledger from bucket %s, applied up to events seq %d", m.State.Name, m.State.Seq)
	if m.State.From == "events" {
		origin = fmt.Sprintf("ledger rebuilt from stream %s (%d messages), applied up to seq %d", m.State.Name, m.State.Events, m.State.Seq)
	}
	if m.LastSpill != nil {
		origin += fmt.Sprintf(" · %d spill(s), newest %s", m.Spills, m.LastSpill.Name)
	}
	s.text(svgLeft, y, 13, svgMuted, "", "", origin)
	if m.Halt != nil {
		y += 22
		s.p(`<rect x="%s" y="%s" width="%s" height="20" rx="3" fill="%s"/>`, num(svgLeft), num(y-14), num(svgBarX1-svgLeft), styles[Hole].fill)
		s.text(svgLeft+8, y, 13, "#FFFFFF", "", "bold", fmt.Sprintf("HALTED by compaction %q: offsets %s cannot be recovered until an operator resumes the session",
			m.Halt.Request, ledger.FormatRanges(m.Halt.Unrecoverable)))
	}
	y += 36
	s.bar(y)
	y += 112 + svgPinH + 6
	y = s.legend(y)
	return s.history(y+12) + 16
}

// bar draws the axis at y, the three tracks under it and the floor bracket.
func (s *svgWriter) bar(y float64) {
	m := s.m
	ctxY := y + 10
	backY := ctxY + svgCtxH + 6
	pinY := backY + svgBackH + 6
	// Axis: round ticks far enough apart, and head at the end.
	if m.Head > 0 {
		// About 7 pixels a character: ticks at least 8 characters apart.
		sc := scale{head: m.Head, cells: int(svgBarX1-svgBarX0) / 7}
		s.text(svgLeft, y-2, 11, svgMuted, "", "", "offset ("+unitName(m.Unit)+")")
		ticks := sc.ticks()
		for i, t := range ticks {
			x := s.x(t)
			if i < len(ticks)-1 && t != 0 && svgBarX1-x < 40 {
				continue // too close to head's label
			}
			weight := ""
			if t == m.Head {
				weight = "bold"
			}
			s.text(x, y-2, 12, svgInk, "middle", weight, strconv.FormatUint(t, 10))
			s.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1"/>`, num(x), num(y+1), num(x), num(pinY+svgPinH), "#BBBBBB")
		}
	}
	s.text(svgLeft, ctxY+svgCtxH/2+5, 13, svgInk, "", "bold", "context")
	s.text(svgLeft, backY+svgBackH/2+4, 12, svgInk, "", "", "backup")
	s.text(svgLeft, pinY+svgPinH/2+4, 11, svgInk, "", "", "pinned")
	s.p(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`, num(svgBarX0), num(ctxY), num(svgBarX1-svgBarX0), num(svgCtxH), svgTrackBG)
	s.p(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`, num(svgBarX0), num(backY), num(svgBarX1-svgBarX0), num(svgBackH), svgTrackBG)
	s.p(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`, num(svgBarX0), num(pinY), num(svgBarX1-svgBarX0), num(svgPinH), svgTrackBG)
	labels := s.segments(m.Context, ctxY, svgCtxH, true)
	labels = append(labels, s.segments(m.Backup, backY, svgBackH, false)...)
	labels = append(labels, s.segments(m.Pins, pinY, svgPinH, false)...)
	if len(m.Backup) == 0 {
		s.text((svgBarX0+svgBarX1)/2, backY+svgBackH/2+4, 10, svgMuted, "middle", "", "nothing else needed: the context holds every offset")
	}
	if len(m.Pins) == 0 {
		s.text((svgBarX0+svgBarX1)/2, pinY+svgPinH/2+3.5, 9, svgMuted, "middle", "", "no pinned turns")
	}
	for _, tr := range []struct{ y, h float64 }{{ctxY, svgCtxH}, {backY, svgBackH}, {pinY, svgPinH}} {
		s.p(`<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="%s" stroke-width="1"/>`, num(svgBarX0), num(tr.y), num(svgBarX1-svgBarX0), num(tr.h), svgInk)
	}

	// The recovery floor: a bracket under the tracks, and a dashed line
	// where it starts.
	f := m.Floor
	fy := pinY + svgPinH + 14
	if f.Span > 0 && !f.Range.Empty() {
		x0, x1 := s.x(f.Range.Start), s.x(f.Range.End)
		s.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1.5" stroke-dasharray="4 3"/>`, num(x0), num(ctxY-4), num(x0), num(fy), svgInk)
		s.p(`<path d="M%s %sV%sH%sV%s" fill="none" stroke="%s" stroke-width="2"/>`, num(x0), num(fy-6), num(fy), num(x1), num(fy-6), svgInk)
		label := fmt.Sprintf("recovery floor %s: last %d %s", fmtRange(f.Range), f.Span, unitName(f.Unit))
		anchor, lx := "middle", (x0+x1)/2
		if est := float64(len(label)) * 6.6; lx+est/2 > svgBarX1+20 {
			anchor, lx = "end", x1
		} else if lx-est/2 < svgBarX0 {
			anchor, lx = "start", x0
		}
		s.text(lx, fy+16, 12, svgInk, anchor, "bold", label)
	} else {
		s.text(svgBarX0, fy+16, 12, svgMuted, "", "", "no recovery floor")
	}
	// Range labels go over everything else, the floor's line included.
	for _, l := range labels {
		l()
	}
}

// segments fills a track. Segments wide enough for it get their range
// written in; segments returns those labels to be drawn last. tall is the
// context track; the short one gets smaller labels.
func (s *svgWriter) segments(segs []Segment, y, h float64, tall bool) []func() {
	var labels []func()
	for _, g := range segs {
		x0, x1 := s.x(g.Start), s.x(g.End)
		minW := 1.0
		if g.Class == Hole || g.Class == Gap || g.Class == Truncated || g.Class == Pinned {
			minW = 2.5 // a lone offset of a long session must still show
		}
		if x1-x0 < minW {
			x1 = x0 + minW
		}
		fill := styles[g.Class].fill
		if g.Class == Hole {
			fill = "url(#hatch)"
		}
		s.p(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s %s</title></rect>`,
			num(x0), num(y), num(x1-x0), num(h), fill, g.Class, fmtRange(Range{Start: g.Start, End: g.End}))
		size, char := 11, 6.6
		if !tall {
			size, char = int(min(10, h-4)), min(6.0, (h-4)*0.6)
		}
		text := fmt.Sprintf("%s %s", g.Class, fmtRange(Range{Start: g.Start, End: g.End}))
		if float64(len(text))*char+8 > x1-x0 {
			text = fmtRange(Range{Start: g.Start, End: g.End})
		}
		if float64(len(text))*char+8 <= x1-x0 {
			x, ty, ink, halo := (x0+x1)/2, y+h/2+float64(size)/2-1.5, textOn[g.Class], styles[g.Class].fill
			w := float64(len(text))*char + 4
			// A patch of the segment's own colour keeps the floor's line
			// from crossing the label.
			labels = append(labels, func() {
				s.p(`<rect x="%s" y="%s" width="%s" height="%d" fill="%s"/>`, num(x-w/2), num(ty-float64(size)), num(w), size+3, halo)
				s.text(x, ty, size, ink, "middle", "bold", text)
			})
		}
	}
	return labels
}

// legend writes the classes in two columns with their ranges; it returns
// the y under it.
func (s *svgWriter) legend(y float64) float64 {
	m := s.m
	col := func(x, yy float64, title string, classes []Class) float64 {
		s.text(x, yy, 13, svgInk, "", "bold", title)
		for _, c := range classes {
			yy += 21
			fill := styles[c].fill
			if c == Hole {
				fill = "url(#hatch)"
			}
			s.p(`<rect x="%s" y="%s" width="14" height="14" fill="%s" stroke="%s" stroke-width="0.5"/>`, num(x), num(yy-11), fill, svgInk)
			s.text(x+22, yy, 12, svgInk, "", "", styles[c].legend)
			s.text(x+260, yy, 12, svgInk, "", "bold", ledger.FormatRanges(m.classRanges(c)))
		}
		return yy
	}
	a := col(svgLeft, y, "context track: what the working context holds", contextOrder)
	a = col(svgLeft, a+28, "pinned track: what must stay in the context", pinnedOrder)
	b := col(svgLeft+490, y, "backup track: what else holds it", backupOrder)
	b += 21
	s.text(svgLeft+490, b, 12, svgMuted, "", "", fmt.Sprintf("ledger sets: received %s; T %s; K %s; N %s",
		ledger.FormatRanges(m.Sets.Received), ledger.FormatRanges(m.Sets.Truncated), ledger.FormatRanges(m.Sets.Committed), ledger.FormatRanges(m.Sets.Pinned)))
	return max(a, b) + 14
}

// history draws one row per verdict: a badge with its kind, a line of
// text, and the offsets it names on the bar's scale. It returns the y
// under it.
func (s *svgWriter) history(y float64) float64 {
	m := s.m
	s.p(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#CCCCCC"/>`, num(svgLeft), num(y-8), num(svgBarX1), num(y-8))
	y += 12
	if len(m.History) == 0 {
		s.text(svgLeft, y, 13, svgInk, "", "bold", "Decisions: none in "+m.Verdicts)
		return y
	}
	s.text(svgLeft, y, 13, svgInk, "", "bold", fmt.Sprintf("Decisions: %d verdict(s) in %s, oldest first", len(m.History), m.Verdicts))
	y += 14
	for _, e := range m.History {
		s.entry(e, y)
		y += svgRowH
	}
	return y - svgRowH + 40
}

func (s *svgWriter) entry(e Entry, y float64) {
	m := s.m
	fill := kindFill[e.Kind]
	if fill == "" {
		fill = svgMuted
	}
	s.p(`<rect x="%s" y="%s" width="76" height="18" rx="9" fill="%s"/>`, num(svgLeft), num(y), fill)
	ink := "#FFFFFF"
	if e.Kind == "refused" || e.Kind == "spilled" {
		ink = "#000000"
	}
	s.text(svgLeft+38, y+13, 11, ink, "middle", "bold", e.Kind)
	s.text(svgBarX0, y+13, 12, svgInk, "", "", entryLine(e))
	meta := fmt.Sprintf("#%d", e.Seq)
	if !e.Time.IsZero() {
		meta += " " + e.Time.UTC().Format("15:04:05")
	}
	s.text(svgLeft, y+36, 10, svgMuted, "", "", meta)

	// The offsets the verdict is about, to the bar's scale.
	ty := y + 24
	s.p(`<rect x="%s" y="%s" width="%s" height="10" fill="%s"/>`, num(svgBarX0), num(ty), num(svgBarX1-svgBarX0), svgTrackBG)
	mark := func(rs []Range, class Class) {
		for _, r := range rs {
			if r.Empty() || m.Head == 0 {
				continue
			}
			x0, x1 := s.x(min(r.Start, m.Head)), s.x(min(r.End, m.Head))
			if x1-x0 < 2.5 {
				x1 = x0 + 2.5
			}
			fill := styles[class].fill
			if class == Hole {
				fill = "url(#hatch)"
			}
			s.p(`<rect x="%s" y="%s" width="%s" height="10" fill="%s"/>`, num(x0), num(ty), num(x1-x0), fill)
		}
	}
	switch d := e.Data.(type) {
	case *events.CompactionAllowed:
		mark(d.SummaryCoverage, Summary)
		mark([]Range{{Start: d.TailStart, End: d.Head}}, Tail)
		mark(e.CarriedPins, Pinned)
	case *events.CompactionRefused:
		for _, r := range d.Reasons {
			if r.Code != events.ReasonPinDropped {
				mark(r.AtRisk, Hole)
			}
		}
		mark(e.CarriedPins, Pinned)
		// Dropped pins over the rest, in the pinned colour with a red
		// frame: the rule the compaction would take out of the context.
		for _, r := range e.DroppedPins {
			if r.Empty() || m.Head == 0 {
				continue
			}
			x0, x1 := s.x(min(r.Start, m.Head)), s.x(min(r.End, m.Head))
			if x1-x0 < 2.5 {
				x1 = x0 + 2.5
			}
			s.p(`<rect x="%s" y="%s" width="%s" height="10" fill="%s" stroke="%s" stroke-width="1.5"><title>dropped pins %s</title></rect>`,
				num(x0), num(ty), num(x1-x0), styles[Pinned].fill, styles[Hole].fill, fmtRange(r))
		}
	case *events.SpillHandle:
		mark([]Range{d.Range}, Spilled)
	case *events.SessionHalted:
		mark(d.Unrecoverable, Hole)
	}
}

// entryLine is the one line of text of a verdict in the SVG.
func entryLine(e Entry) string {
	switch d := e.Data.(type) {
	case *events.CompactionAllowed:
		s := fmt.Sprintf("%s: summary %s, tail from %d, head %d", d.RequestID, ledger.FormatRanges(d.SummaryCoverage), d.TailStart, d.Head)
		if len(d.Cured) > 0 {
			codes := make([]string, len(d.Cured))
			for i, c := range d.Cured {
				codes[i] = string(c)
			}
			s += "; cured " + strings.Join(codes, ", ")
			for _, h := range d.RecoveredBy {
				s += " by " + h.Name
			}
		}
		return s + pinsLine(e)
	case *events.CompactionRefused:
		parts := make([]string, 0, len(d.Reasons))
		for _, r := range d.Reasons {
			parts = append(parts, fmt.Sprintf("%s at risk %s", r.Code, ledger.FormatRanges(r.AtRisk)))
		}
		s := fmt.Sprintf("%s: %s; next %s", d.RequestID, strings.Join(parts, "; "), d.Next)
		if d.Spill != nil {
			s += "; spill " + d.Spill.Name
		}
		if len(d.Cured) > 0 {
			codes := make([]string, len(d.Cured))
			for i, c := range d.Cured {
				codes[i] = string(c)
			}
			s += "; cured " + strings.Join(codes, ", ")
		}
		return s + pinsLine(e)
	case *events.SpillHandle:
		return fmt.Sprintf("%s: %s, %d events (seq %d to %d), %d bytes, %s%s", d.Name, fmtRange(d.Range), d.Events, d.FirstSeq, d.LastSeq, d.Size, d.Digest, afterSpill(d))
	case *events.SessionHalted:
		return fmt.Sprintf("%s: unrecoverable %s", d.RequestID, ledger.FormatRanges(d.Unrecoverable))
	case *events.EventRejected:
		return fmt.Sprintf("%s at %s, input seq %d: %s", d.Code, d.Field, d.Input.Seq, abbreviate(d.Message, 110))
	case *events.CompactionViolation:
		return fmt.Sprintf("%s: %s", d.RequestID, abbreviate(d.Message, 110))
	}
	return e.Type
}

// pinsLine says which pins a verdict's request carried and which it
// would drop.
func pinsLine(e Entry) string {
	s := ""
	if len(e.CarriedPins) > 0 {
		s += "; carried pins " + ledger.FormatRanges(e.CarriedPins)
	}
	if len(e.DroppedPins) > 0 {
		s += "; DROPS PINNED " + ledger.FormatRanges(e.DroppedPins)
	}
	return s
}

func abbreviate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
