package processor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	lcfg   ledger.Config // the decision settings in force
	subj   events.Subjects
	log    *slog.Logger
	now    func() time.Time
	status func() nats.Status
	obs    Observer

	mu    sync.Mutex
	abort context.CancelFunc

	health troubles

	running                                      atomic.Bool
	handled, fenced, reloaded, caughtUp, dropped atomic.Uint64
	expired                                      atomic.Uint64
	cached                                       atomic.Int64 // sessions the shards hold
}

// Option adjusts a Processor for tests.
type Option func(*Processor)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(p *Processor) { p.log = l } }

// WithClock sets the clock that stamps verdict times; the default is time.Now.
func WithClock(now func() time.Time) Option { return func(p *Processor) { p.now = now } }

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
	cfg.Partitions = res.Partitions
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
	}
	for _, o := range opts {
		o(p)
	}
	p.enc = events.Encoder{Source: cfg.Source, Subjects: p.subj, Now: p.now}
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

// starting runs f, the setting up of what the processor needs, again while
// it fails because NATS does not answer (a cluster restarting, electing
// its leaders), for at most timeout, and returns its last error.
//
// Each attempt gets at most a quarter of timeout (and at least 5s): a
// server without a JetStream quorum leaves API requests unanswered, and
// one would otherwise wait for ctx's own deadline.
func starting(ctx context.Context, log *slog.Logger, timeout time.Duration, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, max(timeout/4, 5*time.Second))
		err := f(actx)
		cancel()
		if err == nil || !waitable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		log.Warn("NATS does not answer yet; retrying", "doing", what, "err", err, "attempt", attempt+1, "gives_up_in", time.Until(deadline).Round(time.Second))
		if sleep(ctx, min(backoff(attempt), time.Until(deadline))) != nil {
			return err
		}
	}
}

// waitable reports whether a failure to set up may pass by itself: NATS
// not answering, or a JetStream cluster saying that it cannot place or
// reach a stream now (no quorum, peers offline, a leader not yet elected).
func waitable(err error) bool {
	if Unreachable(err) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case 10004, // incomplete results
			10005,                      // no suitable peers for placement
			10008,                      // JetStream system temporarily unavailable
			10009,                      // cluster cannot handle the request (not leader)
			10118, 10119, 10194, 10195, // stream or consumer offline
			10167: // too many requests
			return true
		}
	}
	return false
}

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
	// A drain that cannot finish (a session stuck, a server away) ends
	// after DrainTimeout as an abort does: what it had not finished is
	// redelivered to whoever takes its partitions.
	var drainTimedOut atomic.Bool
	ended := make(chan struct{})
	defer close(ended)
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
			drainTimedOut.Store(true)
			cancel()
		case <-ended:
		}
	}()

	consumers := make([]jetstream.Consumer, 0, p.cfg.Partitions+1)
	for part := -1; part < p.cfg.Partitions; part++ {
		var cons jetstream.Consumer
		err := starting(ctx, p.log, p.cfg.StartTimeout, "creating consumer "+p.cfg.ConsumerName(part), func(ctx context.Context) (err error) {
			cons, err = p.js.CreateOrUpdateConsumer(ctx, p.cfg.Names().Events, p.cfg.ConsumerConfig(part))
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // asked to stop before it began: nothing to drain
			}
			want := p.cfg.ConsumerConfig(part)
			if old, ierr := p.js.Consumer(ctx, p.cfg.Names().Events, want.Durable); ierr == nil && old.CachedInfo().Config.AckPolicy != want.AckPolicy {
				stream := p.cfg.Names().Events
				return fmt.Errorf("processor: consumer %s on %s acknowledges with policy %s, this version with %s, and JetStream cannot change it in place: "+
					"stop every instance, delete the consumer (nats consumer rm %s %s) and start again; its inputs are delivered again and those applied are skipped: %w",
					want.Durable, stream, old.CachedInfo().Config.AckPolicy, want.AckPolicy, stream, want.Durable, err)
			}
			return fmt.Errorf("processor: consumer %s on %s: %w", p.cfg.ConsumerName(part), p.cfg.Names().Events, err)
		}
		consumers = append(consumers, cons)
	}
	var kstream jetstream.Stream
	err := starting(ctx, p.log, p.cfg.StartTimeout, "reading the leases bucket", func(ctx context.Context) (err error) {
		kstream, err = p.js.Stream(ctx, "KV_"+p.cfg.Names().Leases)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("processor: bucket %s: %w", p.cfg.Names().Leases, err)
	}
	lease := newLeases(p.res.Leases, kstream, p.cfg.Names().Leases, p.cfg.Partitions, p.cfg.LeaseTTL, p.log)
	lease.report = func(err error) {
		if err != nil {
			p.health.set("leases", fmt.Errorf("the bucket %s does not take this instance's writes: %w", p.cfg.Names().Leases, err))
		} else {
			p.health.clear("leases")
		}
	}
	leaseCtx, stopLeases := context.WithCancel(hard)
	leasesDone := make(chan struct{})
	go func() {
		defer close(leasesDone)
		lease.run(leaseCtx)
	}()
	defer func() {
		stopLeases()
		<-leasesDone
	}()

	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		p.sweepSpills(hard)
	}()
	defer func() { cancel(); <-sweepDone }()
	stopRecover := p.serveRecover(ctx, hard) // stops when the drain begins
	defer stopRecover()

	shards := make([]*shard, p.cfg.Shards)
	errs := make(chan error, len(shards)+len(consumers))
	var wg sync.WaitGroup
	for i := range shards {
		shards[i] = &shard{p: p, lease: lease, q: make(chan delivery, p.cfg.QueueDepth), sessions: map[string]*session{}}
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
	if err := <-errs; err != nil {
		return err
	}
	// Drained: everything fetched here is acknowledged. Hand the
	// partitions over now rather than let their leases expire.
	stopLeases()
	<-leasesDone
	if hard.Err() == nil || drainTimedOut.Load() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		lease.releaseAll(rctx)
		cancel()
	}
	p.log.Info("processor stopped")
	return nil
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

