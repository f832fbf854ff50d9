package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/seamguard/seamguard/inspect"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor/ledger"
)

func runInspect(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	svgFile := fs.String("svg", "", "also write the picture as an SVG timeline to `FILE`")
	asJSON := fs.Bool("json", false, "print the session as JSON (for scripts) instead of the picture")
	rebuild := fs.Bool("rebuild", false, "derive the ledger from the events stream with the pure core instead of reading the session bucket")
	policy := fs.String("policy", "spill", "with --rebuild: the processor's --policy, spill or halt")
	var lf limitFlags
	lf.register(fs)
	color := fs.String("color", "auto", "colours: auto (when standard output is a terminal), always or never")
	var width int
	fs.Var(ints(&width, 0, 16, 1000).orZero(meansDefaultWidth), "width", "the most character `cells` the bar takes")
	var trust trustFlags
	trust.register(fs)
	verify := fs.Bool("verify-spills", false, "also read the newest spill's whole chain, verify every digest, and check that it holds exactly the session's accepted events, derived again from the events stream")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard inspect SESSION [--svg FILE] [--json] [--rebuild] [--verify-spills] [--color auto|always|never]")
		fmt.Fprintln(stderr, "\nDraws a session's ledger over [0, head): what its context holds (summary, verbatim")
		fmt.Fprintln(stderr, "tail, truncated offsets, gaps) and what else holds it (spills, waivers, or nothing:")
		fmt.Fprintln(stderr, "holes), the pinned offsets, the recovery floor, and every verdict decided for it, with")
		fmt.Fprintln(stderr, "the pins each refusal drops and each request carried. It reads the session bucket, the")
		fmt.Fprintln(stderr, "verdict stream and the session's requests in the events stream; --rebuild derives the")
		fmt.Fprintln(stderr, "ledger from the events stream instead of reading the bucket. Every verdict's signature")
		fmt.Fprintln(stderr, "is verified (--trust-key): what fails is left out of the picture, listed as")
		fmt.Fprintln(stderr, "UNATTRIBUTED, and makes inspect exit 1.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: inspect takes one session id", errUsage)
	}
	session := pos[0]
	if err := checkSession("", session); err != nil {
		return err
	}
	cfg, err := policyConfig(*policy)
	if err != nil {
		return err
	}
	if cfg.Limits, err = lf.limits(); err != nil {
		return err
	}
	useColor, err := colorFlag(*color, stdout)
	if err != nil {
		return err
	}
	ctx, js, pcfg, err := cf.open(ctx, fs, "seamguard inspect")
	if err != nil {
		return err
	}
	defer func() { rerr = cf.close(rerr) }()
	ver, err := trust.verifier(pcfg.Subjects(), stderr, "seamguard inspect")
	if err != nil {
		return err
	}
	src := inspect.Source{JS: js, Config: pcfg, Verifier: ver}
	var m *inspect.Model
	if *rebuild {
		m, err = src.Rebuild(ctx, session, cfg, func(note string) { fmt.Fprintln(stderr, "note:", termtext.Escape(note)) })
	} else {
		m, err = src.Load(ctx, session)
	}
	if err != nil {
		return err
	}
	if *svgFile != "" {
		if err := writeFileAtomic(*svgFile, func(w io.Writer) error { return inspect.WriteSVG(w, m) }); err != nil {
			return fmt.Errorf("--svg %s: %w", *svgFile, err)
		}
		fmt.Fprintf(stderr, "wrote %s\n", *svgFile)
	}
	if *asJSON {
		err = writeJSON(stdout, m)
	} else {
		err = inspect.WriteText(stdout, m, inspect.TextOptions{Color: useColor, Width: width})
	}
	if err != nil {
		return err
	}
	if n := len(m.Unattributed); n > 0 {
		defer func() {
			if rerr == nil {
				rerr = fmt.Errorf("%d message(s) on the verdict subjects of session %s failed verification (UNATTRIBUTED): no trusted seamguard processor published them as they are", n, session)
			}
		}()
	}
	if !*verify {
		return nil
	}
	if m.LastSpill == nil {
		fmt.Fprintf(stderr, "session %s has no spill to verify\n", session)
		return nil
	}
	chk, err := src.VerifySpill(ctx, m.LastSpill.Name, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "read the chain of %s: %d spill(s) from %s, %d events, %d bytes, every digest verified; session %s accepted %d events up to stream sequence %d\n",
		termtext.Escape(chk.Name), len(chk.Chain), termtext.Escape(chk.Chain[0].Name), chk.Lines, chk.Bytes, session, chk.Accepted, chk.Chain[len(chk.Chain)-1].LastSeq)
	for _, p := range chk.Problems {
		fmt.Fprintln(stderr, "problem:", termtext.Escape(p))
	}
	if len(chk.Problems) > 0 {
		return fmt.Errorf("the chain of %s does not hold exactly the session's accepted events (%d problem(s) above)", chk.Name, len(chk.Problems))
	}
	fmt.Fprintln(stderr, "the chain holds exactly the session's accepted events, in order")
	return nil
}

// policyConfig reads a --policy flag.
func policyConfig(policy string) (ledger.Config, error) {
	switch policy {
	case "spill":
		return ledger.Config{Policy: ledger.PolicySpill}, nil
	case "halt":
		return ledger.Config{Policy: ledger.PolicyHalt}, nil
	}
	return ledger.Config{}, fmt.Errorf("%w: --policy is %q; use spill or halt, as the processor runs", errUsage, policy)
}

// colorFlag reads a --color flag: auto means colours when w is a terminal
// and neither NO_COLOR is set nor TERM is dumb.
func colorFlag(v string, w io.Writer) (bool, error) {
	switch v {
	case "always":
		return true, nil
	case "never":
		return false, nil
	case "auto":
		_, noColor := os.LookupEnv("NO_COLOR")
		return isTerminal(w) && !noColor && os.Getenv("TERM") != "dumb", nil
	}
	return false, fmt.Errorf("%w: --color is %q; use auto, always or never", errUsage, v)
}

// isTerminal reports whether w is a character device, such as a terminal;
// for a command's standard error (diagnostics), whether the one it wraps is.
func isTerminal(w io.Writer) bool {
	if d, ok := w.(*diagnostics); ok {
		w = d.stderr
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// writeFileAtomic writes a file through a temporary one in its directory,
// so that a failed write leaves nothing half-written behind.
func writeFileAtomic(name string, fill func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".seamguard-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := fill(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
