package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// Processor is the keyed stream processor: it consumes the events stream with
// a durable pull consumer, runs each session's events through the pure core
// on the session's owner goroutine, publishes the verdicts, writes spills,
// stores the session state and only then acknowledges the input.
//
// Create it with New; Run it once. Abort may be called from any goroutine.
type Processor struct {
	cfg    Config
	js     jetstream.JetStream
	res    *Resources
	store  *spill.Store
	enc    events.Encoder
	signer *attest.Signer // signs every output (see publish)
	lcfg   ledger.Config  // the decision settings in force
	subj   events.Subjects
	log    *slog.Logger
	now    func() time.Time
	status func() nats.Status
	obs    Observer
	// responder is the connection the services answer on (WithResponder);
	// nil: the one js uses.
	responder *nats.Conn
	denied    denials // requests the services would not answer

	mu    sync.Mutex
	abort context.CancelFunc

	health   troubles
	parked   parkedSet     // sessions parked (park.go)
	batches  batcher       // atomic batches of verdicts and states (batch.go)
	checkNow chan struct{} // asks watchStores for a check now; see noticeFailure

	running atomic.Bool
	count   counters
	// multiGetOff: a batch read of states failed; states are read one
	// request each (prefetch.go).
	multiGetOff atomic.Bool
	// directOffUntil: direct gets of the events stream went unanswered;
	// until this time (Unix nanoseconds; 0: on) the prefetch asks its
	// leader for every lookup (direct.go).
	directOffUntil atomic.Int64
	// reads are the connections the shards read on (direct.go).
	reads []*nats.Conn
	// control is the latest answer of which sessions have messages on
	// their control subject (prefetch.go).
	control controlCache
	// windows holds each fetcher's ack window by consumer name, for a
	// stalled test to show (AckWindows).
	windows sync.Map
	// floors are the partitions' floors stored (floor.go).
	floors *floors
}

// counters are what Stats reports, counted as it happens; each is safe
// for concurrent use.
type counters struct {
	handled      atomic.Uint64 // inputs decided (Stats.Handled)
	fenced       atomic.Uint64 // states another writer had changed (Stats.Fenced)
	reloaded     atomic.Uint64 // held sessions read again after a break in delivery (Stats.Reloaded)
	appliedAhead atomic.Uint64 // messages applied from the stream ahead of their redelivery (Stats.CaughtUp)
	floored      atomic.Uint64 // states read fresh that a floor showed caught up (Stats.Floored)
	floorWrites  atomic.Uint64 // floors stored (Stats.FloorWrites)
	dropped      atomic.Uint64 // idle sessions dropped from memory (Stats.Dropped)
	expired      atomic.Uint64 // deliveries left undecided as their lease ended (Stats.Expired)
	readAhead    atomic.Uint64 // reads made by a batch's prefetch (Stats.ReadAhead)
	readInBatch  atomic.Uint64 // reads a batch made one at a time (Stats.ReadInBatch)
	parkedInputs atomic.Uint64 // inputs acknowledged into park records (Stats.ParkedInputs)
	cached       atomic.Int64  // sessions the shards hold now (Stats.Sessions)
}

// Option adjusts a Processor for tests.
type Option func(*Processor)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(p *Processor) { p.log = l } }

// WithClock sets the clock that stamps verdict times; the default is time.Now.
func WithClock(now func() time.Time) Option { return func(p *Processor) { p.now = now } }

// WithResponder sets the connection the processor's services (the recover
// service) receive requests on and answer from. Its identity should be
// allowed to subscribe to the service subjects and to publish to the
// inbox prefixes of Config.ReplyPrefixes, and nothing else: the services
// never answer elsewhere, and such an identity makes sure a slip in them
// cannot either. The default is the connection of the JetStream context
// New is given. The caller keeps the connection open while Run runs, and
// closes it.
func WithResponder(nc *nats.Conn) Option { return func(p *Processor) { p.responder = nc } }

