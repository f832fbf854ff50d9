package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/forward"
	"github.com/seamguard/seamguard/internal/termtext"
)

// forwarderInbox is the inbox prefix of the shipped forwarder identity
// (deploy/nats/accounts.conf).
const forwarderInbox = "_INBOX_forwarder"

const forwardUsage = `usage: seamguard forward --to URL [--kinds K,K] [--session S] [--from new|start|SEQ|TIME] [--name NAME]
       seamguard forward failed [--name NAME] [--json]
       seamguard forward retry (SEQ... | --all [--name NAME]) [--to URL]

Delivers verdicts to an HTTP endpoint as CloudEvents in binary mode, at least
once (docs/forward.md). It reads the verdict stream through a durable consumer
(--name, by default forward-<hash of the URL and filters>); forwarders started
with the same name share the work, each verdict going to one of them. A new
consumer starts where --from says (new: the verdicts decided after it is
created); one that exists resumes where it stands.

A verdict is acknowledged only after a 2xx. A 5xx, 408, 429, timeout or
connection failure is tried again with exponential backoff and jitter (at
least what a Retry-After asks), up to --max-attempts; any other answer, the
bound reached, or a verdict whose signature fails verification (as watch
verifies it): the verdict is kept in the stream <PREFIX>_UNDELIVERABLE with the
reason, logged and counted (seamguard_forward_undeliverable_total on
--health-listen). 'forward failed' lists what is kept; 'forward retry' delivers
it again and removes each only after a 2xx.

The shipped forwarder identity (deploy/nats) may do all of it.

flags:`

func runForward(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	if len(args) > 0 {
		switch args[0] {
		case "failed":
			return runForwardFailed(ctx, args[1:], stdout, stderr)
		case "retry":
			return runForwardRetry(ctx, args[1:], stdout, stderr)
		}
	}
	fs := flag.NewFlagSet("forward", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	cf.conn.inbox = forwarderInbox
	fs.Lookup("inbox-prefix").DefValue = forwarderInbox
	var cfg forward.Config
	fs.StringVar(&cfg.To, "to", "", "the http or https `URL` to POST each verdict to (required)")
	kinds := fs.String("kinds", "", "only verdicts of these kinds, separated by commas: "+strings.Join(forward.Kinds, ", ")+"; empty: every kind")
	fs.StringVar(&cfg.Session, "session", "", "only this session's verdicts")
	fs.StringVar(&cfg.From, "from", "new", "where a new consumer starts: new (verdicts decided after it is created), start (the first verdict the stream holds), a stream sequence, or an RFC 3339 time; an existing consumer resumes where it stands")
	fs.StringVar(&cfg.Name, "name", "", "the durable consumer's name, shared by the forwarders that share the work (default forward-<hash of the URL and filters>)")
	fs.Var(ints(&cfg.MaxAttempts, forward.DefaultMaxAttempts, 1, 1000), "max-attempts", "attempts per verdict before it is kept as undeliverable")
	fs.Var(ints(&cfg.Concurrency, forward.DefaultConcurrency, 1, 1000), "concurrency", "verdicts delivered at once by this process; 1 keeps stream order")
	fs.Var(durations(&cfg.Timeout, forward.DefaultTimeout, 100*time.Millisecond, 10*time.Minute), "timeout", "how long one request may take")
	fs.Var(durations(&cfg.MinBackoff, forward.DefaultMinBackoff, time.Millisecond, time.Hour), "min-backoff", "wait after the first failed attempt; it doubles with each attempt")
	fs.Var(durations(&cfg.MaxBackoff, forward.DefaultMaxBackoff, time.Millisecond, 24*time.Hour), "max-backoff", "longest wait between attempts (a Retry-After may ask for more, up to --max-retry-after)")
	fs.Var(durations(&cfg.MaxRetryAfter, forward.DefaultMaxRetryAfter, time.Second, 24*time.Hour), "max-retry-after", "longest wait a Retry-After is granted")
	fs.Var(ints(&cfg.Replicas, 1, 1, 5), "undeliverable-replicas", "replicas of the undeliverable stream when the forwarder creates it")
	var headers headerFlags
	fs.Var(&headers, "header", "an extra request header `NAME: VALUE`, such as 'Authorization: Bearer ...'; repeat it for several (its value shows in ps: prefer "+envName("header")+")")
	healthListen := fs.String("health-listen", "", "serve /healthz, /readyz and /metrics on HOST:PORT; empty: none")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	var trust trustFlags
	trust.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, forwardUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: forward takes no arguments but failed and retry; got %q", errUsage, pos[0])
	}
	// The environment first: --to and the filters may come from it.
	if err := applyEnv(fs); err != nil {
		return err
	}
	if *kinds != "" {
		for _, k := range strings.Split(*kinds, ",") {
			cfg.Kinds = append(cfg.Kinds, strings.TrimSpace(k))
		}
	}
	cfg.Header = headers.m
	cfg.Prefix = cf.prefix
	if cfg.To == "" {
		return fmt.Errorf("%w: --to URL is required", errUsage)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, strings.ReplaceAll(err.Error(), forward.ErrConfig.Error()+": ", ""))
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	var healthLn net.Listener
	if *healthListen != "" {
		if healthLn, err = net.Listen("tcp", *healthListen); err != nil {
			return fmt.Errorf("%w: --health-listen %s: %v", errUsage, *healthListen, err)
		}
		defer healthLn.Close()
	}
	ctx, js, pcfg, err := cf.open(ctx, fs, "seamguard forward")
	if err != nil {
		return err
	}
	cf.denied.prefer = "forwarder"
	defer func() { rerr = cf.close(rerr) }()
	ver, err := trust.verifier(pcfg.Subjects(), stderr, "seamguard forward")
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	f, err := forward.New(ctx, js, cfg, forward.WithLogger(log), forward.WithVerifier(ver), forward.WithRegisterer(reg))
	if err != nil {
		return err
	}
	if healthLn != nil {
		addr := serveHealth(ctx, healthLn, health{nc: cf.nc, ready: func() error { return nil },
			metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})}, log)
		log.Info("health endpoints", "url", "http://"+addr+"/healthz", "metrics", "http://"+addr+"/metrics")
	}
	log.Info("forwarding verdicts", "to", cfg.To, "consumer", f.Name(), "filters", cfg.Filters(), "concurrency", max(cfg.Concurrency, 1))
	err = f.Run(ctx)
	st := f.Stats()
	log.Info("forwarder stopped", "delivered", st.Delivered, "kept_undeliverable", st.Kept, "attempts", st.Attempts)
	return err
}

