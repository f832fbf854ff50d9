package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/seamguard/seamguard/internal/bench"
	"github.com/seamguard/seamguard/internal/embedded"
)

// runBench measures seamguard against raw JetStream (see internal/bench).
// Without --nats-url each measurement gets a fresh embedded server in a
// child process (this executable again), so that this process's memory is
// the processor's.
func runBench(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if code, ok := bench.ServeChild(); ok {
		if code != 0 {
			return errors.New("the benchmark's server process failed")
		}
		return nil
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg       bench.Config
		jsonPath  string
		skip      string
		inProcess bool
		cpuProf   string
	)
	fs.BoolVar(&cfg.Quick, "quick", false, "small sizes: the whole run takes well under a minute")
	fs.StringVar(&cfg.URL, "nats-url", "", "measure against this NATS server instead of a fresh embedded one")
	fs.StringVar(&jsonPath, "json", "", "also write the full report as JSON to this file")
	fs.StringVar(&skip, "skip", "", "comma-separated measurements to leave out: ingest, latency, http, sessions, decision, spill")
	fs.StringVar(&cfg.Dir, "dir", "", "directory for the servers' storage (default: a temporary directory, removed after)")
	fs.BoolVar(&inProcess, "in-process", false, "run the embedded server in this process (memory figures then include the server's, and there is no recovery after a crash: it would kill the bench)")
	fs.StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of this process (the processor and the clients) to this file")
	fs.StringVar(&cfg.HeapProfile, "memprofile", "", "write a heap profile of this process to this file while the sessions of measurement 3 are live")
	fs.StringVar(&cfg.SessionsCPUProfile, "sessions-cpuprofile", "", "write a CPU profile of this process to this file while seamguard decides the events of the sessions measurement's largest size (with --in-process the server's work is in it too), and where its goroutines wait to FILE.block")
	fs.StringVar(&cfg.IngestCPUProfile, "ingest-cpuprofile", "", "write a CPU profile of this process to this file while seamguard decides the last round of the 1 KiB ingest measurement (with --in-process the server's work is in it too), and where its goroutines wait to FILE.block")
	sizesFlag := fs.String("session-sizes", "", "comma-separated numbers of live sessions the sessions measurement measures at, ascending (default 100000,500000,1000000; --quick: 1000,3000)")
	fs.Var(ints(&cfg.SessionEvents, 0, 1, 10_000_000).orZero(meansDefault), "session-events", "events each run of the sessions measurement decides at each size, one per session, each run on sessions of its own (20000; --quick: 1000)")
	syncFlag := fs.String("sync-interval", "always", "how the servers the run starts sync, as serve's --sync-interval: always (fsync before acknowledging; serve's default) or an interval such as 2m; both sides of every ratio use it")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard bench [--quick] [--nats-url URL] [--skip LIST] [--session-sizes LIST] [--json FILE]")
		fmt.Fprintln(stderr, "\nMeasures seamguard against raw JetStream on the same server: ingest, decision")
		fmt.Fprintln(stderr, "latency, many sessions (with recovery after a crash), decision cost and spills,")
		fmt.Fprintln(stderr, "and prints a table.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: bench takes no arguments, got %q", errUsage, pos)
	}
	if err := applyEnv(fs); err != nil {
		return err
	}
	if cfg.SyncInterval, err = embedded.ParseSync(*syncFlag); err != nil {
		return fmt.Errorf("%w: --sync-interval %q: use always, or a positive duration such as 2m", errUsage, *syncFlag)
	}
	if *sizesFlag != "" {
		for _, f := range strings.Split(*sizesFlag, ",") {
			n, err := strconv.Atoi(strings.ReplaceAll(strings.TrimSpace(f), "_", ""))
			if err != nil {
				return fmt.Errorf("%w: --session-sizes %q: %q is not a number", errUsage, *sizesFlag, f)
			}
			cfg.SessionSizes = append(cfg.SessionSizes, n)
		}
	}
	if skip != "" {
		cfg.Skip = strings.Split(skip, ",")
	}
	if cfg.URL == "" && !inProcess {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("cannot find this executable to run the server in a child process (use --in-process): %w", err)
		}
		cfg.Child = []string{exe, "bench"}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg.Progress = stderr
	if cpuProf != "" {
		f, err := os.Create(cpuProf)
		if err != nil {
			return fmt.Errorf("--cpuprofile %s: %w", cpuProf, err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile %s: %w", cpuProf, err)
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := bench.Run(ctx, cfg)
	if rep != nil {
		if terr := rep.WriteTable(stdout); terr != nil && err == nil {
			err = terr
		}
		if jsonPath != "" {
			if jerr := writeJSONFile(jsonPath, rep); jerr != nil && err == nil {
				err = jerr
			}
		}
	}
	return err
}

func writeJSONFile(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--json %s: %w", path, err)
	}
	if err := rep.WriteJSON(f); err != nil {
		f.Close()
		return fmt.Errorf("--json %s: %w", path, err)
	}
	return f.Close()
}