// fetch pulls one consumer's messages and hands them to their shards until
// ctx (drain) or hard (abort) ends, while this instance holds the lease of
// its partition, part (-1 for the consumer of subjects that name no
// session, which every instance reads). It returns an error only when the
// consumer is gone.
func (p *Processor) fetch(ctx, hard context.Context, cons jetstream.Consumer, part int, lease *leases, shards []*shard) error {
	name := cons.CachedInfo().Name
	// A message delivered before but not acknowledged (to a process that
	// died, to an instance that lost the partition, or lost on the way with
	// a connection or a restarted server) is redelivered only when its ack
	// deadline passes, interleaved with new messages: later messages of its
	// session may arrive first. horizon is the highest stream sequence such
	// a message may have; every session catches up to it from the stream
	// before it goes on (see catchUp), after reading its stored state again
	// (another instance may have moved it on). horizon is raised to what the
	// consumer has delivered whenever this instance's delivery sequence
	// breaks, which is how a lost delivery or a partition that changed hands
	// shows.
	//
	// Before the first fetch after taking the partition's lease, the
	// consumer's state says what was delivered before: if some of it is
	// unacknowledged, horizon rises to the highest stream sequence
	// delivered; if none is, nothing can be pending elsewhere. Either way
	// the next delivery must follow on from that state, or the sequence has
	// broken.
	win := &ackWindow{explicit: cons.CachedInfo().Config.AckPolicy != jetstream.AckAllPolicy}
	send := func(subject string, d delivery) {
		s := shards[shardOf(subject, len(shards))]
		select {
		case s.q <- d:
		case <-hard.Done():
		}
	}
	var horizon, lastDelivery, epoch uint64
	// takeOver reads the consumer's state when this instance begins to
	// consume it (at the start, or on taking the partition's lease): what
	// was delivered before and is still pending must be in the window
	// before anything delivered here is acknowledged.
	errStopped := errors.New("stopped")
	takeOver := func() error {
		either, stop := context.WithCancel(hard)
		defer context.AfterFunc(ctx, stop)()
		h, last, floor, err := p.startState(either, cons)
		stopped := either.Err() != nil
		stop()
		switch {
		case err != nil && stopped:
			return errStopped
		case err != nil:
			err := fmt.Errorf("processor: consumer %s on %s stopped: %w", name, p.cfg.Names().Events, err)
			p.log.Error("consumer stopped", "err", err)
			return err
		}
		lastDelivery = last
		if h > 0 {
			horizon = max(horizon, h)
			for _, m := range p.adopt(hard, cons, part, win, floor, h) {
				m.part, m.epoch = part, epoch
				send(p.route(m.markSubject), m)
			}
		}
		return nil
	}
	if part < 0 {
		if err := takeOver(); err != nil {
			if err == errStopped {
				return nil // stopped before it began
			}
			return err
		}
	}
	dispatch := func(msg jetstream.Msg) {
		meta, merr := msg.Metadata()
		var marks []delivery
		if merr == nil {
			if meta.Sequence.Consumer != lastDelivery+1 {
				delivered, floor := p.delivered(hard, cons)
				h := max(delivered, meta.Sequence.Stream)
				if lastDelivery != 0 {
					p.log.Info("a delivery was lost or the partition changed hands; sessions catch up from the stream",
						"consumer", name, "after", lastDelivery, "got", meta.Sequence.Consumer, "horizon", h)
				}
				horizon = max(horizon, h)
				marks = p.adopt(hard, cons, part, win, floor, h)
			}
			lastDelivery = meta.Sequence.Consumer
		}
		d := delivery{msg: msg, meta: meta, metaErr: merr, horizon: horizon, at: time.Now(), part: part, epoch: epoch}
		switch {
		case merr == nil && p.foreign(msg.Subject(), part):
			// Another partition's session's resume: its own consumer
			// decides it; here it is only finished, in its place.
			win.add(meta.Sequence.Stream, msg)
			win.finish(meta.Sequence.Stream, msg, "")
			for _, a := range win.release() {
				p.sendAck(a)
			}
		case merr == nil:
			d.win = win
			win.add(meta.Sequence.Stream, msg)
			send(p.route(msg.Subject()), d)
		default:
			send(p.route(msg.Subject()), d)
		}
		for i := range marks {
			marks[i].part, marks[i].epoch = part, epoch
		}
		// The markers follow the message that showed the break, so that it
		// is decided on its own delivery, not caught up ahead of it.
		for _, m := range marks {
			send(p.route(m.markSubject), m)
		}
	}

	// Fetch in batches rather than keep a pull request open: a fetch ends
	// with the server's own answer (batch full, or its expiry), which comes
	// after its last message. So a drain finishes the fetch in flight and
	// stops with no delivery on the way: nothing it was sent stays
	// unacknowledged until the ack deadline (a continuous pull, unsubscribed,
	// can lose a message the server was sending at that moment).
	// An input held in the window that another instance has since
	// acknowledged (its session was fenced here, or it was held from a
	// listing) is never delivered here again: while the window is blocked,
	// the consumer's ack floor is read now and then, and what is at or
	// below it is dropped from the window.
	owned := false // the lease was held at the last look
	lastPrune := time.Now()
	unblock := func() {
		if win.explicit || time.Since(lastPrune) < pruneEvery || !win.blocked() {
			return
		}
		lastPrune = time.Now()
		_, floor := p.delivered(hard, cons)
		win.prune(floor)
		for _, a := range win.release() {
			p.sendAck(a)
		}
	}
	for attempt := 0; ctx.Err() == nil && hard.Err() == nil; {
		unblock()
		wait := fetchWait
		if part >= 0 {
			changed := lease.changed() // before begin: no change is missed
			w, ep, ok := lease.begin(part, fetchWait)
			if !ok {
				owned = false
				t := time.NewTimer(leaseIdle)
				select {
				case <-changed:
				case <-t.C:
				case <-ctx.Done():
				case <-hard.Done():
				}
				t.Stop()
				continue
			}
			wait = w
			if ep != epoch {
				owned = false // taken again since the last fetch
				epoch = ep
			}
			if !owned {
				if err := takeOver(); err != nil {
					lease.end(part)
					if err == errStopped {
						return nil
					}
					return err
				}
				owned = true
			}
		}
		batch, err := cons.Fetch(p.cfg.MaxBatch*2, jetstream.FetchMaxWait(wait), jetstream.FetchMaxBytes(p.fetchBytes()))
		if err == nil {
			msgs := batch.Messages()
		recv:
			for {
				select {
				case msg, ok := <-msgs:
					if !ok {
						break recv
					}
					dispatch(msg)
				case <-hard.Done():
					break recv
				}
			}
			err = batch.Error()
		}
		if part >= 0 {
			lease.end(part)
		}
		// A fetch that filled its count with bytes to spare, or its bytes,
		// may end with the server saying so: that is no failure.
		if err == nil || hard.Err() != nil || errors.Is(err, jetstream.ErrBatchCompleted) || errors.Is(err, jetstream.ErrMaxBytesExceeded) {
			p.health.clear("consumer " + name)
			attempt = 0
			continue
		}
		if _, ierr := cons.Info(hard); errors.Is(ierr, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConnectionClosed) {
			err := fmt.Errorf("processor: consumer %s on %s stopped: %w", name, p.cfg.Names().Events, errors.Join(err, ierr))
			p.log.Error("consumer stopped", "err", err)
			return err
		}
		p.log.Warn("fetching failed; retrying", "consumer", name, "err", err)
		if attempt >= 2 {
			p.health.set("consumer "+name, fmt.Errorf("fetching fails: %w", err))
		}
		if sleep(hard, backoff(attempt)) != nil {
			return nil
		}
		attempt++
	}
	return nil
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
	Dropped  uint64 // idle sessions dropped from memory past MaxSessions
	// Expired counts deliveries left undecided because the lease of their
	// partition ended (or changed hands) after they were fetched: their
	// redelivery, or the new owner, decides them.
	Expired  uint64
	Stuck    int // sessions stuck now (see Config.RetryFor)
	Sessions int // sessions held in memory now (see Config.MaxSessions)
}

