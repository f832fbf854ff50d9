package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/internal/dirlock"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/metrics"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
)

// procFlags are the processor settings shared by serve and demo.
type procFlags struct {
	cfg     processor.Config
	policy  string
	limits  limitFlags
	replyTo string // --reply-prefixes
}

// limitFlags are a session ledger's limits: serve decides with them, and
// check, inspect and replay must be given the same to decide alike.
type limitFlags struct {
	l             ledger.Limits
	snapshotBytes int64
	spillQuota    int64
}

func (f *limitFlags) register(fs *flag.FlagSet) {
	fs.Var(ints(&f.l.MaxRanges, ledger.DefaultMaxRanges, 1, maxRanges).orZero(meansDefault), "max-ranges", "most ranges any one set of a session's ledger may hold (received, truncated, coverage, spilled, waived, pinned); more halts the session (state_limit)")
	fs.Var(ints(&f.l.MaxRequests, ledger.DefaultMaxRequests, ledger.DefaultMaxRequests, maxRequests).orZero(meansDefault), "max-requests", "request ids a session remembers; a commit of a forgotten one is a violation")
	fs.Var(sizes(&f.snapshotBytes, ledger.DefaultMaxSnapshotBytes, ledger.MinSnapshotBytes, maxSnapshotBytes).orZero(meansDefault), "max-snapshot-bytes", "most bytes a session's snapshot may take (serve keeps it under the bucket's value limit); more halts the session (state_limit)")
	fs.Var(sizes(&f.spillQuota, ledger.DefaultSpillQuota, 1<<20, 1<<50).orZero(meansDefault), "spill-quota", "most bytes all the spills of one session may take, e.g. 1GiB; a spill past it halts the session")
}

// Upper bounds of the limit flags: far above any session seamguard is
// built for, low enough that a typo cannot ask for what no machine has.
const (
	maxRanges        = 10_000_000
	maxRequests      = 1_000_000
	maxSnapshotBytes = 64 << 20 // the largest max_payload a NATS server takes
)

// limits returns the limits the flags say.
func (f *limitFlags) limits() (ledger.Limits, error) {
	l := f.l
	l.MaxSnapshotBytes = int(f.snapshotBytes)
	l.SpillQuota = uint64(f.spillQuota)
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("%w: %v", errUsage, err)
	}
	return l, nil
}

