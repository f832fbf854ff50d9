package inspect

// style is how one class looks: its mark in plain text, its colours on a
// terminal (an SGR parameter list: background and foreground), its fill in
// SVG, and its name in the legend. The SVG fills are the Okabe-Ito palette,
// which stays distinct for the common kinds of colour blindness; the marks
// keep the classes apart without colour at all.
type style struct {
	mark   byte
	sgr    string
	fill   string
	legend string
}

var styles = map[Class]style{
	Summary:   {'=', "44;97", "#0072B2", "summary: committed coverage (K)"},
	Tail:      {'#', "42;30", "#009E73", "tail: verbatim, not truncated"},
	Truncated: {'x', "43;30", "#E69F00", "truncated (T), in no summary"},
	Gap:       {'?', "45;97", "#CC79A7", "gap: never received"},
	Spilled:   {'s', "46;30", "#56B4E9", "spilled (P): a spill holds it"},
	Waived:    {'~', "100;97", "#8C8C8C", "waived (W): accepted as lost"},
	Hole:      {'!', "41;97;1", "#D55E00", "hole: nothing holds it"},
	Pinned:    {'*', "103;30", "#F0E442", "pinned (N): kept in the context"},
}

// contextOrder, backupOrder and pinnedOrder are the legend's order.
var (
	contextOrder = []Class{Summary, Tail, Truncated, Gap}
	backupOrder  = []Class{Spilled, Waived, Hole}
	pinnedOrder  = []Class{Pinned}
)

// kindFill colours a verdict kind in the SVG history; kindSGR on a terminal.
var kindFill = map[string]string{
	"allowed":   "#009E73",
	"refused":   "#E69F00",
	"spilled":   "#56B4E9",
	"halted":    "#D55E00",
	"rejected":  "#8C8C8C",
	"violation": "#CC79A7",
}

var kindSGR = map[string]string{
	"allowed":   "32",
	"refused":   "33",
	"spilled":   "36",
	"halted":    "31;1",
	"rejected":  "90",
	"violation": "35;1",
}
