package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/seamguard/seamguard/attest"
)

// Forwarder delivers verdicts from its durable consumer to one HTTP
// endpoint. Make one with New; Run it once. Stats may be called from any
// goroutine.
type Forwarder struct {
	cfg      Config
	js       jetstream.JetStream
	log      *slog.Logger
	client   *http.Client
	verifier *attest.Verifier
	reg      prometheus.Registerer
	met      *metrics
	now      func() time.Time

	cons    jetstream.Consumer
	ackWait time.Duration // the consumer's, which an existing one keeps
	kept    *Undeliverable

	delivered, keptN, attempts atomic.Uint64
}

// Option changes what tests and the command inject.
type Option func(*Forwarder)

// WithLogger logs through l (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(f *Forwarder) { f.log = l } }

// WithHTTPClient sends with c (default: a client with Config.Timeout that
// follows no redirect).
func WithHTTPClient(c *http.Client) Option { return func(f *Forwarder) { f.client = c } }

// WithVerifier verifies verdicts with v (default: a verifier that trusts
// no key in particular, for the deployment's prefix).
func WithVerifier(v *attest.Verifier) Option { return func(f *Forwarder) { f.verifier = v } }

// WithRegisterer registers the forwarder's metrics with r.
func WithRegisterer(r prometheus.Registerer) Option { return func(f *Forwarder) { f.reg = r } }

// Stats counts what a forwarder did since it started.
type Stats struct {
	Delivered uint64 // acknowledged after a 2xx
	Kept      uint64 // kept as undeliverable
	Attempts  uint64 // HTTP requests made
}

// New checks cfg, makes the undeliverable stream if it is missing, and
// creates the durable consumer, or opens it if it exists (then it resumes
// where it stands, whatever cfg.From says).
func New(ctx context.Context, js jetstream.JetStream, cfg Config, opts ...Option) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Forwarder{cfg: cfg, js: js, log: slog.Default(), now: time.Now}
	for _, o := range opts {
		o(f)
	}
	if f.client == nil {
		f.client = &http.Client{Timeout: cfg.timeout(), CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if f.verifier == nil {
		f.verifier = &attest.Verifier{Subjects: cfg.subjects()}
	}
	f.met = newMetrics(f.reg)
	var err error
	if f.kept, err = OpenUndeliverable(ctx, js, cfg.Prefix, true, cfg.Replicas); err != nil {
		return nil, err
	}
	if f.cons, err = f.consumer(ctx); err != nil {
		return nil, err
	}
	f.ackWait = f.cons.CachedInfo().Config.AckWait
	if f.ackWait <= 0 {
		f.ackWait = cfg.ackWait()
	}
	if cfg.timeout() > f.ackWait/2 {
		f.log.Warn("the consumer's ack wait is short for this --timeout: a slow request may be delivered again by another forwarder meanwhile", "consumer", cfg.name(), "ack_wait", f.ackWait, "timeout", cfg.timeout())
	}
	return f, nil
}

// Name is the durable consumer's name.
func (f *Forwarder) Name() string { return f.cfg.name() }

// Stats returns the counts so far.
func (f *Forwarder) Stats() Stats {
	return Stats{Delivered: f.delivered.Load(), Kept: f.keptN.Load(), Attempts: f.attempts.Load()}
}

// consumer creates or opens the durable consumer.
func (f *Forwarder) consumer(ctx context.Context) (jetstream.Consumer, error) {
	stream, name, filters := VerdictStream(f.cfg.Prefix), f.cfg.name(), f.cfg.Filters()
	open := func() (jetstream.Consumer, error) {
		c, err := f.js.Consumer(ctx, stream, name)
		if err != nil {
			return nil, err
		}
		cc := c.CachedInfo().Config
		have := cc.FilterSubjects
		if cc.FilterSubject != "" {
			have = append(have, cc.FilterSubject)
		}
		slices.Sort(have)
		if !slices.Equal(have, filters) || cc.DeliverSubject != "" {
			return nil, fmt.Errorf("%w: consumer %s on %s filters %v, this forwarder %v; give another name, or the same --kinds and --session", ErrConsumerMismatch, name, stream, have, filters)
		}
		return c, nil
	}
	c, err := open()
	if err == nil {
		f.log.Info("forwarder resumes its consumer where it stands", "consumer", name, "stream", stream, "pending", c.CachedInfo().NumPending, "from_ignored", f.cfg.From)
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("forward: verdict stream %s: %w; is seamguard serving with this prefix?", stream, err)
		}
		return nil, fmt.Errorf("forward: consumer %s on %s: %w", name, stream, err)
	}
	cc, _ := f.cfg.deliverPolicy()
	cc.Durable = name
	cc.Description = "seamguard forward to " + redact(f.cfg.To)
	cc.FilterSubjects = filters
	cc.AckPolicy = jetstream.AckExplicitPolicy
	cc.AckWait = f.cfg.ackWait()
	cc.MaxDeliver = -1
	cc.MaxAckPending = 1000
	c, err = f.js.CreateConsumer(ctx, stream, cc)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return open() // another forwarder made it first
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("forward: verdict stream %s: %w; is seamguard serving with this prefix?", stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("forward: creating consumer %s on %s: %w", name, stream, err)
	}
	f.log.Info("forwarder created its consumer", "consumer", name, "stream", stream, "filters", filters, "deliver", cc.DeliverPolicy.String())
	return c, nil
}