// Stats returns the counters so far. Safe for concurrent use.
func (p *Processor) Stats() Stats {
	return Stats{Handled: p.handled.Load(), Fenced: p.fenced.Load(), Reloaded: p.reloaded.Load(), CaughtUp: p.caughtUp.Load(),
		Dropped: p.dropped.Load(), Expired: p.expired.Load(), Stuck: p.StuckSessions(), Sessions: int(p.cached.Load())}
}

// fetchWait is how long one fetch waits for messages, and so the longest a
// drain waits for the fetch in flight.
const fetchWait = time.Second

// fetchBytes is FetchBytes of this processor.
func (p *Processor) fetchBytes() int { return FetchBytes(p.js.Conn(), p.cfg) }

// FetchBytes bounds the bytes of one fetch of c's consumers on nc, so that
// the fetches of every partition at once stay within 32 MiB, well under
// the 64 MiB a server lets queue for one connection before it cuts the
// connection off as a slow consumer (big events would otherwise fill it:
// 2×MaxBatch events of 8 KiB are 8 MiB a partition). It is never under
// the largest message the server allows.
func FetchBytes(nc *nats.Conn, c Config) int {
	c = c.withDefaults()
	return max(int(nc.MaxPayload()), fetchBudget/(c.Partitions+1))
}

// fetchBudget is what the fetches of all partitions may bring at once.
const fetchBudget = 32 << 20

// leaseIdle is how often a fetcher whose partition's lease is not held
// here looks again, besides whenever a lease here changes.
const leaseIdle = 250 * time.Millisecond

// pruneEvery is how often a blocked ack window reads its consumer's ack
// floor (see fetch).
const pruneEvery = time.Second

// startState returns the horizon a consumer starts with and the consumer
// sequence of its last delivery, asking the server until it answers, ctx
// ends or the consumer is gone (then an error).
func (p *Processor) startState(ctx context.Context, cons jetstream.Consumer) (horizon, last, floor uint64, err error) {
	for attempt := 0; ; attempt++ {
		info, err := cons.Info(ctx)
		if err == nil {
			if info.NumAckPending > 0 {
				horizon = info.Delivered.Stream
			}
			return horizon, info.Delivered.Consumer, info.AckFloor.Stream, nil
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConnectionClosed) {
			return 0, 0, 0, err
		}
		p.log.Warn("reading the consumer's state failed; retrying", "err", err)
		p.consumerTrouble(cons, attempt, err)
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return 0, 0, 0, err
		}
	}
}

// delivered returns the highest stream sequence the consumer has delivered
// and its ack floor, asking the server until it answers or ctx ends (then
// zeros).
func (p *Processor) delivered(ctx context.Context, cons jetstream.Consumer) (delivered, floor uint64) {
	for attempt := 0; ; attempt++ {
		info, err := cons.Info(ctx)
		if err == nil {
			return info.Delivered.Stream, info.AckFloor.Stream
		}
		p.log.Warn("reading the consumer's state failed; retrying", "err", err)
		p.consumerTrouble(cons, attempt, err)
		if sleep(ctx, backoff(attempt)) != nil {
			return 0, 0
		}
	}
}

// consumerTrouble reports a consumer whose state cannot be read, from the
// third failure in a row on, until a fetch succeeds.
func (p *Processor) consumerTrouble(cons jetstream.Consumer, attempt int, err error) {
	if attempt >= 2 {
		p.health.set("consumer "+cons.CachedInfo().Name, fmt.Errorf("reading its state fails: %w", err))
	}
}