// New validates cfg, provisions the streams, bucket and object store, and
// returns a Processor ready to Run.
func New(ctx context.Context, js jetstream.JetStream, cfg Config, opts ...Option) (*Processor, error) {
	opt := &Processor{log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(opt)
	}
	var res *Resources
	err := starting(ctx, opt.log, cfg.withDefaults().StartTimeout, "setting up its streams, buckets and object store", func(ctx context.Context) (err error) {
		res, err = Provision(ctx, js, cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	cfg.Partitions, cfg.controlApart = res.Partitions, res.ControlApart
	cfg = cfg.withDefaults()
	// Every verdict is at most events.MaxOutputBytes: a server that takes
	// less could refuse one for good, which no retry would fix.
	if mp := js.Conn().MaxPayload(); mp > 0 && mp < events.MaxOutputBytes+stateMargin {
		return nil, fmt.Errorf("processor: the NATS server's max_payload is %d bytes; seamguard needs at least %d (a verdict takes up to %d): raise max_payload in the server's configuration",
			mp, events.MaxOutputBytes+stateMargin, events.MaxOutputBytes)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = autoReplicas(js.Conn())
	}
	p := &Processor{
		cfg:  cfg,
		js:   js,
		res:  res,
		subj: cfg.Subjects(),
		log:  slog.New(slog.DiscardHandler),
		now:  time.Now,
		obs:  nopObserver{},

		checkNow: make(chan struct{}, 1),
		floors:   newFloors(cfg.Partitions),
	}
	p.batches.p = p
	for _, o := range opts {
		o(p)
	}
	if err := res.StatesNotAtomic; err != nil && !cfg.NoAtomicBatches {
		p.batches.offStates.Store(true)
		p.log.Warn("session states are written one at a time: the session bucket does not allow atomic batches", "err", err)
	}
	p.denied.log, p.denied.obs = p.log, p.obs
	p.enc = events.Encoder{Source: cfg.Source, Subjects: p.subj, Now: p.now}
	if cfg.SigningKey != "" {
		// Validate, through Provision, has read it already.
		if p.signer, err = attest.NewSigner([]byte(cfg.SigningKey)); err != nil {
			return nil, fmt.Errorf("processor: SigningKey: %w", err)
		}
	} else {
		if p.signer, err = attest.Generate(); err != nil {
			return nil, err
		}
		p.log.Warn("no signing key configured: verdicts are signed with a key made for this run, which verifiers cannot trust after a restart; configure one (serve keeps one in its data directory)", "signing_key", p.signer.PublicKey())
	}
	p.lcfg = ledger.Config{Policy: cfg.Policy, Limits: stateLimits(cfg.Limits, res, js.Conn().MaxPayload(), p.log)}
	p.store = &spill.Store{
		JS: js, Stream: cfg.Names().Events, Subjects: p.subj, Bucket: cfg.Names().Spills,
		Retries: cfg.SpillRetries, Verify: cfg.SpillVerify,
		RegistrationTTL: min(spill.DefaultRegistrationTTL, cfg.SweepMinAge),
		Ledger:          p.lcfg,
	}
	p.status = js.Conn().Status
	return p, nil
}

// SigningPublicKey is the public NKey that signs this Processor's outputs:
// the key subscribers trust. It may be called at any time.
func (p *Processor) SigningPublicKey() string { return p.signer.PublicKey() }

// stateMargin is what a stored state takes beyond the ledger's snapshot:
// its own header, and the headers of the bucket write.
const stateMargin = 1 << 10

// stateLimits returns l with its snapshot limit kept under what the
// session bucket and the server take, so that a state the ledger allows is
// one the bucket stores.
func stateLimits(l ledger.Limits, res *Resources, maxPayload int64, log *slog.Logger) ledger.Limits {
	want := l.MaxSnapshotBytes
	if want == 0 {
		want = ledger.DefaultMaxSnapshotBytes
	}
	most := int64(want)
	if maxPayload > 0 {
		most = min(most, maxPayload-stateMargin)
	}
	if v := res.SessionsMaxValue; v > 0 {
		most = min(most, int64(v)-stateMargin)
	}
	most = max(most, int64(ledger.MinSnapshotBytes))
	if most < int64(want) {
		log.Info("session snapshots limited below the configured limit, to what the bucket and server take", "configured", want, "limit", most)
	}
	l.MaxSnapshotBytes = int(most)
	return l
}

// Resources returns the JetStream handles the processor provisioned.
func (p *Processor) Resources() *Resources { return p.res }

// Config returns the configuration in force, defaults filled in.
func (p *Processor) Config() Config { return p.cfg }

// Run consumes until ctx is cancelled, then drains: it stops fetching,
// finishes every message already fetched (publishing, storing and acking), and
// returns nil. It returns an error if a consumer cannot be created or the
// processor hits a failure it cannot retry. Abort stops it without draining.
//
// Run consumes every partition whose lease it holds through the
// partition's durable consumer: where several instances run, each holds
// its fair share of the partitions' leases, and a partition whose holder
// stopped is taken over when its lease expires (LeaseTTL). A drain hands
// the partitions over at its end, at once.
func (p *Processor) Run(ctx context.Context) error {
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	p.mu.Lock()
	p.abort = cancel
	p.mu.Unlock()
	drainTimedOut, endWatch := p.watchDrain(ctx, cancel)
	defer endWatch()
	consumers, err := p.openConsumers(ctx)
	if consumers == nil {
		return err // nil: asked to stop before it began, nothing to drain
	}
	lease, stopLeases, err := p.startLeases(ctx, hard)
	if lease == nil {
		return err
	}
	defer stopLeases()
	defer p.startWatchers(hard, cancel)()
	stopRecover := p.serveRecover(ctx, hard) // stops when the drain begins
	defer stopRecover()
	// The writers of states and verdicts (group.go) outlive every shard:
	// each waits for their answers.
	states, verdicts, stopGroups := p.startWriteGroups(hard)
	defer stopGroups()
	defer p.openReads()()

	if err := p.consume(ctx, hard, cancel, consumers, lease, states, verdicts); err != nil {
		return err
	}
	// Drained: everything fetched here is acknowledged. Store the floors
	// of it (floor.go), and hand the partitions over now rather than let
	// their leases expire.
	if hard.Err() == nil {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseWait)
		p.storeFinalFloors(fctx)
		cancel()
	}
	stopLeases()
	if hard.Err() == nil || drainTimedOut.Load() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseWait)
		lease.releaseAll(rctx)
		cancel()
	}
	p.log.Info("processor stopped")
	return nil
}