func (p *procFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.cfg.Prefix, "prefix", "seamguard", "first subject token and stem of every stream, bucket and object store name")
	fs.Var(ints(&p.cfg.Replicas, 0, 1, 5).orZero(meansAutoReplicas), "replicas", "replicas of streams, bucket and object store")
	fs.Var(ints(&p.cfg.Shards, processor.DefaultShards, 1, 1024), "shards", "owner goroutines; each session always goes to the same one")
	fs.Var(ints(&p.cfg.MaxAckPending, 0, 1, 1_000_000).orZero(meansShardsTimesQueue), "max-ack-pending", "inputs each partition's consumer may have delivered and unacknowledged at once: what a backlog can hold in memory")
	fs.Var(ints(&p.cfg.Partitions, 0, 1, 1024).orZero(meansDefaultPartitions), "partitions", "partitions of the events stream, each consumed by one instance at a time (fixed once the stream exists)")
	fs.Var(durations(&p.cfg.LeaseTTL, processor.DefaultLeaseTTL, time.Second, time.Hour), "lease-ttl", "how long a partition's lease outlives an instance that stopped renewing it: the failover time (the same on every instance)")
	fs.Var(durations(&p.cfg.LeaseTTL, processor.DefaultLeaseTTL, time.Second, time.Hour), "pinned-ttl", "the former name of --lease-ttl")
	fs.Var(durations(&p.cfg.EventsMaxAge, processor.DefaultEventsMaxAge, time.Minute, maxRetention), "events-max-age", "how long input events are kept (spills need them), e.g. 7d or 48h")
	fs.Var(durations(&p.cfg.VerdictsMaxAge, 0, time.Minute, maxRetention).orZero(meansForever), "verdicts-max-age", "how long verdicts are kept")
	fs.StringVar(&p.policy, "policy", "spill", "what an unrecoverable compaction gets: spill (refuse and spill the transcript) or halt")
	fs.StringVar(&p.cfg.Source, "source", "", "CloudEvents source of verdicts (default urn:seamguard:processor:<host>)")
	fs.BoolVar(&p.cfg.SpillVerify, "spill-verify", true, "read every spill back and check its digest")
	fs.BoolVar(&p.cfg.NoAtomicBatches, "no-atomic-batches", false, "write every verdict and state as a message of its own, never as atomic batches: faster on a NATS server that syncs lazily, slower on one that syncs every write")
	fs.Var(durations(&p.cfg.AckWait, processor.DefaultAckWait, time.Second, time.Hour), "ack-wait", "how long an input may stay unacknowledged before it is redelivered (after a crash, the time to resume)")
	fs.Var(durations(&p.cfg.ParkAfter, processor.DefaultParkAfter, time.Second, 7*24*time.Hour), "park-after", "how long a session may stay stuck on a failure retrying cannot fix before it is parked: its inputs are acknowledged into a park record and wait in the events stream until seamguard resume, so its partition goes on")
	fs.Var(durations(&p.cfg.RetryFor, processor.DefaultRetryFor, time.Second, time.Hour), "retry-for", "how long a batch retries NATS not answering before the sessions still waiting are left stuck (unready; their inputs are redelivered)")
	fs.Var(durations(&p.cfg.StartTimeout, processor.DefaultStartTimeout, time.Second, time.Hour), "start-timeout", "how long serve waits at start for NATS to answer while it sets up its streams, buckets and consumers (a cluster restarting) before it gives up")
	fs.Var(durations(&p.cfg.DrainTimeout, processor.DefaultDrainTimeout, time.Second, time.Hour), "drain-timeout", "the longest a shutdown waits for work in flight before it stops anyway and hands its partitions over")
	p.limits.register(fs)
	fs.Var(sizes(&p.cfg.SpillBucketMaxBytes, 0, processor.MinSpillBucketMaxBytes, 1<<60).orZero(meansNoBucketMax), "spill-bucket-max-bytes", "the most the spill bucket may hold, e.g. 50GiB; a spill that does not fit halts its session")
	fs.Var(durations(&p.cfg.SweepEvery, processor.DefaultSweepEvery, time.Second, 24*time.Hour).orNegative(meansNever), "sweep-every", "how often the spill bucket is swept for orphaned chunks (of spills cut short by a crash)")
	fs.Var(durations(&p.cfg.SweepMinAge, processor.DefaultSweepMinAge, 2*time.Second, 24*time.Hour), "sweep-min-age", "how old unnamed chunks must be before a sweep purges them")
	fs.Var(ints(&p.cfg.MaxSessions, processor.DefaultMaxSessions, 1, 100_000_000), "max-sessions", "sessions kept in memory; past it the least used leave memory and are read from the bucket when next used")
	fs.StringVar(&p.replyTo, "reply-prefixes", strings.Join(processor.DefaultReplyPrefixes, ","), "inbox prefixes, comma-separated, that the recover service answers to; a request naming any other reply subject gets no answer")
}

// maxRetention bounds the retention flags: ten years.
const maxRetention = 3650 * 24 * time.Hour

func (p *procFlags) config() (processor.Config, error) {
	c := p.cfg
	var err error
	if c.Limits, err = p.limits.limits(); err != nil {
		return c, err
	}
	c.ReplyPrefixes = nil
	for _, r := range strings.Split(p.replyTo, ",") {
		if r = strings.TrimSpace(r); r != "" {
			c.ReplyPrefixes = append(c.ReplyPrefixes, r)
		}
	}
	switch p.policy {
	case "spill":
		c.Policy = ledger.PolicySpill
	case "halt":
		c.Policy = ledger.PolicyHalt
	default:
		return c, fmt.Errorf("%w: --policy is %q; use spill or halt", errUsage, p.policy)
	}
	if c.Source == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "localhost"
		}
		c.Source = "urn:seamguard:processor:" + host
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%w: --log-level %q: use debug, info, warn or error", errUsage, level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// encoding/json leaves DEL, C1 and bidi controls raw in strings, and
		// log lines quote what came from the wire: escape them as the
		// terminal output is.
		opts.ReplaceAttr = escapeLogAttr
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w: --log-format %q: use text or json", errUsage, format)
}

