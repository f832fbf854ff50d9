package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/inspect"
	"github.com/seamguard/seamguard/internal/termtext"
)

// errDiffer is returned when a replay finds a difference; the exit status
// is then 1, as for any failure, and the message says which it was.
var errDiffer = errors.New("the verdict stream differs from the derivation")

func runReplay(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	session := fs.String("session", "", "replay only this session (default: every session)")
	since := fs.String("since", "", "compare only the decisions about inputs at or after this events stream `SEQ`uence or RFC3339 time; earlier inputs are still stepped, to build the state")
	verdicts := fs.String("verdicts", "", "compare with this `STREAM` instead of the deployment's verdict stream (e.g. a copy)")
	policy := fs.String("policy", "spill", "the processor's --policy, spill or halt")
	var lf limitFlags
	lf.register(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	var trust trustFlags
	trust.register(fs)
	progress := fs.String("progress", "auto", "progress bar on standard error: auto (when it is a terminal and the replay takes over a second), always or never")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard replay [--session S] [--since SEQ|TIME] [--verdicts STREAM] [--policy spill|halt] [--json]")
		fmt.Fprintln(stderr, "\nDerives every decision again from the events stream with the pure core and compares")
		fmt.Fprintln(stderr, "it, verdict by verdict, with the verdict stream. Prints each verdict that is missing,")
		fmt.Fprintln(stderr, "extra or different, and each message that fails signature verification (--trust-key)")
		fmt.Fprintln(stderr, "as unattributed, left out of the comparison; then compares each session's ledger in the session bucket with")
		fmt.Fprintln(stderr, "the derived one, set by set (received, truncated, committed, spilled, waived and")
		fmt.Fprintln(stderr, "pinned), and prints each that differs. Exits 1 if there is a difference, 0 if none.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: replay takes no arguments; use --session", errUsage)
	}
	if err := checkSession("--session", *session); err != nil {
		return err
	}
	cfg, err := policyConfig(*policy)
	if err != nil {
		return err
	}
	if cfg.Limits, err = lf.limits(); err != nil {
		return err
	}
	opts := inspect.ReplayOptions{Session: *session, Verdicts: *verdicts, Config: cfg}
	if opts.SinceSeq, opts.SinceTime, err = parseSince(*since); err != nil {
		return err
	}
	var bar *progressBar
	switch *progress {
	case "auto":
		if isTerminal(stderr) {
			bar = &progressBar{w: stderr, start: time.Now(), after: time.Second}
		}
	case "always":
		bar = &progressBar{w: stderr, start: time.Now()}
	case "never":
	default:
		return fmt.Errorf("%w: --progress is %q; use auto, always or never", errUsage, *progress)
	}
	ctx, js, pcfg, err := cf.open(ctx, fs, "seamguard replay")
	if err != nil {
		return err
	}
	defer func() { rerr = cf.close(rerr) }()
	ver, err := trust.verifier(pcfg.Subjects(), stderr, "seamguard replay")
	if err != nil {
		return err
	}
	if bar != nil {
		opts.Progress = bar.update
	}
	var notes []string
	opts.Notes = func(n string) { notes = append(notes, n) }
	rep, err := inspect.Source{JS: js, Config: pcfg, Verifier: ver}.Replay(ctx, opts)
	if bar != nil {
		bar.clear()
	}
	if err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "note:", termtext.Escape(n))
	}
	if *asJSON {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		writeReplay(stdout, rep)
	}
	if n := len(rep.Differences); n > 0 {
		return fmt.Errorf("%w: %d difference(s) with %s", errDiffer, n, rep.VerdictStream)
	}
	return nil
}

// parseSince reads --since: a positive stream sequence, or an RFC3339 time.
func parseSince(v string) (uint64, time.Time, error) {
	if v == "" {
		return 0, time.Time{}, nil
	}
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		if n == 0 {
			return 0, time.Time{}, fmt.Errorf("%w: --since 0: stream sequences start at 1", errUsage)
		}
		return n, time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("%w: --since %q is neither an events stream sequence (such as 1200) nor an RFC3339 time (such as 2026-11-02T09:00:00Z)", errUsage, v)
	}
	return 0, t, nil
}