// Run delivers verdicts until ctx ends, with Config.Concurrency workers,
// each pulling one verdict at a time. When ctx ends, a request under way
// finishes (within Config.Timeout) and its verdict is acknowledged or
// released; a verdict waiting for its next attempt is released at once
// (Nak), for this or another forwarder to deliver. Run returns nil then,
// or the error that stopped it (its consumer deleted).
func (f *Forwarder) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errc := make(chan error, f.cfg.concurrency())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range f.cfg.concurrency() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.work(ctx); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// work is one worker's loop.
func (f *Forwarder) work(ctx context.Context) error {
	failures := 0
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		msg, err := f.cons.Next(jetstream.FetchContext(fctx))
		cancel()
		switch {
		case err == nil:
			failures = 0
			f.handle(ctx, msg)
			continue
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrNoMessages), errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, jetstream.ErrNoHeartbeat):
			// nothing to forward within the fetch's wait
			continue
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("forward: consumer %s: %w; start the forwarder again to make it anew (with --from: it starts from there)", f.cfg.name(), err)
		}
		failures++
		f.log.Warn("forwarder cannot pull verdicts; trying again", "consumer", f.cfg.name(), "err", err)
		if !sleepCtx(ctx, f.backoff(failures)) {
			return nil
		}
	}
	return nil
}

// handle delivers one verdict, or keeps it as undeliverable, and then
// acknowledges it (Ack after a 2xx, Term once kept), or releases it (Nak)
// when the forwarder stops first.
func (f *Forwarder) handle(ctx context.Context, msg jetstream.Msg) {
	f.met.inFlight.Inc()
	defer f.met.inFlight.Dec()
	vm := verdictMsg{subject: msg.Subject(), header: msg.Headers(), body: msg.Data()}
	if md, err := msg.Metadata(); err == nil {
		vm.seq = md.Sequence.Stream
	}
	log := f.log.With("consumer", f.cfg.name(), "verdict_seq", vm.seq, "subject", vm.subject)
	if _, err := f.verifier.Verify(vm.subject, vm.header, vm.body); err != nil {
		f.giveUp(ctx, log, msg, vm, ReasonUnverifiable, 0, 0, err)
		return
	}
	for attempt := 1; ; attempt++ {
		status, retryAfter, err := f.send(ctx, vm)
		if errors.Is(err, ErrMalformed) {
			f.giveUp(ctx, log, msg, vm, ReasonMalformed, 0, attempt-1, err)
			return
		}
		class, retry := classify(status, err)
		if class == "" {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := msg.DoubleAck(actx); err != nil {
				log.Warn("delivered, but the acknowledgement was not confirmed: the verdict may be delivered again", "err", err)
			}
			cancel()
			f.delivered.Add(1)
			f.met.delivered.Inc()
			return
		}
		f.met.failures.WithLabelValues(class).Inc()
		if err == nil {
			err = fmt.Errorf("the receiver answered %d", status)
		}
		if !retry {
			f.giveUp(ctx, log, msg, vm, ReasonRejected, status, attempt, err)
			return
		}
		if attempt >= f.cfg.maxAttempts() {
			f.giveUp(ctx, log, msg, vm, ReasonExhausted, status, attempt, err)
			return
		}
		wait := f.backoff(attempt)
		if retryAfter > wait {
			wait = min(retryAfter, f.cfg.maxRetryAfter())
		}
		log.Warn("delivery failed; retrying", "attempt", attempt, "of", f.cfg.maxAttempts(), "status", status, "err", err, "wait", wait)
		if !f.hold(ctx, msg, wait) {
			_ = msg.Nak()
			log.Info("forwarder stopping: verdict released for redelivery", "attempts", attempt)
			return
		}
	}
}