// startEmbedded starts the default server: JetStream stored under dataDir,
// clients on listen.
func startEmbedded(dataDir, listen string, sync time.Duration) (*server.Server, error) {
	host, portS, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("%w: --listen %q: %v; use HOST:PORT such as 127.0.0.1:4222", errUsage, listen, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("%w: --listen %q: the port must be a number from 0 to 65535", errUsage, listen)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create --data-dir: %w", err)
	}
	s, err := embedded.Start(embedded.Config{Host: host, Port: port, StoreDir: filepath.Join(dataDir, "jetstream"), SyncInterval: sync})
	if le := (*embedded.ListenError)(nil); errors.As(err, &le) {
		return nil, fmt.Errorf("--listen %s: the embedded NATS server cannot listen there: %v", listen, le.Err)
	}
	return s, err
}

// lockDataDir makes this serve the only one on dataDir, at once or not at
// all: another serve holding it is named, with what to do.
func lockDataDir(dataDir string, self dirlock.Holder) (*dirlock.Lock, error) {
	l, err := dirlock.Acquire(dataDir, self)
	if le := (*dirlock.LockedError)(nil); errors.As(err, &le) {
		msg := fmt.Sprintf("--data-dir %s is in use by another seamguard serve (%s): two processes on one data directory would overwrite each other's state; stop that one, or give this one another --data-dir", dataDir, le.Holder)
		if le.Stale {
			msg += fmt.Sprintf(" (if it is no longer running, remove %s)", filepath.Join(dataDir, dirlock.FileName))
		}
		return nil, errors.New(msg)
	}
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: cannot lock it: %w", dataDir, err)
	}
	return l, nil
}

func runServe(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	sv := &serving{}
	defer sv.close()
	if err := sv.parse(args, stderr); err != nil {
		return err
	}
	if err := sv.prepare(); err != nil {
		return err
	}
	if err := sv.connect(ctx); err != nil {
		return err
	}
	durable := sv.durability(ctx)
	p, rec, err := sv.newProcessor(ctx)
	if p == nil {
		return err
	}
	if rec != nil {
		sv.watchHealth(ctx, p, rec, durable)
	}
	if *sv.rebuild {
		rep, err := p.Rebuild(ctx, true)
		if err != nil {
			return fmt.Errorf("rebuild: %w", sv.denied.explain(err, notSys))
		}
		sv.log.Info("rebuilt session states from the events stream", "events", rep.Events, "sessions", rep.Sessions,
			"differed", len(rep.Differ), "written", rep.Written, "republished", rep.Republished, "respilled", rep.Respilled)
	}
	stopHTTP := func() {}
	if sv.httpLn != nil {
		// After the processor is set up (its streams exist), and shut down
		// when ctx ends, beside the processor's drain.
		if stopHTTP, err = startGateway(ctx, &sv.hf, sv.httpLn, sv.conn, sv.url, sv.nc, sv.js, p.Config(), p.SigningPublicKey(), sv.denied.grants, sv.log); err != nil {
			return err
		}
		sv.later(stopHTTP)
	}
	fmt.Fprintf(stdout, "seamguard serving on %s: events on %s.events.<session>, verdicts on %s.verdicts.<session>.<kind>\n", sv.url, sv.cfg.Prefix, sv.cfg.Prefix)
	if err := p.Run(ctx); err != nil {
		return sv.denied.explain(err, notSys)
	}
	stopHTTP() // it publishes on nc on the embedded default
	if err := sv.nc.Drain(); err != nil && err != nats.ErrConnectionClosed {
		sv.log.Warn("drain", "err", err)
	}
	return nil
}

// serving is one run of serve: its flags, and what it has started, each
// stopped by close in the reverse order of its start.
type serving struct {
	conn connFlags
	pf   procFlags
	resp responderFlags
	hf   httpFlags

	dataDir, signingKeyFile, listen, syncFlag, monitor, healthListen *string
	rebuild                                                          *bool
	lagInterval                                                      time.Duration

	cfg         processor.Config
	log         *slog.Logger
	sync        time.Duration // the embedded server's
	monitorURLs []string
	listening   func(addrs []string) // where serve listens, into the data directory's lock
	healthLn    net.Listener
	httpLn      net.Listener
	url         string // the NATS server's, the embedded one's by default
	denied      *denials
	nc          *nats.Conn
	js          jetstream.JetStream
	closers     []func()
}

// later has close call f, before whatever was started earlier is stopped.
func (sv *serving) later(f func()) { sv.closers = append(sv.closers, f) }