// watchDrain ends a drain that cannot finish (a session stuck, a server
// away) after DrainTimeout as an abort does (cancel): what it had not
// finished is redelivered to whoever takes its partitions. timedOut says
// whether it did; end stops the watch.
func (p *Processor) watchDrain(ctx context.Context, cancel context.CancelFunc) (timedOut *atomic.Bool, end func()) {
	timedOut = &atomic.Bool{}
	ended := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-ended:
			return
		}
		t := time.NewTimer(p.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			p.log.Error("drain did not finish in time; stopping without it: unfinished inputs are redelivered to the next owner", "drain_timeout", p.cfg.DrainTimeout, "troubles", p.health.err())
			timedOut.Store(true)
			cancel()
		case <-ended:
		}
	}()
	return timedOut, func() { close(ended) }
}

// openConsumers creates or updates the durable consumer of every
// partition (and of the control subjects), waiting while NATS does not
// answer; nil and no error when ctx ended first. The control subjects'
// consumer goes first, alone, so that only it waits and warns while NATS
// is away; the partitions' then all at once: a server that syncs every
// write stores each consumer's configuration with an fsync of its own,
// and one after another they would hold up the start by as many.
func (p *Processor) openConsumers(ctx context.Context) ([]jetstream.Consumer, error) {
	consumers := make([]jetstream.Consumer, p.cfg.Partitions+1)
	errs := make([]error, p.cfg.Partitions+1)
	open := func(part int) {
		consumers[part+1], errs[part+1] = p.openConsumer(ctx, part)
	}
	if open(-1); errs[0] != nil || consumers[0] == nil {
		return nil, errs[0]
	}
	var wg sync.WaitGroup
	for part := range p.cfg.Partitions {
		wg.Go(func() { open(part) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || consumers[i] == nil {
			return nil, err
		}
	}
	return consumers, nil
}

// openConsumer creates or updates the durable consumer of part; nil and
// no error when ctx ended first. A consumer the server holds configured
// exactly as this instance would configure it is taken as it is: an
// update stores the configuration again even unchanged, with an fsync on
// a server that syncs every write.
func (p *Processor) openConsumer(ctx context.Context, part int) (jetstream.Consumer, error) {
	stream := p.cfg.Names().Events
	want := p.cfg.ConsumerConfig(part)
	var cons jetstream.Consumer
	err := starting(ctx, p.log, p.cfg.StartTimeout, "creating consumer "+p.cfg.ConsumerName(part), func(ctx context.Context) (err error) {
		cons, err = p.js.Consumer(ctx, stream, want.Durable)
		switch {
		case err == nil && configured(want, cons.CachedInfo().Config):
			return nil
		case err != nil && waitable(err):
			return err // NATS away: waited for, and warned of, as a create
		}
		// Not there, configured otherwise, or not to be read (an update
		// says why, if it fails too).
		cons, err = p.js.CreateOrUpdateConsumer(ctx, stream, want)
		return err
	})
	if err == nil {
		return cons, nil
	}
	if ctx.Err() != nil {
		return nil, nil
	}
	if old, ierr := p.js.Consumer(ctx, stream, want.Durable); ierr == nil && old.CachedInfo().Config.AckPolicy != want.AckPolicy {
		return nil, fmt.Errorf("processor: consumer %s on %s acknowledges with policy %s, this version with %s, and JetStream cannot change it in place: "+
			"stop every instance, delete the consumer (nats consumer rm %s %s) and start again; its inputs are delivered again and those applied are skipped: %w",
			want.Durable, stream, old.CachedInfo().Config.AckPolicy, want.AckPolicy, stream, want.Durable, err)
	}
	return nil, fmt.Errorf("processor: consumer %s on %s: %w", p.cfg.ConsumerName(part), stream, err)
}

// configured reports whether got, a consumer configuration as the server
// holds it, is want: every field of either is the same in the other, but
// for those the server fills in itself (the name, from the durable name;
// the most pull requests waiting, when it is the server's default; and
// its own metadata, the keys that begin "_nats."). Anything else set on
// the consumer and not by this instance (a priority group, a pin, another
// filter) is not. Fields are compared as JSON, where an empty map or list
// and none are alike.
func configured(want, got jetstream.ConsumerConfig) bool {
	const serverMaxWaiting = 512 // nats-server's default for a pull consumer
	if got.Name == want.Durable && want.Name == "" {
		got.Name = ""
	}
	if want.MaxWaiting == 0 && got.MaxWaiting == serverMaxWaiting {
		got.MaxWaiting = 0
	}
	got.Metadata = maps.Clone(got.Metadata)
	maps.DeleteFunc(got.Metadata, func(k, _ string) bool { return strings.HasPrefix(k, "_nats.") })
	wb, err1 := json.Marshal(want)
	gb, err2 := json.Marshal(got)
	return err1 == nil && err2 == nil && bytes.Equal(wb, gb)
}

// startLeases starts taking and renewing partition leases until hard ends
// or stop is called (stop may be called more than once). No leases and no
// error when ctx ended before the bucket was read.
func (p *Processor) startLeases(ctx, hard context.Context) (lease *leases, stop func(), err error) {
	var kstream jetstream.Stream
	err = starting(ctx, p.log, p.cfg.StartTimeout, "reading the leases bucket", func(ctx context.Context) (err error) {
		kstream, err = p.js.Stream(ctx, p.cfg.Names().LeasesStream())
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("processor: bucket %s: %w", p.cfg.Names().Leases, err)
	}
	lease = newLeases(p.res.Leases, kstream, p.cfg.Names().Leases, p.cfg.Partitions, p.cfg.LeaseTTL, p.log)
	lease.report = func(err error) {
		if err != nil {
			p.health.set("leases", fmt.Errorf("the bucket %s does not take this instance's writes: %w", p.cfg.Names().Leases, err))
		} else {
			p.health.clear("leases")
		}
	}
	leaseCtx, stopLeases := context.WithCancel(hard)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lease.run(leaseCtx)
	}()
	return lease, func() { stopLeases(); <-done }, nil
}

// startWatchers starts the loops beside consuming (the spill sweep, the
// stores' and the parked sessions' watches) until hard ends; stop cancels
// hard and waits for them.
func (p *Processor) startWatchers(hard context.Context, cancel context.CancelFunc) (stop func()) {
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){p.sweepSpills, p.watchStores, p.watchParked} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(hard)
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// startWriteGroups starts the writers of states and of verdicts; stop
// ends them once nothing waits for them.
func (p *Processor) startWriteGroups(hard context.Context) (states, verdicts *writeGroup, stop func()) {
	states, verdicts = newWriteGroup(p, true), newWriteGroup(p, false)
	ctx, cancel := context.WithCancel(hard)
	var wg sync.WaitGroup
	for _, g := range []*writeGroup{states, verdicts} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.run(ctx)
		}()
	}
	return states, verdicts, func() { cancel(); wg.Wait() }
}

