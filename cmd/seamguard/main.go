// Command seamguard guards the seam between a lossy summary and a verbatim tail
// for a fleet of LLM agents. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/seamguard/seamguard/internal/termtext"
)

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"bench":   {"measure seamguard against raw JetStream on the same server (--quick for a small run)", runBench},
	"check":   {"decide a file of events offline, without a server", runCheck},
	"demo":    {"play an example session on an embedded server and explain each verdict", runDemo},
	"forward": {"deliver verdicts to an HTTP endpoint as CloudEvents, at least once (failed, retry: what it could not)", runForward},
	"serve":   {"run the processor (on an embedded NATS server unless --nats-url)", runServe},
	"spill":   {"spill get NAME [--only] [-o FILE]: read a spill and the chain before it back, verified", runSpill},
	"watch":   {"follow verdicts as they are decided", runWatch},
	"resume":  {"lift a session's halt, accepting its lost offsets (--note required)", runResume},

	"publish":    {"play files of events (JSON Lines) into a running seamguard; --wait prints the verdicts", runPublish},
	"inspect":    {"draw a session's ledger and its decisions (--svg FILE, --json)", runInspect},
	"replay":     {"derive every decision again from the events stream and compare with the verdicts", runReplay},
	"http-token": {"make a bearer token for the HTTP gateway and its line for serve --http-tokens", runHTTPToken},
	"version":    {"print the module version, the VCS revision it was built from, and the Go version", runVersion},
}

// errUsage marks an error that is the user's to fix; its message says how.
var errUsage = errors.New("usage")

// errHelp is what a command returns when it was asked for its help (-h,
// --help): its usage went to standard output, and the exit status is 0.
var errHelp = errors.New("help requested")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the exit code: 0 on success
// (and for help asked for), 2 for a usage error, a command's own for an
// exitError, 1 for any other failure.
//
// A command's help (-h, --help, or seamguard help CMD) goes to standard
// output; its diagnostics go to standard error, escaped (termtext), since
// they may quote what came from the wire.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "--version", "-version":
		name, args = "version", []string{"version"}
	case "help":
		if len(args) == 1 {
			usage(stdout)
			return 0
		}
		if len(args) > 2 {
			fmt.Fprintf(stderr, "seamguard help: usage: give one command, as in seamguard help serve; got %d\n", len(args)-1)
			return 2
		}
		if _, ok := commands[args[1]]; !ok {
			list := "; the commands are "
			if sug := commandSuggestion(args[1]); sug != "" {
				list = sug + " The commands are "
			}
			fmt.Fprintf(stderr, "seamguard help: usage: no command \"%s\"%s%s\n", termtext.Escape(args[1]), list, strings.Join(commandNames(), ", "))
			return 2
		}
		name, args = args[1], []string{args[1], "--help"}
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "seamguard: unknown command %q%s\n\n", name, commandSuggestion(name))
		usage(stderr)
		return 2
	}
	errw := &diagnostics{stdout: stdout, stderr: stderr}
	err := cmd.run(ctx, args[1:], stdin, stdout, errw)
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "seamguard %s: %s\n", name, termtext.EscapeLines(err.Error()))
		fmt.Fprintf(stderr, "run 'seamguard %s -h' for its flags\n", name)
		return 2
	}
	fmt.Fprintf(stderr, "seamguard %s: %s\n", name, termtext.EscapeLines(err.Error()))
	var exit *exitError
	if errors.As(err, &exit) {
		return exit.code
	}
	return 1
}

// diagnostics is the standard error a command is given. While a command
// prints its usage because it was asked for it (see parseInterleaved), it
// writes to standard output instead: help is the output asked for, and
// goes where a pager or grep reads it.
type diagnostics struct {
	stdout, stderr io.Writer
	help           bool
}

func (d *diagnostics) Write(p []byte) (int, error) {
	if d.help {
		return d.stdout.Write(p)
	}
	return d.stderr.Write(p)
}

// printHelp calls usage with w, a command's standard error, writing to
// standard output if it is a diagnostics.
func printHelp(w io.Writer, usage func()) {
	d, ok := w.(*diagnostics)
	if ok {
		d.help = true
		defer func() { d.help = false }()
	}
	usage()
}

// commandSuggestion is "; did you mean serve?" for a mistyped command
// name, or "" when no command is close to it.
func commandSuggestion(typed string) string {
	return didYouMean(suggest(typed, commandNames()), func(s string) string { return s })
}

// commandNames lists the commands, sorted.
func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: seamguard <command> [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nrun 'seamguard help <command>' or 'seamguard <command> -h' for its flags;")
	fmt.Fprintln(w, "'seamguard version' (or --version) prints the version")
}