// close stops what serve started, the latest first.
func (sv *serving) close() {
	for i := len(sv.closers) - 1; i >= 0; i-- {
		sv.closers[i]()
	}
}

// A request to the system account (the durability check's) is refused to
// every user outside it, which serve takes as no answer: askSys tells it
// from every other refusal (notSys).
func askSys(v denial) bool { return v.verb == "publish" && strings.HasPrefix(v.subject, "$SYS.REQ.") }
func notSys(v denial) bool { return !askSys(v) }

// parse reads serve's flags and environment, and the processor's
// configuration and the logger they give.
func (sv *serving) parse(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sv.conn.inbox = processorInbox
	sv.conn.register(fs, "NATS server or cluster to use, e.g. nats://a:4222,nats://b:4222 (default: start an embedded server)")
	sv.pf.register(fs)
	sv.resp.register(fs)
	sv.hf.register(fs)
	sv.dataDir = fs.String("data-dir", "seamguard-data", "where serve keeps its signing key ("+attest.KeyFileName+", made at first start unless --signing-key-file or "+signingKeyEnv+" gives one) and the embedded server stores JetStream data")
	sv.signingKeyFile = fs.String("signing-key-file", "", "the NKey seed (S…) that signs every verdict, in a `FILE` only serve may read; give every instance of a cluster the same, or each its own, and trust their public keys (default: $"+signingKeyEnv+", else the key in --data-dir)")
	sv.listen = fs.String("listen", "127.0.0.1:4222", "where the embedded server listens for agents and the nats CLI")
	sv.syncFlag = fs.String("sync-interval", "always", "how the embedded server syncs: always (fsync every write before acknowledging it, so that nothing acknowledged is lost to a power cut) or an interval such as 2m (faster; a power cut loses what was acknowledged since the last sync)")
	sv.monitor = fs.String("nats-monitor-url", "", "monitoring endpoints of the NATS servers (e.g. http://a:8222,http://b:8222), read at start to check that they sync before acknowledging; without it serve asks through the system account, if its user may")
	sv.rebuild = fs.Bool("rebuild", false, "rebuild every session's state from the events stream before consuming; takes every partition's lease first and refuses, naming them, while other instances hold any: stop them first")
	sv.healthListen = fs.String("health-listen", "", "serve /healthz, /readyz and /metrics on HOST:PORT (e.g. 0.0.0.0:8080); empty: none")
	fs.Var(durations(&sv.lagInterval, 15*time.Second, 100*time.Millisecond, time.Hour), "lag-interval", "how often the consumer lag metric asks the server (with --health-listen)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard serve [flags]")
		fmt.Fprintln(stderr, "\nRuns the processor. Without --nats-url it starts an embedded NATS server with")
		fmt.Fprintln(stderr, "JetStream. Every flag can also be set by its environment variable: SEAMGUARD_ and")
		fmt.Fprintln(stderr, "the flag name in upper case with '_' for '-', e.g. SEAMGUARD_NATS_URL.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: serve takes no arguments, got %q", errUsage, pos)
	}
	if err := applyEnv(fs); err != nil {
		return err
	}
	if err := sv.conn.validate(); err != nil {
		return err
	}
	if err := sv.resp.validate(sv.conn); err != nil {
		return err
	}
	if err := sv.hf.validate(sv.conn); err != nil {
		return err
	}
	if sv.cfg, err = sv.pf.config(); err != nil {
		return err
	}
	sv.log, err = newLogger(stderr, *logFormat, *logLevel)
	return err
}