// headerFlags collects --header NAME: VALUE.
type headerFlags struct{ m map[string]string }

func (h *headerFlags) String() string { return "" }

func (h *headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(v, "\r\n") {
		return errors.New("use NAME: VALUE")
	}
	if h.m == nil {
		h.m = map[string]string{}
	}
	h.m[name] = strings.TrimSpace(value)
	return nil
}

// openKept opens the undeliverable stream for failed and retry.
func openKept(ctx context.Context, cf *clientFlags, fs *flag.FlagSet, name string) (context.Context, *forward.Undeliverable, error) {
	ctx, js, cfg, err := cf.open(ctx, fs, name)
	if err != nil {
		return ctx, nil, err
	}
	cf.denied.prefer = "forwarder"
	u, err := forward.OpenUndeliverable(ctx, js, cfg.Prefix, false, 0)
	if err != nil {
		err = fmt.Errorf("%w; no forwarder has kept anything yet, or --prefix is not the deployment's", err)
	}
	return ctx, u, err
}

func runForwardFailed(ctx context.Context, args []string, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("forward failed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	cf.conn.inbox = forwarderInbox
	fs.Lookup("inbox-prefix").DefValue = forwarderInbox
	name := fs.String("name", "", "only what this forwarder kept")
	asJSON := fs.Bool("json", false, "print a JSON array of the kept verdicts' records")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard forward failed [--name NAME] [--json]")
		fmt.Fprintln(stderr, "\nLists the verdicts forwarders could not deliver, oldest first: the sequence in the")
		fmt.Fprintln(stderr, "undeliverable stream (for forward retry), when, which forwarder, the verdict, why.")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: forward failed takes no arguments", errUsage)
	}
	ctx, u, err := openKept(ctx, &cf, fs, "seamguard forward failed")
	if cf.nc != nil {
		defer func() { rerr = cf.close(rerr) }()
	}
	if err != nil {
		return err
	}
	recs, err := u.List(ctx, *name)
	if err != nil {
		return err
	}
	if *asJSON {
		if recs == nil {
			recs = []forward.Record{}
		}
		b, err := json.MarshalIndent(recs, "", "  ")
		if err != nil {
			return err
		}
		b, _ = termtext.JSON(b)
		fmt.Fprintf(stdout, "%s\n", b)
		return nil
	}
	if len(recs) == 0 {
		fmt.Fprintln(stderr, "no undeliverable verdicts")
		return nil
	}
	for _, r := range recs {
		status := "-"
		if r.Status != 0 {
			status = strconv.Itoa(r.Status)
		}
		fmt.Fprintln(stdout, termtext.Escape(fmt.Sprintf("%d %s %s %s %s verdict %d: %s (status %s, %d attempt(s)) to %s: %s",
			r.Seq, r.FailedAt.UTC().Format(time.RFC3339), r.Name, r.Session, r.Kind, r.VerdictSeq, r.Reason, status, r.Attempts, r.To, r.Error)))
	}
	fmt.Fprintf(stderr, "%d undeliverable verdict(s); seamguard forward retry SEQ... (or --all) delivers them again\n", len(recs))
	return nil
}