// writeReplay prints a replay's report: one block per difference, then a
// summary line. Every string of the report is escaped (termtext): ids,
// types and the values of the fields that differ come from the streams.
func writeReplay(w io.Writer, rep *inspect.ReplayReport) {
	esc := termtext.Escape
	kinds := map[string]int{}
	for _, d := range rep.Differences {
		kinds[d.Kind]++
		where := ""
		if d.InputSeq > 0 {
			where = fmt.Sprintf("input seq %d", d.InputSeq)
		}
		if d.VerdictSeq > 0 {
			if where != "" {
				where += ", "
			}
			where += fmt.Sprintf("verdict seq %d", d.VerdictSeq)
		}
		session := d.Session
		if session == "" {
			session = events.InvalidSession
		}
		fmt.Fprintf(w, "%-9s %s  %s  %s  %s", esc(d.Kind), esc(session), esc(strings.TrimPrefix(d.Type, events.TypePrefix)), esc(d.ID), where)
		if d.Cause != "" {
			fmt.Fprintf(w, "  (answers %s)", esc(d.Cause))
		}
		fmt.Fprintln(w)
		switch d.Kind {
		case "missing":
			fmt.Fprintf(w, "          derived, not in %s: %s\n", esc(rep.VerdictStream), esc(d.Derived))
		case "extra":
			fmt.Fprintf(w, "          in %s, not derived: %s\n", esc(rep.VerdictStream), esc(d.Recorded))
		case "duplicate":
			fmt.Fprintf(w, "          recorded more than once\n")
		case "unattributed":
			fmt.Fprintf(w, "          on %s, not published by a trusted seamguard processor as it is: %s\n", esc(d.Subject), esc(strings.Join(d.Fields, "; ")))
		case "different", "state":
			for _, f := range d.Fields {
				fmt.Fprintf(w, "          %s\n", esc(f))
			}
		}
	}
	from := ""
	if rep.FromSeq > 1 {
		from = fmt.Sprintf(", compared from input seq %d", rep.FromSeq)
	}
	fmt.Fprintf(w, "replayed %d events of %d session(s) from %s%s: %d verdicts derived, %d recorded in %s, %d identical; %d session ledger(s) compared with bucket %s",
		rep.Events, rep.Sessions, esc(rep.EventsStream), from, rep.Derived, rep.Recorded, esc(rep.VerdictStream), rep.Matched, rep.States, esc(rep.StateBucket))
	if len(rep.Differences) == 0 {
		fmt.Fprintln(w, "; no difference")
		return
	}
	var parts []string
	for _, k := range []string{"missing", "extra", "different", "duplicate", "unattributed", "state"} {
		if kinds[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", kinds[k], k))
		}
	}
	fmt.Fprintf(w, "; %d difference(s): %s\n", len(rep.Differences), strings.Join(parts, ", "))
}

// progressBar draws "replaying [####      ] 120/480 events" on one line
// of a terminal, at most ten times a second, once after has passed.
type progressBar struct {
	w     io.Writer
	start time.Time
	after time.Duration
	last  time.Time
	drawn bool
}

func (p *progressBar) update(done, total uint64) {
	now := time.Now()
	if now.Sub(p.start) < p.after || (now.Sub(p.last) < 100*time.Millisecond && done != total) {
		return
	}
	p.last = now
	const width = 30
	filled := width
	if total > 0 && done < total {
		filled = int(done * width / total)
	}
	fmt.Fprintf(p.w, "\rreplaying [%s%s] %d/%d events", strings.Repeat("#", filled), strings.Repeat(" ", width-filled), done, total)
	p.drawn = true
}

// clear removes the bar's line.
func (p *progressBar) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}