// prepare does what must hold before anything starts: the data directory
// locked, the listeners open, the signing key read, the sync setting and
// monitoring endpoints checked.
func (sv *serving) prepare() error {
	if err := sv.lockDataDir(); err != nil {
		return err
	}
	// A health or HTTP address that cannot be listened on fails the start
	// now, before the server and the processor start.
	var err error
	if *sv.healthListen != "" {
		if sv.healthLn, err = net.Listen("tcp", *sv.healthListen); err != nil {
			return fmt.Errorf("%w: --health-listen %s: %v", errUsage, *sv.healthListen, err)
		}
		sv.later(func() { sv.healthLn.Close() })
	}
	if sv.hf.listen != "" {
		if sv.httpLn, err = net.Listen("tcp", sv.hf.listen); err != nil {
			return fmt.Errorf("%w: --http-listen %s: %v", errUsage, sv.hf.listen, err)
		}
		sv.later(func() { sv.httpLn.Close() })
	}
	if sv.cfg.SigningKey, err = signingKey(*sv.signingKeyFile, *sv.dataDir, sv.log); err != nil {
		return err
	}
	if sv.sync, err = embedded.ParseSync(*sv.syncFlag); err != nil {
		return fmt.Errorf("%w: --sync-interval %q: use always, or a positive duration such as 2m", errUsage, *sv.syncFlag)
	}
	if sv.conn.url != "" && *sv.syncFlag != "always" {
		return fmt.Errorf("%w: --sync-interval sets the embedded server; a server given by --nats-url syncs as its own configuration says (jetstream { sync_interval: always })", errUsage)
	}
	for _, u := range strings.Split(*sv.monitor, ",") {
		if u = strings.TrimSpace(u); u != "" {
			if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
				return fmt.Errorf("%w: --nats-monitor-url %q: give the monitoring endpoint's http:// or https:// URL, e.g. http://nats:8222", errUsage, u)
			}
			sv.monitorURLs = append(sv.monitorURLs, u)
		}
	}
	return nil
}

// lockDataDir makes this serve the one per data directory, locked before
// anything in it is used (the embedded server's store, the signing key
// kept there). Once listening, the lock file says where (a port 0 is
// chosen then).
func (sv *serving) lockDataDir() error {
	sv.listening = func([]string) {}
	if sv.conn.url != "" && (*sv.signingKeyFile != "" || os.Getenv(signingKeyEnv) != "") {
		return nil // nothing of the data directory is used
	}
	self := dirlock.Self()
	if sv.conn.url == "" {
		self.Listen = append(self.Listen, "nats "+*sv.listen)
	}
	if *sv.healthListen != "" {
		self.Listen = append(self.Listen, "health "+*sv.healthListen)
	}
	if sv.hf.listen != "" {
		self.Listen = append(self.Listen, "http "+sv.hf.listen)
	}
	lock, err := lockDataDir(*sv.dataDir, self)
	if err != nil {
		return err
	}
	sv.later(func() { lock.Release() })
	sv.listening = func(addrs []string) {
		self.Listen = addrs
		if err := lock.Update(self); err != nil {
			sv.log.Warn("cannot write the addresses serve listens on into the data directory's lock file", "err", err)
		}
	}
	return nil
}

// connect starts the embedded server unless --nats-url names one, and
// connects to it.
//
// No publish waits in a buffer while the connection is down, to go out
// when it is back: a verdict goes out while its decision is current, or
// fails and is retried (a partition's lease may have moved on meanwhile;
// see processor.Config.LeaseTTL). A server that stops answering (cut off,
// paused) is noticed within about 15s, not the client's default of
// minutes, and serve moves to another server of the cluster while its
// leases can still be kept. A permission the server refuses is logged
// once, saying which shipped identity holds it; one refused while
// starting stops the start at once.
func (sv *serving) connect(ctx context.Context) error {
	sv.url = sv.conn.url
	if sv.url == "" {
		s, err := startEmbedded(*sv.dataDir, *sv.listen, sv.sync)
		if err != nil {
			return err
		}
		sv.later(func() { s.Shutdown(); s.WaitForShutdown() })
		sv.url = s.ClientURL()
		sv.log.Info("embedded NATS server with JetStream", "url", sv.url, "data", *sv.dataDir, "sync_interval", *sv.syncFlag)
	}
	var addrs []string
	if sv.conn.url == "" {
		addrs = append(addrs, "nats "+strings.TrimPrefix(sv.url, "nats://"))
	}
	if sv.healthLn != nil {
		addrs = append(addrs, "health "+sv.healthLn.Addr().String())
	}
	if sv.httpLn != nil {
		addrs = append(addrs, "http "+sv.httpLn.Addr().String())
	}
	sv.listening(addrs)
	log := sv.log
	denied := &denials{grants: shippedGrants(sv.cfg), prefer: "processor", other: func(err error) { log.Warn("NATS reported an error", "err", err) }}
	// Nothing of the connection is logged once serve has returned: its
	// caller may then use the log's writer.
	sv.later(denied.silence)
	denied.report = func(v denial) {
		if denied.first(v) && notSys(v) {
			log.Error("NATS refused a permission", "refusal", denied.describe(v))
		}
	}
	sv.denied = denied
	nc, err := sv.conn.connect("seamguard serve", sv.url, denied, nats.ReconnectBufSize(-1),
		nats.PingInterval(5*time.Second), nats.MaxPingsOutstanding(2))
	if err != nil {
		return err
	}
	sv.later(nc.Close)
	sv.nc = nc
	if sv.js, err = jetstream.New(nc); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return nil
}