// adopt makes win hold every input of cons in (floor, upto]: after a break
// in delivery (or at the start, with inputs pending), the server holds them
// pending, delivered elsewhere or here, and an ack may not cover them until
// they are applied. It returns a marker for each session among them, for
// the caller to send to its shard, which catches the session up from the
// stream past them and then finishes them (see handle). An input whose
// subject names no valid session waits for its redelivery. A window of
// explicit acks needs none of this.
func (p *Processor) adopt(ctx context.Context, cons jetstream.Consumer, part int, win *ackWindow, floor, upto uint64) []delivery {
	if win.explicit {
		return nil
	}
	win.prune(floor)
	if upto <= floor {
		return nil
	}
	cc := cons.CachedInfo().Config
	r := p.reader(append([]string{cc.FilterSubject}, cc.FilterSubjects...))
	bySubject := map[string][]uint64{}
	var order []string
	for seq := floor + 1; seq <= upto; {
		raw, err := r.next(ctx, nil, seq)
		if err != nil {
			if ctx.Err() == nil {
				// The window holds what was listed so far: its acks wait
				// until those are pruned (acknowledged elsewhere).
				p.health.set("consumer "+cons.CachedInfo().Name, fmt.Errorf("listing its pending inputs: %w", err))
			}
			return nil // stopping: nothing more is acknowledged
		}
		if raw == nil || raw.Sequence > upto {
			break
		}
		if p.foreign(raw.Subject, part) {
			win.hold(raw.Sequence) // another partition's: finished here
			win.finish(raw.Sequence, nil, "")
			seq = raw.Sequence + 1
			continue
		}
		if _, ok := bySubject[raw.Subject]; !ok {
			order = append(order, raw.Subject)
		}
		bySubject[raw.Subject] = append(bySubject[raw.Subject], raw.Sequence)
		win.hold(raw.Sequence)
		seq = raw.Sequence + 1
	}
	now := time.Now()
	marks := make([]delivery, 0, len(order))
	for _, subj := range order {
		marks = append(marks, delivery{win: win, mark: bySubject[subj], markSubject: subj, horizon: upto, at: now})
	}
	return marks
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

// shardOf is FNV-32a of the subject modulo n.
func shardOf(subject string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(subject); i++ {
		h ^= uint32(subject[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

// session is a shard's cached state of one session.
type session struct {
	id string
	// l is the ledger; nil while the session is idle, when idle holds its
	// snapshot instead (see shard.sweep), or before its first event.
	l     *ledger.Ledger
	idle  []byte
	used  bool   // stepped since the last sweep
	seq   uint64 // last applied stream sequence
	rev   uint64 // KV revision of the stored state; 0 when none is stored
	dirty bool
	// caughtUp is the horizon this session caught up to; 0 after loading.
	caughtUp uint64
	// loaded is the horizon in force when the state was read.
	loaded uint64
	// fresh is true from reading the state until its first catch-up.
	fresh bool
	// epoch is the epoch of its partition's lease when the state was read:
	// a later epoch means the partition was held elsewhere in between.
	epoch uint64
}

// ledger returns the session's ledger, restoring it from its snapshot when
// the session is idle.
func (sess *session) ledger() (*ledger.Ledger, error) {
	sess.used = true
	if sess.l != nil {
		return sess.l, nil
	}
	l := new(ledger.Ledger)
	if sess.idle != nil {
		if err := l.UnmarshalBinary(sess.idle); err != nil {
			return nil, fmt.Errorf("processor: session %s: restoring its idle ledger: %w", sess.id, err)
		}
	}
	sess.l, sess.idle = l, nil
	return l, nil
}

// state encodes what the bucket holds for the session.
func (sess *session) state() ([]byte, error) {
	switch {
	case sess.l != nil:
		return MarshalState(sess.seq, sess.l)
	case sess.idle != nil:
		return marshalState(sess.seq, sess.idle), nil
	}
	return MarshalState(sess.seq, new(ledger.Ledger)) // nothing applied yet but rejections
}

// closed reports whether the session was closed.
func (sess *session) closed() bool { return sess.l != nil && sess.l.Closed() }

// delivery is a message on its way to its shard, with the horizon in
// force when it arrived.
type delivery struct {
	msg jetstream.Msg
	win *ackWindow // the window of the consumer that delivered it
	// A marker (msg nil) holds the pending inputs of one session delivered
	// elsewhere (see adopt): the stream sequences, and the stored subject.
	mark        []uint64
	markSubject string
	meta        *jetstream.MsgMetadata // parsed once, on receipt
	metaErr     error
	horizon     uint64
	at          time.Time // when it was received, for the decision latency
	// part is the partition whose consumer delivered it (-1: the consumer
	// of subjects that name no session), and epoch the epoch of the lease
	// under which it was fetched.
	part  int
	epoch uint64
}

// seq is the stream sequence of the delivery (the last one a marker holds).
func (d delivery) seq() uint64 {
	switch {
	case d.meta != nil:
		return d.meta.Sequence.Stream
	case len(d.mark) > 0:
		return d.mark[len(d.mark)-1]
	}
	return 0
}

// shard owns the sessions whose subjects hash to it. Only its goroutine
// touches its map and ledgers.
type shard struct {
	p        *Processor
	lease    *leases
	q        chan delivery
	sessions map[string]*session
	// woken counts ledgers made live (read, restored or begun) since the
	// last sweep.
	woken int
}

// put caches sess.
func (s *shard) put(sess *session) {
	if _, ok := s.sessions[sess.id]; !ok {
		s.p.cached.Add(1)
	}
	s.sessions[sess.id] = sess
}

// drop removes session id from the cache.
func (s *shard) drop(id string) {
	if _, ok := s.sessions[id]; ok {
		s.p.cached.Add(-1)
		delete(s.sessions, id)
	}
}

// Idle sessions: a shard keeps the ledgers of the sessions it stepped
// lately in memory, and every other session as its snapshot, a few dozen
// bytes for most. A sweep, between batches, turns every session not stepped
// since the sweep before into its snapshot; it runs once maxLive ledgers
// have been made live since the last one, and every sweepEvery.
var (
	maxLive    = 4096
	sweepEvery = 30 * time.Second
	// idleAll makes every sweep idle every session it can, stepped lately
	// or not, and a sweep follow every batch (tests).
	idleAll = false
)

// sweep idles every session that was not stepped since the last sweep,
// then, while the shard holds more than its share of MaxSessions, drops
// idle sessions from memory altogether: their state is in the bucket, and
// they are read again (and caught up from the stream) when next used.
func (s *shard) sweep() {
	s.woken = 0
	for _, sess := range s.sessions {
		switch {
		case sess.l == nil:
		case sess.used && !idleAll:
			sess.used = false
		case !sess.dirty && !sess.l.Pending():
			snap, err := sess.l.MarshalBinary()
			if err != nil {
				continue // stays live
			}
			sess.idle, sess.l = bytes.Clone(snap), nil
		}
	}
	limit := max(1, s.p.cfg.MaxSessions/max(1, s.p.cfg.Shards))
	for id, sess := range s.sessions {
		if len(s.sessions) <= limit {
			break
		}
		if sess.l == nil && !sess.dirty {
			s.drop(id)
			s.p.dropped.Add(1)
		}
	}
}

func (s *shard) run(ctx context.Context) error {
	batch := make([]delivery, 0, s.p.cfg.MaxBatch)
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		var m delivery
		var ok bool
		select {
		case m, ok = <-s.q:
		case <-tick.C:
			s.sweep()
			continue
		case <-ctx.Done():
			return ctx.Err()
		}
		if !ok {
			return nil
		}
		batch = append(batch[:0], m)
	fill:
		for len(batch) < cap(batch) {
			select {
			case m, ok := <-s.q:
				if !ok {
					break fill
				}
				batch = append(batch, m)
			default:
				break fill
			}
		}
		if err := s.handle(ctx, batch); err != nil {
			return err
		}
		if s.woken >= maxLive || idleAll {
			s.sweep()
		}
	}
}

// ack is what to do with one input once its effects are durable.
type ack struct {
	msg     jetstream.Msg
	win     *ackWindow // nil: send at once (no metadata: not in any window)
	seq     uint64
	session string // the session it changed, if any
	term    string // non-empty: terminate with this reason instead of acking
}

// handle runs a batch: steps every message, publishes the outputs
// asynchronously, waits for every publish ack, stores every touched session
// once (a group commit), and only then acknowledges the inputs.
func (s *shard) handle(ctx context.Context, batch []delivery) error {
	p := s.p
	acks := make([]ack, 0, len(batch))
	var pubs []published
	var touched []*session
	// fenced holds the sessions another instance took over during the
	// batch: none of their inputs is acknowledged, nothing more of them is
	// published, and their state is not stored.
	var fenced map[string]bool
	leave := func(id string) {
		if fenced == nil {
			fenced = map[string]bool{}
		}
		fenced[id] = true
		s.drop(id)
	}
	fence := func(id string, err error) {
		p.log.Warn("session moved on under another instance; leaving it", "session", id, "err", err)
		p.fenced.Add(1)
		leave(id)
	}
	// A session whose effects cannot be made durable now (a failure
	// retrying cannot fix, or one that outlasted the batch's retry budget)
	// is left like a fenced one: its inputs stay unacknowledged and are
	// redelivered after the ack deadline, when it is tried again from its
	// stored state. Until one of its inputs is finished it is stuck, and
	// the processor reports itself unready. Every other session of the
	// batch goes on. Only the end of Run (ctx) stops the batch.
	b := &budget{limit: p.cfg.RetryFor}
	park := func(id string, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fenced[id] {
			return nil
		}
		if p.health.set(stuckPrefix+id, err) {
			p.obs.Stuck(id, true)
		}
		p.log.Error("session stuck: its inputs wait for redelivery", "session", id, "err", err, "stuck_sessions", p.health.stuck.Load())
		leave(id)
		return nil
	}
	for _, d := range batch {
		if d.mark != nil {
			if sid, err := p.subj.SessionOf(d.markSubject); err == nil && !fenced[sid] && !s.current(d, sid) {
				leave(sid)
				continue
			}
			if sid, err := s.adopted(ctx, b, d, &acks, &pubs, &touched, fenced, fence); err != nil {
				if err := park(sid, err); err != nil {
					return err
				}
			}
			continue
		}
		m, first := d.msg, len(pubs)
		meta, err := d.meta, d.metaErr
		if err != nil {
			p.log.Error("message without JetStream metadata", "subject", m.Subject(), "err", err)
			acks = append(acks, ack{msg: m, term: "seamguard: no JetStream metadata"})
			continue
		}
		seq := meta.Sequence.Stream
		var sess *session
		sid, serr := p.subj.SessionOf(m.Subject())
		if serr == nil && fenced[sid] {
			continue
		}
		if serr == nil {
			if !s.current(d, sid) {
				leave(sid)
				continue
			}
			sess, err = s.load(ctx, b, sid, d.horizon, d.epoch)
			if err != nil {
				if err := park(sid, err); err != nil {
					return err
				}
				continue
			}
			if seq <= sess.seq {
				// Applied before (a restart, a catch-up): never twice. The
				// ack waits for the session's store like any other: if
				// the batch loses the session to another instance, what
				// this instance applied may not be stored anywhere.
				acks = append(acks, ack{msg: m, win: d.win, seq: seq, session: sess.id})
				continue
			}
			if d.horizon > sess.caughtUp || sess.fresh {
				// The messages before this one that may be pending
				// elsewhere; those after it follow below. A state just
				// read always checks: the session may have been left
				// by a fenced batch whose inputs wait for redelivery.
				if err := s.catchUp(ctx, b, sess, seq-1, m, &pubs); errors.Is(err, errFenced) {
					fence(sess.id, err)
					continue
				} else if err != nil {
					if err := park(sess.id, err); err != nil {
						return err
					}
					continue
				}
				sess.fresh = false
			}
		}
		outs, term, err := p.step(ctx, sess, m.Subject(), m.Headers(), m.Data(), seq, func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
			return s.spill(ctx, b, m, sess, req)
		})
		if errors.Is(err, errFenced) {
			fence(sess.id, err)
			continue
		}
		if err != nil {
			if sess == nil {
				return err
			}
			// Its ledger may wait for a spill result: it is read again.
			if err := park(sess.id, err); err != nil {
				return err
			}
			continue
		}
		sid = ""
		if sess != nil {
			sid = sess.id
		}
		published := true
		for _, o := range outs {
			pub, err := p.publish(ctx, b, o)
			if err != nil {
				if err := park(sid, err); err != nil {
					return err
				}
				published = false
				break
			}
			pubs = append(pubs, pub)
		}
		if !published {
			continue
		}
		if sess != nil {
			sess.seq = seq
			if !sess.dirty {
				sess.dirty = true
				touched = append(touched, sess)
			}
			if d.horizon > sess.caughtUp {
				if err := s.catchUp(ctx, b, sess, d.horizon, m, &pubs); errors.Is(err, errFenced) {
					fence(sess.id, err)
					continue
				} else if err != nil {
					if err := park(sess.id, err); err != nil {
						return err
					}
					continue
				}
				sess.caughtUp = d.horizon
			}
		}
		for i := first; i < len(pubs); i++ {
			pubs[i].received = d.at // caught-up outputs too: decided on its receipt
		}
		p.handled.Add(1)
		a := ack{msg: m, win: d.win, seq: seq, term: term}
		if sess != nil {
			a.session = sess.id
		}
		acks = append(acks, a)
	}
	for _, pub := range pubs {
		if fenced[pub.out.Session] {
			continue // left: what it published stands, its inputs wait
		}
		if err := p.confirm(ctx, b, pub); err != nil {
			if err := park(pub.out.Session, err); err != nil {
				return err
			}
			continue
		}
		p.observe(pub)
	}
	stores := s.sendStores(touched, fenced, park)
	for _, st := range stores {
		if fenced[st.sess.id] || s.stored(ctx, st) {
			continue
		}
		sess := st.sess
		err := s.store(ctx, b, sess)
		if errors.Is(err, errFenced) {
			// Another instance owns the session now (the partition moved):
			// leave its inputs unacknowledged for the owner, which applies
			// them in order or skips them; what was published is what the
			// owner publishes, since decisions depend only on the inputs
			// (and a spill's failure only once the owner is checked, see
			// spill).
			fence(sess.id, err)
			continue
		}
		if err != nil {
			if err := park(sess.id, err); err != nil {
				return err
			}
		}
	}
	// A fenced session's inputs stay unfinished: no ack may cover them
	// (see ackWindow) until the owner has them.
	var wins []*ackWindow
	unstuck := p.health.stuck.Load() > 0
	for _, a := range acks {
		if fenced[a.session] {
			continue
		}
		if unstuck && a.session != "" && p.health.clear(stuckPrefix+a.session) {
			p.obs.Stuck(a.session, false)
			p.log.Info("session no longer stuck", "session", a.session, "stuck_sessions", p.health.stuck.Load())
		}
		if a.win == nil {
			p.sendAck(ackAction{msg: a.msg, term: a.term})
			continue
		}
		a.win.finish(a.seq, a.msg, a.term)
		if !slices.Contains(wins, a.win) {
			wins = append(wins, a.win)
		}
	}
	for _, w := range wins {
		for _, act := range w.release() {
			p.sendAck(act)
		}
	}
	return nil
}

// adopted handles a marker (see adopt): the session catches up from the
// stream past the inputs it holds, which are then finished along with the
// batch. A subject that names no valid session is left for its
// redelivery.
func (s *shard) adopted(ctx context.Context, b *budget, d delivery, acks *[]ack, pubs *[]published, touched *[]*session, fenced map[string]bool, fence func(string, error)) (string, error) {
	sid, err := s.p.subj.SessionOf(d.markSubject)
	if err != nil || fenced[sid] {
		return sid, nil
	}
	sess, err := s.load(ctx, b, sid, d.horizon, d.epoch)
	if err != nil {
		return sid, err
	}
	first, before := len(*pubs), sess.seq
	if err := s.catchUp(ctx, b, sess, d.mark[len(d.mark)-1], nil, pubs); errors.Is(err, errFenced) {
		fence(sid, err)
		return sid, nil
	} else if err != nil {
		return sid, err
	}
	for i := first; i < len(*pubs); i++ {
		(*pubs)[i].received = d.at
	}
	sess.fresh = false
	sess.caughtUp = max(sess.caughtUp, d.horizon)
	if sess.seq != before && !sess.dirty {
		sess.dirty = true
		*touched = append(*touched, sess)
	}
	for _, seq := range d.mark {
		*acks = append(*acks, ack{win: d.win, seq: seq, session: sid})
	}
	return sid, nil
}

// sendAck acknowledges or terminates inputs whose effects are durable.
func (p *Processor) sendAck(a ackAction) {
	if err := a.send(); err != nil {
		// The effects are durable; a lost ack means a redelivery that
		// the stored sequence skips.
		p.log.Warn("ack failed", "subject", a.msg.Subject(), "err", err)
	}
}

// catchUp applies, in stream order, the session's messages after its last
// applied sequence up to limit, reading them from the stream, and queues
// their outputs on pubs. Messages up to the horizon may be pending after a
// delivery that never arrived (to a process that died, over a lost
// connection): JetStream redelivers them only once their ack deadline
// passes, after later messages of the session, which the sequence check
// would then skip although they were never applied. Applied here, in order,
// their redeliveries are skipped and acknowledged (a rejected one is then
// acked rather than terminated). On an error the session leaves the cache,
// so that its stored state is read again.
func (s *shard) catchUp(ctx context.Context, b *budget, sess *session, limit uint64, m jetstream.Msg, pubs *[]published) error {
	p := s.p
	r := p.reader(p.subj.SessionFilters(sess.id)) // the subjects the stream holds its inputs under
	for sess.seq < limit {
		raw, err := r.next(ctx, b, sess.seq+1)
		if err != nil {
			s.drop(sess.id)
			return err
		}
		if raw == nil || raw.Sequence > limit {
			return nil
		}
		p.log.Info("applying a message delivered before but not applied", "session", sess.id, "seq", raw.Sequence)
		p.caughtUp.Add(1)
		outs, _, err := p.step(ctx, sess, raw.Subject, raw.Header, raw.Data, raw.Sequence, func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
			return s.spill(ctx, b, m, sess, req)
		})
		if err != nil {
			s.drop(sess.id)
			return err
		}
		for _, o := range outs {
			pub, err := p.publish(ctx, b, o)
			if err != nil {
				return err
			}
			*pubs = append(*pubs, pub)
		}
		sess.seq = raw.Sequence
	}
	return nil
}

// route is the subject that picks the shard of an input on subject: its
// session's stored events subject for a control subject, so that a
// session's inputs all meet in one shard, in stream order.
func (p *Processor) route(subject string) string {
	if tok, ok := p.subj.ControlToken(subject); ok && !strings.Contains(tok, ".") {
		return p.subj.Stored(tok)
	}
	return subject
}

// foreign reports whether subject is the control subject of a session of a
// partition other than part: every partition's consumer reads every control
// subject, and only the session's own partition decides it. (The
// consumer of part < 0 takes only control subjects of more than one token,
// which name no session.)
func (p *Processor) foreign(subject string, part int) bool {
	if part < 0 {
		return false
	}
	tok, ok := p.subj.ControlToken(subject)
	return ok && !strings.Contains(tok, ".") && p.subj.Partition(tok) != part
}

// streamReader reads the events stream's messages matching any of its
// filters in stream order, one direct lookup per filter and message: what
// a filter found beyond the sequence asked for is kept, and a filter that
// found nothing is not asked again (its readers look no further than what
// the stream held when they began).
type streamReader struct {
	p       *Processor
	filters []string
	ahead   []*jetstream.RawStreamMsg
	done    []bool
}

func (p *Processor) reader(filters []string) *streamReader {
	filters = slices.DeleteFunc(slices.Clone(filters), func(f string) bool { return f == "" })
	return &streamReader{p: p, filters: filters, ahead: make([]*jetstream.RawStreamMsg, len(filters)), done: make([]bool, len(filters))}
}

// next returns the first message at or after seq that matches a filter, or
// nil when there is none.
func (r *streamReader) next(ctx context.Context, b *budget, seq uint64) (*jetstream.RawStreamMsg, error) {
	best := -1
	for i, f := range r.filters {
		if r.done[i] {
			continue
		}
		if r.ahead[i] == nil || r.ahead[i].Sequence < seq {
			m, err := r.p.nextMsg(ctx, b, seq, f)
			if err != nil {
				return nil, err
			}
			if m == nil {
				r.done[i] = true
				continue
			}
			r.ahead[i] = m
		}
		if best < 0 || r.ahead[i].Sequence < r.ahead[best].Sequence {
			best = i
		}
	}
	if best < 0 {
		return nil, nil
	}
	return r.ahead[best], nil
}

// nextMsg reads the first message of the events stream at or after seq
// whose subject matches subject (a filter), retrying failures until ctx
// ends (then its error); nil when there is none.
func (p *Processor) nextMsg(ctx context.Context, b *budget, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	for attempt := 0; ; attempt++ {
		raw, err := p.res.Events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		switch {
		case err == nil:
			return raw, nil
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, nil
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return nil, fmt.Errorf("processor: reading %s at %d from the events stream: %w", subject, seq, rerr)
		}
		p.log.Warn("reading the events stream failed; retrying", "subject", subject, "seq", seq, "err", err)
	}
}

// spillFunc writes (or, in a rebuild, looks up) the spill a ledger asked
// for. An error means the input cannot be decided now and must be retried.
type spillFunc func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error)

// step decodes a message and runs it through the session's ledger (sess is
// nil when the subject names no valid session), including the spill the
// ledger may ask for. It returns the outputs to publish and, for a rejected input, the reason
// to terminate it with. The runtime and Rebuild share it, so both decide alike.
func (p *Processor) step(ctx context.Context, sess *session, subject string, hdr nats.Header, data []byte, seq uint64, spillFn spillFunc) ([]events.Output, string, error) {
	if _, ok := hdr[pinHeader]; ok {
		// The input as published, without the delivery's pin. The header
		// is this delivery's own (nats.go has read the pin from it before
		// handing it over), so the pin is dropped in place, not copied.
		delete(hdr, pinHeader)
	}
	// The header and data are this delivery's own, so the event may keep
	// them rather than copies.
	ev, derr := events.DecodeMsgOwned(subject, hdr, data, p.subj)
	if derr != nil {
		p.obs.Input("")
		var e *events.Error
		if !errors.As(derr, &e) {
			e = &events.Error{Code: events.CodeMalformed, Message: derr.Error()}
		}
		sid := ""
		if sess != nil {
			sid = sess.id
		}
		cause := events.Cause{Meta: events.Meta{Subject: subject, Seq: seq, Headers: headerMap(hdr)}, ReadID: events.ReadableID(hdr, data)}
		return []events.Output{ledger.Rejection(cause, sid, e)}, "seamguard: rejected: " + string(e.Code), nil
	}
	ev.Meta.Seq = seq
	p.obs.Input(ev.Type)
	cfg := p.lcfg
	l, err := sess.ledger()
	if err != nil {
		return nil, "", err
	}
	res, err := ledger.Step(l, ledger.Input{Event: ev}, cfg)
	if err != nil {
		// Only a broken protocol between runtime and core gets here.
		return nil, "", fmt.Errorf("processor: session %s seq %d: %w", sess.id, seq, err)
	}
	outs := res.Outputs
	term := ""
	if !res.Accepted && !res.Duplicate && len(outs) == 1 && outs[0].Type == events.TypeEventRejected {
		term = "seamguard: rejected: " + string(outs[0].Data.(*events.EventRejected).Code)
	}
	if res.Spill != nil {
		result, err := spillFn(ctx, *res.Spill)
		if err != nil {
			// Undo nothing by hand: the caller drops the session from its
			// cache, so the stored state is read again on redelivery.
			return nil, "", err
		}
		res2, err := ledger.Step(l, ledger.Input{Spill: &result}, cfg)
		if err != nil {
			return nil, "", fmt.Errorf("processor: session %s seq %d: %w", sess.id, seq, err)
		}
		outs = append(outs, res2.Outputs...)
	}
	return outs, term, nil
}

// spill writes the transcript the ledger asked for. Failures of the
// transcript or of the object store become the result that halts the
// session; a cancelled context or a lost NATS connection is not the
// session's fault and returns an error instead, so the input is
// redelivered and decided again.
//
// A spill's outcome is the one part of a decision that does not follow from
// the inputs, so two instances that both hold a session for a moment (an
// ownership move) could disagree on it, and what the loser publishes before
// its compare-and-swap fails would contradict the owner. So a failure is
// only accepted after more attempts (a write of the same name by the other
// instance makes a read-back fail once; rewriting is harmless, the content
// is the same), and only while the session's stored state is still the one
// this instance read: otherwise the error is errFenced and nothing of the
// failure is published.
func (s *shard) spill(ctx context.Context, b *budget, m jetstream.Msg, sess *session, req ledger.SpillRequest) (ledger.SpillResult, error) {
	p := s.p
	stop := keepAlive(ctx, m, p.cfg.AckWait/3)
	defer stop()
	start := time.Now()
	failures := 0
	for attempt := 0; ; attempt++ {
		h, err := p.store.Write(ctx, req)
		if err == nil {
			p.log.Info("spilled", "session", req.Session, "seq", req.Cause.Meta.Seq, "name", req.Name, "bytes", h.Size, "events", h.Events)
			p.obs.Spilled(h, time.Since(start))
			return ledger.SpillResult{Handle: h}, nil
		}
		if ctx.Err() != nil {
			return ledger.SpillResult{}, ctx.Err()
		}
		// Retrying cannot fix a full bucket or store, the session's quota,
		// or a refusal: the session halts at once (rule 5).
		permanent := permanentFailure(err)
		if !permanent && (errors.Is(err, spill.ErrUnavailable) || !errors.Is(err, spill.ErrIncomplete) && (p.status() != nats.CONNECTED || unreachable(err))) {
			if rerr := b.retry(ctx, attempt, err); rerr != nil {
				return ledger.SpillResult{}, fmt.Errorf("processor: spill %s: %w", req.Name, rerr)
			}
			p.log.Warn("spill interrupted: NATS or JetStream did not answer; retrying", "session", req.Session, "seq", req.Cause.Meta.Seq, "err", err)
			continue
		}
		if failures++; failures < spillFailures && !errors.Is(err, spill.ErrIncomplete) && !permanent {
			p.log.Warn("spill failed; trying again", "session", req.Session, "seq", req.Cause.Meta.Seq, "attempt", failures, "err", err)
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return ledger.SpillResult{}, err
			}
			continue
		}
		if ferr := s.owned(ctx, b, sess); ferr != nil {
			return ledger.SpillResult{}, ferr
		}
		p.log.Warn("spill failed; the session halts", "session", req.Session, "seq", req.Cause.Meta.Seq, "err", err)
		p.obs.SpillFailed()
		return ledger.SpillResult{Failure: err.Error()}, nil
	}
}

