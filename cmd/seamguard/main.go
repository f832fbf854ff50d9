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
	"syscall"
)

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"bench":  {"measure seamguard against raw JetStream on the same server (--quick for a small run)", runBench},
	"check":  {"decide a file of events offline, without a server", runCheck},
	"demo":   {"play the seed story on an embedded server and show the verdicts", runDemo},
	"serve":  {"run the processor (on an embedded NATS server unless --nats-url)", runServe},
	"spill":  {"spill get NAME [--only] [-o FILE]: read a spill and the chain before it back, verified", runSpill},
	"watch":  {"follow verdicts as they are decided", runWatch},
	"resume": {"lift a session's halt, accepting its lost offsets (--note required)", runResume},

	"publish": {"play files of events (JSON Lines) into a running seamguard; --wait prints the verdicts", runPublish},
	"inspect": {"draw a session's ledger and its decisions (--svg FILE, --json)", runInspect},
	"replay":  {"derive every decision again from the events stream and compare with the verdicts", runReplay},
}

// errUsage marks an error that is the user's to fix; its message says how.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the exit code: 0 on success, 2
// for a usage error, a command's own for an exitError, 1 for any other
// failure.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "seamguard: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd.run(ctx, args[1:], stdin, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "seamguard %s: %v\n", args[0], err)
		var exit *exitError
		if errors.As(err, &exit) {
			return exit.code
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: seamguard <command> [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nrun 'seamguard <command> -h' for its flags")
}