// send makes one attempt. The request is not cut short when ctx ends: it
// finishes within Config.Timeout.
func (f *Forwarder) send(ctx context.Context, vm verdictMsg) (status int, retryAfter time.Duration, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.timeout())
	defer cancel()
	req, err := newRequest(rctx, f.cfg.To, f.cfg.Header, vm)
	if err != nil {
		return 0, 0, err
	}
	f.attempts.Add(1)
	start := time.Now()
	resp, err := f.client.Do(req)
	f.met.seconds.Observe(time.Since(start).Seconds())
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 && len(snippet) > 0 {
		err = fmt.Errorf("the receiver answered %d: %s", resp.StatusCode, snippet)
	}
	return resp.StatusCode, parseRetryAfter(resp.Header.Get("Retry-After"), f.now()), err
}

// classify says what an attempt's outcome was: class "" for a 2xx,
// otherwise the failure's class and whether another attempt may succeed
// (5xx, 408, 429, a timeout, a connection failure) or not (any other 4xx,
// a status out of 2xx to 5xx, such as an unfollowed redirect).
func classify(status int, err error) (class string, retry bool) {
	switch {
	case status == 0 && err != nil:
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			return "timeout", true
		}
		return "connection", true
	case status/100 == 2:
		return "", false
	case status == http.StatusRequestTimeout:
		return "status_408", true
	case status == http.StatusTooManyRequests:
		return "status_429", true
	case status/100 == 5:
		return "status_5xx", true
	case status/100 == 4:
		return "status_4xx", false
	}
	return "status_other", false
}

// parseRetryAfter reads a Retry-After value: seconds, or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// backoff is the wait before attempt+1: MinBackoff doubled per attempt, at
// most MaxBackoff, with jitter (between half and all of it).
func (f *Forwarder) backoff(attempt int) time.Duration {
	d := f.cfg.minBackoff()
	for i := 1; i < attempt && d < f.cfg.maxBackoff(); i++ {
		d *= 2
	}
	d = min(d, f.cfg.maxBackoff())
	return d/2 + rand.N(d/2+1)
}

// hold waits d, telling the server every third of AckWait that msg is
// still being worked on, so that it is not redelivered to another
// forwarder meanwhile. It reports false if ctx ended first.
func (f *Forwarder) hold(ctx context.Context, msg jetstream.Msg, d time.Duration) bool {
	tick := f.ackWait / 3
	deadline := time.Now().Add(d)
	for {
		_ = msg.InProgress()
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		if !sleepCtx(ctx, min(left, tick)) {
			return false
		}
	}
}

// giveUp keeps msg in the undeliverable stream and then terminates it. If
// it cannot be kept, msg is released (Nak with a delay), never terminated.
func (f *Forwarder) giveUp(ctx context.Context, log *slog.Logger, msg jetstream.Msg, vm verdictMsg, reason string, status, attempts int, cause error) {
	rec := Record{Name: f.cfg.name(), To: redact(f.cfg.To), Reason: reason, Status: status, Attempts: attempts,
		Error: cause.Error(), FailedAt: f.now(), msg: vm}
	var seq uint64
	for try := 1; ; try++ {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		var err error
		seq, err = f.kept.keep(kctx, rec)
		cancel()
		if err == nil {
			break
		}
		log.Error("cannot keep an undeliverable verdict; it stays in the verdict stream", "err", err)
		if try >= 5 || !f.hold(ctx, msg, f.backoff(try)) {
			_ = msg.NakWithDelay(f.cfg.maxBackoff())
			return
		}
	}
	if err := msg.TermWithReason("seamguard forward: " + reason); err != nil {
		log.Warn("kept, but the verdict could not be terminated: it may be kept again (once)", "err", err)
	}
	f.keptN.Add(1)
	f.met.undeliverable.WithLabelValues(reason).Inc()
	log.Error("verdict not delivered: kept as undeliverable (seamguard forward failed lists it, forward retry delivers it again)",
		"reason", reason, "status", status, "attempts", attempts, "err", cause, "stream", UndeliverableStream(f.cfg.Prefix), "kept_seq", seq)
}

// redact hides the password of a URL's user information.
func redact(to string) string {
	u, err := url.Parse(to)
	if err != nil {
		return to
	}
	return u.Redacted()
}

// sleepCtx waits d, and reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