// spillFailures is how many times a spill may fail (beyond NATS not
// answering, which is retried without limit) before the session halts.
const spillFailures = 4

// owned checks that the session's stored state is still the one this
// instance read (or stored): errFenced if another instance stored since, an
// error if the bucket cannot tell now.
func (s *shard) owned(ctx context.Context, b *budget, sess *session) error {
	for attempt := 0; ; attempt++ {
		e, err := s.p.res.Sessions.Get(ctx, sess.id)
		switch {
		case err == nil && e.Revision() == sess.rev:
			return nil
		case errors.Is(err, jetstream.ErrKeyNotFound) && sess.rev == 0:
			return nil
		case err == nil || errors.Is(err, jetstream.ErrKeyNotFound):
			return fmt.Errorf("%w: %s (revision %d) before its spill failure", errFenced, sess.id, sess.rev)
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return fmt.Errorf("processor: reading the state of session %s: %w", sess.id, rerr)
		}
	}
}

// Unreachable reports whether err says that NATS or JetStream did not
// answer at all (a timeout, no responders, a connection being
// re-established, a server shutting down), as while a server restarts:
// trying again later may succeed. The object store did not fail then; it
// was not reached, and halting a session for it would turn a restart into
// an operator's chore.
func Unreachable(err error) bool { return unreachable(err) }

