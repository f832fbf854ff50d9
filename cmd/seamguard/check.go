package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/processor/offline"
)

func runCheck(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	spillDir := fs.String("spill-dir", "", "directory for spill files (default: a new temporary directory, named on stderr)")
	policy := fs.String("policy", "spill", "what to do with an unrecoverable compaction: spill or halt")
	var lf limitFlags
	lf.register(fs)
	source := fs.String("source", events.DefaultSource, "the source attribute of output events")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard check [--spill-dir DIR] [--policy spill|halt] [FILE|-]")
		fmt.Fprintln(stderr, "\nReads structured CloudEvents, one per line, from FILE or standard input, decides")
		fmt.Fprintln(stderr, "them and prints every output event as one JSON line. A summary per session goes")
		fmt.Fprintln(stderr, "to standard error. Exits 0 when the input was read, whatever the verdicts.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("%w: check takes one input file (or - for standard input), got %d: %s", errUsage, len(pos), strings.Join(pos, " "))
	}
	var cfg ledger.Config
	if cfg.Limits, err = lf.limits(); err != nil {
		return err
	}
	switch *policy {
	case "spill":
	case "halt":
		cfg.Policy = ledger.PolicyHalt
	default:
		return fmt.Errorf("%w: --policy is %q; use spill or halt", errUsage, *policy)
	}

	in := stdin
	name := "standard input"
	if len(pos) == 1 && pos[0] != "-" {
		f, err := os.Open(pos[0])
		if err != nil {
			return fmt.Errorf("cannot read the input: %w", err)
		}
		defer f.Close()
		in, name = f, pos[0]
	}
	dir := *spillDir
	if dir == "" {
		dir, err = os.MkdirTemp("", "seamguard-spills-")
		if err != nil {
			return fmt.Errorf("cannot create a spill directory: %w; pass --spill-dir", err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create --spill-dir: %w", err)
	}
	fmt.Fprintf(stderr, "seamguard check: reading %s, spills go to %s\n", name, dir)

	out := &jsonLines{w: stdout}
	r := &offline.Runner{SpillDir: dir, Config: cfg, Encoder: events.Encoder{Source: *source}, Out: out}
	sum, err := r.Run(ctx, in)
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	if sum.Rejected > 0 {
		fmt.Fprintf(stderr, "%d line(s) rejected before a session could be named\n", sum.Rejected)
	}
	for _, s := range sum.Sessions {
		fmt.Fprintf(stderr, "session %s: %s, head %d; %d events (%d accepted, %d rejected, %d duplicate); %d allowed, %d refused, %d spilled, %d halted, %d violations\n",
			termtext.Escape(s.Session), termtext.Escape(s.State), s.Head, s.Events, s.Accepted, s.Rejected, s.Duplicates, s.Allowed, s.Refused, s.Spilled, s.Halted, s.Violations)
	}
	return nil
}

// parseInterleaved parses flags that may come before or after positional
// arguments ("check FILE --spill-dir D" works as well as the usual order).
// Asked for help (-h, --help), it prints fs.Usage to standard output (see
// diagnostics) and returns errHelp; a bad flag is a usage error, whose
// message names the flag (run prints it, and how to get the help), and,
// for a flag fs does not define, the closest one it does (suggest).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	usage, out := fs.Usage, fs.Output()
	if usage == nil {
		usage = func() {
			fmt.Fprintf(fs.Output(), "usage of seamguard %s:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	describeBounds(fs)
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	defer func() { fs.Usage = usage; fs.SetOutput(out) }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				fs.Usage = usage
				fs.SetOutput(out)
				printHelp(out, fs.Usage)
				return nil, errHelp
			}
			return nil, fmt.Errorf("%w: %v%s", errUsage, err, flagSuggestion(fs, err))
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