// consume runs a shard goroutine each and a fetcher for each consumer
// until the fetchers stop (ctx ends, or a failure cancels hard), then
// lets the shards finish what they hold; it returns the first failure.
func (p *Processor) consume(ctx, hard context.Context, cancel context.CancelFunc, consumers []jetstream.Consumer, lease *leases, states, verdicts *writeGroup) error {
	shards := make([]*shard, p.cfg.Shards)
	errs := make(chan error, len(shards)+len(consumers))
	var wg sync.WaitGroup
	for i := range shards {
		shards[i] = &shard{p: p, index: i, lease: lease, states: states, verdicts: verdicts, q: make(chan delivery, p.cfg.QueueDepth), sessions: map[string]*session{}}
		wg.Add(1)
		go func(s *shard) {
			defer wg.Done()
			if err := s.run(hard); err != nil && !errors.Is(err, context.Canceled) {
				errs <- err
				cancel()
			}
		}(shards[i])
	}
	p.log.Info("processor running", "stream", p.cfg.Names().Events, "partitions", p.cfg.Partitions, "shards", p.cfg.Shards)
	var fetchers sync.WaitGroup
	for i, cons := range consumers {
		fetchers.Add(1)
		go func() {
			defer fetchers.Done()
			if err := p.fetch(ctx, hard, cons, i-1, lease, shards); err != nil {
				errs <- err
				cancel()
			}
		}()
	}
	p.running.Store(true)
	fetchers.Wait()
	p.running.Store(false)
	for _, s := range shards {
		close(s.q)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// sweepSpills sweeps the spill bucket for orphaned chunks now and every
// SweepEvery until ctx ends.
func (p *Processor) sweepSpills(ctx context.Context) {
	if p.cfg.SweepEvery < 0 {
		return
	}
	for {
		rep, err := p.store.SweepOrphans(ctx, p.cfg.SweepMinAge)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.log.Warn("sweeping the spill bucket for orphaned chunks failed; trying again at the next sweep", "err", err)
		case rep.Orphans > 0 || rep.Stale > 0:
			p.log.Info("swept orphaned chunks from the spill bucket", "objects", rep.Orphans, "chunks", rep.Messages,
				"dead_writes", rep.Stale, "writes_in_progress", rep.Writes, "too_young", rep.Young)
		}
		if sleep(ctx, p.cfg.SweepEvery) != nil {
			return
		}
	}
}

// Ready reports whether Run is consuming; nil means ready.
func (p *Processor) Ready() error {
	if !p.running.Load() {
		return errors.New("processor: not consuming")
	}
	if st := p.status(); st != nats.CONNECTED {
		return fmt.Errorf("processor: NATS connection is %s", st)
	}
	return p.health.err()
}

// Stats are counters of what the runtime did, for tests and metrics.
type Stats struct {
	Handled  uint64 // inputs decided (skipped redeliveries not counted)
	Fenced   uint64 // session states another instance had changed: cache dropped, inputs left to it
	Reloaded uint64 // cached sessions read again after a break in delivery
	CaughtUp uint64 // messages applied from the stream ahead of their redelivery
	// Floored counts states read fresh that their partition's floor
	// showed caught up, so that their catch-up's lookups were not made
	// (see processor/floor.go).
	Floored uint64
	// FloorWrites counts the partitions' floors stored in the session
	// bucket, with the states or on their own after a drain.
	FloorWrites uint64
	Dropped     uint64 // idle sessions dropped from memory past MaxSessions
	// Expired counts deliveries left undecided because the lease of their
	// partition ended (or changed hands) after they were fetched: their
	// redelivery, or the new owner, decides them.
	Expired  uint64
	Stuck    int // sessions stuck now (see Config.RetryFor)
	Sessions int // sessions held in memory now (see Config.MaxSessions)
	// ReadAhead counts the reads of stored states and lookups in the
	// events stream made concurrently when a batch arrived; ReadInBatch
	// those a batch had to make one at a time (not read ahead, or the read
	// ahead failed).
	ReadAhead   uint64
	ReadInBatch uint64
	// ServiceDenied counts the requests to the processor's services that
	// were not served: a reply subject outside the inbox prefixes (no
	// answer) or a full queue (answered 503).
	ServiceDenied uint64
	// Parked is how many sessions are parked now (as this instance knows);
	// ParkedInputs counts the inputs acknowledged into park records.
	Parked       int
	ParkedInputs uint64
	// AtomicBatches counts the atomic batches of verdicts and states
	// committed, BatchedWrites the messages they held, and BatchFallbacks
	// the batches that did not commit and were written one message at a
	// time (see Config.NoAtomicBatches).
	AtomicBatches, BatchedWrites, BatchFallbacks uint64
}

// Stats returns the counters so far. Safe for concurrent use.
func (p *Processor) Stats() Stats {
	return Stats{Handled: p.count.handled.Load(), Fenced: p.count.fenced.Load(), Reloaded: p.count.reloaded.Load(), CaughtUp: p.count.appliedAhead.Load(), Floored: p.count.floored.Load(), FloorWrites: p.count.floorWrites.Load(),
		Dropped: p.count.dropped.Load(), Expired: p.count.expired.Load(), Stuck: p.StuckSessions(), Sessions: int(p.count.cached.Load()),
		ReadAhead: p.count.readAhead.Load(), ReadInBatch: p.count.readInBatch.Load(), ServiceDenied: p.denied.total.Load(),
		Parked: int(p.parked.n.Load()), ParkedInputs: p.count.parkedInputs.Load(),
		AtomicBatches: p.batches.committed.Load(), BatchedWrites: p.batches.messages.Load(), BatchFallbacks: p.batches.fellBack.Load()}
}

// Abort stops Run at once, without draining: messages in flight are neither
// finished nor acknowledged and will be redelivered, as after a crash.
func (p *Processor) Abort() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.abort != nil {
		p.abort()
	}
}