func unreachable(err error) bool {
	for _, target := range []error{
		context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders,
		nats.ErrConnectionClosed, nats.ErrConnectionReconnecting, nats.ErrDisconnected,
		jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled, jetstream.ErrServerShutdown,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// keepAlive tells the server every interval that m is still being worked on.
func keepAlive(ctx context.Context, m jetstream.Msg, every time.Duration) func() {
	if m == nil {
		return func() {} // catching up for a marker: nothing delivered here to keep
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// published is one output on its way to the verdict stream.
type published struct {
	msg      *nats.Msg
	id       string
	f        jetstream.PubAckFuture
	out      events.Output
	received time.Time // when the message whose handling decided it was received
}

func (p *Processor) publish(ctx context.Context, b *budget, o events.Output) (published, error) {
	o = p.subj.PublishedRejection(o)
	id, subject, body, err := p.enc.Encode(o)
	if err != nil {
		return published{}, fmt.Errorf("processor: encode %s: %w", o.Type, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	msg.Header.Set(jetstream.MsgIDHeader, id)
	pub := published{msg: msg, id: id, out: o}
	for attempt := 0; ; attempt++ {
		pub.f, err = p.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(p.cfg.Names().Verdicts))
		if err == nil {
			return pub, nil
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return pub, fmt.Errorf("processor: publishing %s on %s: %w", o.Type, subject, rerr)
		}
		p.log.Warn("publish failed; retrying", "subject", subject, "err", err)
	}
}

// confirm waits for a publish ack, republishing (same id, so at most once in
// the stream) until the server confirms or ctx ends.
func (p *Processor) confirm(ctx context.Context, b *budget, pub published) error {
	_, err := p.confirmAck(ctx, b, pub)
	return err
}

// pubAckWait bounds the wait for one publish ack.
const pubAckWait = 10 * time.Second

// confirmAck is confirm, returning the server's ack.
func (p *Processor) confirmAck(ctx context.Context, b *budget, pub published) (*jetstream.PubAck, error) {
	for attempt := 0; ; attempt++ {
		var err error
		// A publish ack lost with a connection or a server restart never
		// resolves the future: wait a bounded time, then publish again
		// (same id, so the stream keeps one).
		t := time.NewTimer(pubAckWait)
		select {
		case ack := <-pub.f.Ok():
			t.Stop()
			return ack, nil
		case err = <-pub.f.Err():
		case <-t.C:
			err = fmt.Errorf("no publish ack within %s", pubAckWait)
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return nil, fmt.Errorf("processor: verdict %s not confirmed: %w", pub.id, rerr)
		}
		if attempt >= 2 {
			// Not answered for a while: say where the stream stands, which
			// tells a lost leader from a lost connection.
			p.log.Warn("verdict not confirmed; publishing again", "id", pub.id, "err", err, "attempt", attempt+1, "verdict_stream", p.placement(ctx))
		} else {
			p.log.Warn("verdict not confirmed; publishing again", "id", pub.id, "err", err)
		}
		for again := attempt; ; again++ {
			pub.f, err = p.js.PublishMsgAsync(pub.msg, jetstream.WithMsgID(pub.id), jetstream.WithExpectStream(p.cfg.Names().Verdicts))
			if err == nil {
				break
			}
			if rerr := b.retry(ctx, again, err); rerr != nil {
				return nil, fmt.Errorf("processor: verdict %s not confirmed: %w", pub.id, rerr)
			}
		}
	}
}

// placement describes the verdict stream's leader and replicas as the
// server reports them now, for a log line.
func (p *Processor) placement(ctx context.Context) string {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := p.res.Verdicts.Info(ictx)
	switch {
	case err != nil:
		return "unknown: " + err.Error()
	case info.Cluster == nil:
		return fmt.Sprintf("last seq %d, single server", info.State.LastSeq)
	}
	out := fmt.Sprintf("last seq %d, leader %q", info.State.LastSeq, info.Cluster.Leader)
	for _, r := range info.Cluster.Replicas {
		out += fmt.Sprintf(", %s current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
	}
	return out
}

// load returns the cached session, reading its stored state on first use.
//
// A session cached since before horizon is read again: after a break in
// delivery another instance may have moved it on (its own writes are always
// stored before its inputs are acked, so the cache never knows more than
// the bucket). So is one cached under an earlier lease of its partition
// (epoch): the partition was held elsewhere in between, and its new holder
// may have decided and stored since, even with nothing left pending.
func (s *shard) load(ctx context.Context, b *budget, id string, horizon, epoch uint64) (*session, error) {
	if sess := s.sessions[id]; sess != nil {
		// A session changed in the batch at hand is newer than the bucket
		// until the batch is stored; if another instance moved it on, the
		// compare-and-swap at the end of the batch says so.
		if sess.dirty || sess.loaded >= horizon && sess.epoch == epoch {
			return sess, nil
		}
		s.drop(id)
		s.p.reloaded.Add(1)
	}
	sess, err := s.read(ctx, b, id)
	if err == nil {
		sess.loaded, sess.epoch = horizon, epoch
	}
	return sess, err
}

// current reports whether delivery d, of session id, may be decided: its
// partition's lease is still this instance's, the one it was fetched
// under, with time left. Otherwise another instance may hold the partition
// now, or soon, and decide from a state this one has not seen; the
// delivery is left, unacknowledged, to it.
func (s *shard) current(d delivery, id string) bool {
	if d.part < 0 || s.lease == nil || s.lease.current(d.part, d.epoch) {
		return true
	}
	s.p.expired.Add(1)
	s.p.log.Info("the partition's lease ended before this input was decided; leaving it to the partition's next holder",
		"session", id, "partition", d.part, "seq", d.seq())
	return false
}

// read reads a session's stored state into the cache.
func (s *shard) read(ctx context.Context, b *budget, id string) (*session, error) {
	kv := s.p.res.Sessions
	for attempt := 0; ; attempt++ {
		e, err := kv.Get(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			sess := &session{id: id, fresh: true}
			s.put(sess)
			s.woken++
			return sess, nil
		case err == nil:
			st, err := UnmarshalState(e.Value())
			if err != nil {
				// A corrupt state must not be silently replaced: stop and
				// let an operator rebuild it from the events stream.
				return nil, fmt.Errorf("processor: session %s: %w: %w; run seamguard serve --rebuild", id, errPermanent, err)
			}
			sess := &session{id: id, l: &st.Ledger, seq: st.Seq, rev: e.Revision(), fresh: true}
			s.put(sess)
			s.woken++
			return sess, nil
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return nil, fmt.Errorf("processor: reading the state of session %s: %w", id, rerr)
		}
		s.p.log.Warn("reading session state failed; retrying", "session", id, "err", err)
	}
}

// errFenced means another writer changed a session's stored state.
var errFenced = errors.New("processor: session state changed by another writer")

// sentStore is a session's state on its way to the bucket.
type sentStore struct {
	sess *session
	f    jetstream.PubAckFuture // nil when it could not be sent
	sent time.Time
}

// sendStores sends the state of every session in touched to the bucket at
// once, each a compare-and-swap on the session's revision (what kv.Update
// and kv.Create publish), so that a batch waits for one round trip rather
// than one per session. stored then takes each ack; whatever did not plainly
// succeed goes through store, which sorts out conflicts and lost replies.
// Sessions fenced during the batch are not sent.
func (s *shard) sendStores(touched []*session, fenced map[string]bool, park func(string, error) error) []sentStore {
	p := s.p
	out := make([]sentStore, 0, len(touched))
	for _, sess := range touched {
		if fenced[sess.id] {
			continue // another instance's now, or left: nothing of it is stored
		}
		val, err := sess.state()
		if err != nil {
			_ = park(sess.id, fmt.Errorf("processor: session %s: %w: %w", sess.id, errPermanent, err))
			continue
		}
		msg := nats.NewMsg("$KV." + p.cfg.Names().Sessions + "." + sess.id)
		msg.Data = val
		f, err := p.js.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(sess.rev))
		if err != nil {
			f = nil // store tries again
		}
		out = append(out, sentStore{sess: sess, f: f, sent: time.Now()})
	}
	return out
}

// stored waits for the ack of a state sendStores sent and reports whether
// it was stored; false means store must settle it.
func (s *shard) stored(ctx context.Context, st sentStore) bool {
	if st.f == nil {
		return false
	}
	t := time.NewTimer(pubAckWait)
	defer t.Stop()
	select {
	case ack := <-st.f.Ok():
		st.sess.rev, st.sess.dirty = ack.Sequence, false
		s.p.obs.Stored(time.Since(st.sent))
		if st.sess.closed() {
			s.drop(st.sess.id) // closed: nothing more to cache
		}
		return true
	case <-st.f.Err():
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// store writes a session's state with compare-and-swap on its revision.
func (s *shard) store(ctx context.Context, b *budget, sess *session) error {
	p := s.p
	val, err := sess.state()
	if err != nil {
		return fmt.Errorf("processor: session %s: %w", sess.id, err)
	}
	kv := p.res.Sessions
	start := time.Now()
	for attempt := 0; ; attempt++ {
		var rev uint64
		if sess.rev == 0 {
			rev, err = kv.Create(ctx, sess.id, val)
		} else {
			rev, err = kv.Update(ctx, sess.id, val, sess.rev)
		}
		if err == nil {
			sess.rev, sess.dirty = rev, false
			p.obs.Stored(time.Since(start))
			if sess.closed() {
				s.drop(sess.id) // closed: nothing more to cache
			}
			return nil
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			p.obs.CASConflict()
			// Our own earlier attempt may have landed with its reply lost.
			e, gerr := kv.Get(ctx, sess.id)
			switch {
			case gerr == nil && bytes.Equal(e.Value(), val):
				sess.rev, sess.dirty = e.Revision(), false
				p.obs.Stored(time.Since(start))
				return nil
			case gerr == nil || errors.Is(gerr, jetstream.ErrKeyNotFound):
				s.drop(sess.id)
				return fmt.Errorf("%w: %s (revision %d)", errFenced, sess.id, sess.rev)
			}
			err = gerr // cannot tell yet: try again
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return fmt.Errorf("processor: storing the state of session %s (%d bytes): %w", sess.id, len(val), rerr)
		}
		p.log.Warn("storing session state failed; retrying", "session", sess.id, "err", err)
	}
}

// pinHeader is the header the server adds to each delivery of a pinned
// consumer.
const pinHeader = "Nats-Pin-Id"

// headerMap copies the headers the input was published with, for a
// rejection to echo. Nats-Pin-Id is left out: the server adds it to each
// delivery of a pinned consumer, so it is no part of the input and differs
// from one delivery to the next.
func headerMap(h nats.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if k == pinHeader {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

// backoff is the delay before retry attempt n: 50ms doubling to 2s.
func backoff(n int) time.Duration {
	d := 50 * time.Millisecond << min(n, 6)
	return min(d, 2*time.Second)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