// durability checks, and logs, whether the NATS servers sync before they
// acknowledge.
func (sv *serving) durability(ctx context.Context) syncState {
	durable := syncState{Known: true, Servers: 1}
	if sv.conn.url != "" {
		askCtx, stopAsk := sv.denied.cancelOn(ctx, askSys)
		durable = askSync(askCtx, sv.nc, sv.monitorURLs, 2*time.Second)
		stopAsk()
	} else if sv.sync > 0 {
		durable.Lazy = []string{"embedded: sync_interval " + sv.sync.String()}
	}
	switch {
	case !durable.Known:
		sv.log.Warn("cannot tell whether the NATS servers sync before acknowledging: an acknowledged event, verdict or spill survives a power cut only if they do (jetstream { sync_interval: always }); give --nats-monitor-url, or a user in the system account, for serve to check")
	case !durable.Durable():
		sv.log.Warn("the NATS servers acknowledge before they sync to disk: a power cut loses what was acknowledged since their last sync, and seamguard's guarantee does not hold; configure jetstream { sync_interval: always }", "lazy", strings.Join(durable.Lazy, "; "))
	default:
		sv.log.Info("the NATS servers sync before acknowledging", "servers", durable.Servers)
	}
	return durable
}

// newProcessor sets the processor up (its responder connection and its
// metrics recorder, with --health-listen). No processor and no error when
// ctx ended before it was set up: nothing to drain.
func (sv *serving) newProcessor(ctx context.Context) (*processor.Processor, *metrics.Recorder, error) {
	opts := []processor.Option{processor.WithLogger(sv.log)}
	if sv.resp.set() {
		rnc, rd, err := sv.resp.connect(sv.conn, sv.url, sv.denied.grants, sv.log)
		sv.later(rd.silence)
		if err != nil {
			return nil, nil, err
		}
		sv.later(rnc.Close)
		opts = append(opts, processor.WithResponder(rnc))
	}
	var rec *metrics.Recorder
	if *sv.healthListen != "" {
		rec = metrics.New()
		opts = append(opts, processor.WithObserver(rec))
	}
	startCtx, stopStart := sv.denied.cancelOn(ctx, notSys)
	p, err := processor.New(startCtx, sv.js, sv.cfg, opts...)
	stopStart()
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, nil
		}
		return nil, nil, sv.denied.explain(err, notSys)
	}
	return p, rec, nil
}

// watchHealth serves the health endpoints and the metrics, and has rec
// watch the consumers' lag, until ctx ends.
func (sv *serving) watchHealth(ctx context.Context, p *processor.Processor, rec *metrics.Recorder, durable syncState) {
	rec.WatchProcessor(p)
	rec.SyncAlways(durable.Gauge())
	addr := serveHealth(ctx, sv.healthLn, health{nc: sv.nc, ready: p.Ready, parked: p.Parked, metrics: rec.Handler()}, sv.log)
	pc := p.Config()
	consumers := make([]string, 0, pc.Partitions+1)
	for part := -1; part < pc.Partitions; part++ {
		consumers = append(consumers, pc.ConsumerName(part))
	}
	lagDone := make(chan struct{})
	lagCtx, stopLag := context.WithCancel(ctx)
	go func() {
		defer close(lagDone)
		rec.WatchConsumers(lagCtx, sv.js, pc.Names().Events, consumers, sv.lagInterval, sv.log)
	}()
	sv.later(func() { stopLag(); <-lagDone })
	sv.log.Info("health endpoints", "url", "http://"+addr+"/healthz", "metrics", "http://"+addr+"/metrics")
}

// escapeLogAttr escapes the control characters of a log attribute's string,
// or of an error's text (termtext.Escape).
func escapeLogAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(termtext.Escape(a.Value.String()))
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case error:
			a.Value = slog.StringValue(termtext.Escape(v.Error()))
		case fmt.Stringer:
			a.Value = slog.StringValue(termtext.Escape(v.String()))
		}
	}
	return a
}