func runForwardRetry(ctx context.Context, args []string, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("forward retry", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	cf.conn.inbox = forwarderInbox
	fs.Lookup("inbox-prefix").DefValue = forwarderInbox
	all := fs.Bool("all", false, "every kept verdict (of --name, if given)")
	name := fs.String("name", "", "with --all: only what this forwarder kept")
	to := fs.String("to", "", "deliver to this `URL` instead of the one each was kept for (needed when that URL had a password: it is kept redacted)")
	var headers headerFlags
	fs.Var(&headers, "header", "an extra request header `NAME: VALUE`; repeat it for several")
	var trust trustFlags
	trust.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard forward retry (SEQ... | --all [--name NAME]) [--to URL]")
		fmt.Fprintln(stderr, "\nDelivers kept verdicts again, one attempt each, verified first as the forwarder")
		fmt.Fprintln(stderr, "verifies them; each is removed from the undeliverable stream only after a 2xx.")
		fmt.Fprintln(stderr, "Exits 1 if any stays.")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	var seqs []uint64
	for _, p := range pos {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("%w: %q is not a sequence of the undeliverable stream (forward failed lists them)", errUsage, p)
		}
		seqs = append(seqs, n)
	}
	if err := applyEnv(fs); err != nil {
		return err
	}
	if *all == (len(seqs) > 0) {
		return fmt.Errorf("%w: give the sequences to retry, or --all", errUsage)
	}
	if *name != "" && !*all {
		return fmt.Errorf("%w: --name goes with --all", errUsage)
	}
	if *to != "" {
		if err := (forward.Config{To: *to}).Validate(); err != nil {
			return fmt.Errorf("%w: --to: %v", errUsage, err)
		}
	}
	ctx, u, err := openKept(ctx, &cf, fs, "seamguard forward retry")
	if cf.nc != nil {
		defer func() { rerr = cf.close(rerr) }()
	}
	if err != nil {
		return err
	}
	ver, err := trust.verifier(events.Subjects{Prefix: cf.prefix}, stderr, "seamguard forward retry")
	if err != nil {
		return err
	}
	var recs []forward.Record
	if *all {
		if recs, err = u.List(ctx, *name); err != nil {
			return err
		}
	}
	for _, s := range seqs {
		r, err := u.Get(ctx, s)
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	failed := 0
	for _, r := range recs {
		err := u.Redeliver(ctx, nil, ver, r, *to, headers.m)
		if err != nil {
			failed++
			fmt.Fprintln(stdout, termtext.Escape(fmt.Sprintf("%d: still undeliverable, kept: %v", r.Seq, err)))
			continue
		}
		dest := *to
		if dest == "" {
			dest = r.To
		}
		fmt.Fprintln(stdout, termtext.Escape(fmt.Sprintf("%d: delivered (verdict %d, %s %s) to %s; removed", r.Seq, r.VerdictSeq, r.Session, r.Kind, dest)))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d kept verdict(s) still undeliverable: they stay in the undeliverable stream", failed, len(recs))
	}
	return nil
}
