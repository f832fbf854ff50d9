package processor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds fetching and leases: one goroutine per partition takes
// the partition's lease, fetches a batch from its durable consumer, keeps the
// ack window of what it delivered, notices a break in delivery (a lost
// message, a partition that changed hands) and sends every input to the
// shard that owns its session.

// fetch pulls one consumer's messages and hands them to their shards until
// ctx (drain) or hard (abort) ends, while this instance holds the lease of
// its partition, part (-1 for the consumer of subjects that name no
// session, which every instance reads). It returns an error only when the
// consumer is gone.
func (p *Processor) fetch(ctx, hard context.Context, cons jetstream.Consumer, part int, lease *leases, shards []*shard) error {
	f := &fetcher{p: p, ctx: ctx, hard: hard, cons: cons, name: cons.CachedInfo().Name, part: part, lease: lease, shards: shards,
		win: &ackWindow{explicit: cons.CachedInfo().Config.AckPolicy != jetstream.AckAllPolicy, finished: p.floors.finishedOf(part)}, lastPrune: time.Now()}
	p.windows.Store(f.name, f.win)
	defer p.windows.CompareAndDelete(f.name, f.win)
	return f.run()
}

// fetcher is one consumer's fetch loop and what it keeps between fetches.
//
// A message delivered before but not acknowledged (to a process that died,
// to an instance that lost the partition, or lost on the way with a
// connection or a restarted server) is redelivered only when its ack
// deadline passes, interleaved with new messages: later messages of its
// session may arrive first. horizon is the highest stream sequence such a
// message may have; every session catches up to it from the stream before
// it goes on (see catchUp), after reading its stored state again (another
// instance may have moved it on). horizon is raised to what the consumer
// has delivered whenever this instance's delivery sequence breaks, which
// is how a lost delivery or a partition that changed hands shows.
//
// Before the first fetch after taking the partition's lease, the
// consumer's state says what was delivered before: if some of it is
// unacknowledged, horizon rises to the highest stream sequence delivered;
// if none is, nothing can be pending elsewhere. Either way the next
// delivery must follow on from that state, or the sequence has broken.
type fetcher struct {
	p         *Processor
	ctx, hard context.Context // drain, abort
	cons      jetstream.Consumer
	name      string
	part      int
	lease     *leases
	shards    []*shard
	win       *ackWindow // what this consumer delivered and has not acknowledged

	horizon uint64 // see above
	// base is the highest stream sequence the consumer had delivered when
	// this instance's unbroken delivery began (at the lease, after a
	// break): every message of the partition past it is delivered here,
	// in order (floor.go).
	base         uint64
	lastDelivery uint64 // consumer sequence of the last delivery
	epoch        uint64 // of the partition's lease, at the last fetch
	owned        bool   // the lease was held at the last look
	lastPrune    time.Time
}

// run fetches until the fetcher is stopped or the consumer is gone.
//
// It fetches in batches rather than keep a pull request open: a fetch ends
// with the server's own answer (batch full, or its expiry), which comes
// after its last message. So a drain finishes the fetch in flight and
// stops with no delivery on the way: nothing it was sent stays
// unacknowledged until the ack deadline (a continuous pull, unsubscribed,
// can lose a message the server was sending at that moment).
func (f *fetcher) run() error {
	if f.part < 0 {
		if err := f.takeOver(); err != nil {
			if err == errStopped {
				return nil // stopped before it began
			}
			return err
		}
	}
	for attempt := 0; f.ctx.Err() == nil && f.hard.Err() == nil; {
		f.unblock()
		wait, ok, err := f.hold()
		switch {
		case err == errStopped:
			return nil
		case err != nil:
			return err
		case !ok:
			continue
		}
		err = f.fetchOnce(wait)
		if f.part >= 0 {
			f.lease.end(f.part)
		}
		// A fetch that filled its count with bytes to spare, or its bytes,
		// may end with the server saying so: that is no failure.
		if err == nil || f.hard.Err() != nil || errors.Is(err, jetstream.ErrBatchCompleted) || errors.Is(err, jetstream.ErrMaxBytesExceeded) {
			f.p.health.clear("consumer " + f.name)
			attempt = 0
			continue
		}
		if err := f.failed(err, attempt); err != nil {
			return err
		}
		if sleep(f.hard, backoff(attempt)) != nil {
			return nil
		}
		attempt++
	}
	return nil
}

// hold takes the partition's lease for one fetch and returns how long the
// fetch may wait; not ok when the lease is not this instance's (after
// waiting a while for it to change). On taking the partition anew it takes
// the consumer over first. The consumer of subjects that name no session
// needs no lease.
func (f *fetcher) hold() (wait time.Duration, ok bool, err error) {
	if f.part < 0 {
		return fetchWait, true, nil
	}
	changed := f.lease.changed() // before begin: no change is missed
	w, ep, ok := f.lease.begin(f.part, fetchWait)
	if !ok {
		f.owned = false
		t := time.NewTimer(leaseIdle)
		select {
		case <-changed:
		case <-t.C:
		case <-f.ctx.Done():
		case <-f.hard.Done():
		}
		t.Stop()
		return 0, false, nil
	}
	if ep != f.epoch {
		f.owned = false // taken again since the last fetch
		f.epoch = ep
	}
	if !f.owned {
		if err := f.takeOver(); err != nil {
			f.lease.end(f.part)
			return 0, false, err
		}
		f.owned = true
	}
	return w, true, nil
}

// fetchOnce fetches one batch and dispatches its messages.
func (f *fetcher) fetchOnce(wait time.Duration) error {
	p := f.p
	batch, err := f.cons.Fetch(p.cfg.MaxBatch*2, jetstream.FetchMaxWait(wait), jetstream.FetchMaxBytes(p.fetchBytes()))
	if err != nil {
		return err
	}
	msgs := batch.Messages()
	for {
		select {
		case msg, ok := <-msgs:
			if !ok {
				return batch.Error()
			}
			f.dispatch(msg)
		case <-f.hard.Done():
			return batch.Error()
		}
	}
}

// failed reports a fetch that failed, and returns an error when the
// consumer is gone.
func (f *fetcher) failed(err error, attempt int) error {
	p := f.p
	if _, ierr := f.cons.Info(f.hard); errors.Is(ierr, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConnectionClosed) {
		err := fmt.Errorf("processor: consumer %s on %s stopped: %w", f.name, p.cfg.Names().Events, errors.Join(err, ierr))
		p.log.Error("consumer stopped", "err", err)
		return err
	}
	p.noticeFailure(err)
	p.log.Warn("fetching failed; retrying", "consumer", f.name, "err", err)
	if attempt >= 2 {
		p.health.set("consumer "+f.name, fmt.Errorf("fetching fails: %w", err))
	}
	return nil
}

// send hands d to the shard of subject.
func (f *fetcher) send(subject string, d delivery) {
	s := f.shards[shardOf(subject, len(f.shards))]
	select {
	case s.q <- d:
	case <-f.hard.Done():
	}
}

// sendMarks sends markers (see adopt) under the fetcher's partition and
// lease.
func (f *fetcher) sendMarks(marks []delivery) {
	for _, m := range marks {
		m.part, m.epoch = f.part, f.epoch
		f.send(f.p.route(m.markSubject), m)
	}
}

// takeOver reads the consumer's state when this instance begins to consume
// it (at the start, or on taking the partition's lease): what was delivered
// before and is still pending must be in the window before anything
// delivered here is acknowledged.
func (f *fetcher) takeOver() error {
	p := f.p
	either, stop := context.WithCancel(f.hard)
	defer context.AfterFunc(f.ctx, stop)()
	h, last, floor, delivered, err := p.startState(either, f.cons)
	stopped := either.Err() != nil
	stop()
	switch {
	case err != nil && stopped:
		return errStopped
	case err != nil:
		err := fmt.Errorf("processor: consumer %s on %s stopped: %w", f.name, p.cfg.Names().Events, err)
		p.log.Error("consumer stopped", "err", err)
		return err
	}
	f.lastDelivery = last
	f.base = max(f.base, delivered)
	lctx, cancel := context.WithTimeout(f.hard, pubAckWait)
	p.lowAt(lctx, f.part, f.base)
	cancel()
	if h > 0 {
		f.horizon = max(f.horizon, h)
		f.sendMarks(p.adopt(f.hard, f.cons, f.part, f.win, floor, h))
	}
	return nil
}

// dispatch sends one delivered message to its shard, after noticing a
// break in the delivery sequence (then the markers of what is pending
// follow it).
func (f *fetcher) dispatch(msg jetstream.Msg) {
	p := f.p
	meta, merr := msg.Metadata()
	var marks []delivery
	if merr == nil {
		if meta.Sequence.Consumer != f.lastDelivery+1 {
			delivered, floor := p.delivered(f.hard, f.cons)
			h := max(delivered, meta.Sequence.Stream)
			if f.lastDelivery != 0 {
				p.log.Info("a delivery was lost or the partition changed hands; sessions catch up from the stream",
					"consumer", f.name, "after", f.lastDelivery, "got", meta.Sequence.Consumer, "horizon", h)
			}
			f.horizon = max(f.horizon, h)
			f.base = max(f.base, h)
			p.lowRaise(f.part, f.base)
			marks = p.adopt(f.hard, f.cons, f.part, f.win, floor, h)
		}
		f.lastDelivery = meta.Sequence.Consumer
	}
	d := delivery{msg: msg, meta: meta, metaErr: merr, sid: p.sessionOf(msg.Subject()), horizon: f.horizon, base: f.base, at: time.Now(), part: f.part, epoch: f.epoch}
	switch {
	case merr == nil && p.foreign(msg.Subject(), f.part):
		// Another partition's session's resume: its own consumer decides
		// it; here it is only finished, in its place.
		f.win.add(meta.Sequence.Stream, msg)
		f.win.finish(meta.Sequence.Stream, msg, "")
		for _, a := range f.win.release() {
			p.sendAck(a)
		}
	case merr == nil:
		d.win = f.win
		f.win.add(meta.Sequence.Stream, msg)
		f.send(p.route(msg.Subject()), d)
	default:
		f.send(p.route(msg.Subject()), d)
	}
	// The markers follow the message that showed the break, so that it is
	// decided on its own delivery, not caught up ahead of it.
	f.sendMarks(marks)
}

// unblock: an input held in the window that another instance has since
// acknowledged (its session was fenced here, or it was held from a
// listing) is never delivered here again. While the window is blocked, the
// consumer's ack floor is read now and then, and what is at or below it is
// dropped from the window.
func (f *fetcher) unblock() {
	p := f.p
	if f.win.explicit || time.Since(f.lastPrune) < pruneEvery || !f.win.blocked() {
		return
	}
	f.lastPrune = time.Now()
	_, floor := p.delivered(f.hard, f.cons)
	f.win.prune(floor)
	for _, a := range f.win.release() {
		p.sendAck(a)
	}
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

// startState returns the horizon a consumer starts with, the consumer
// sequence of its last delivery, its ack floor and the highest stream
// sequence it delivered, asking the server until it answers, ctx ends or
// the consumer is gone (then an error).
func (p *Processor) startState(ctx context.Context, cons jetstream.Consumer) (horizon, last, floor, delivered uint64, err error) {
	for attempt := 0; ; attempt++ {
		info, err := cons.Info(ctx)
		if err == nil {
			if info.NumAckPending > 0 {
				horizon = info.Delivered.Stream
			}
			return horizon, info.Delivered.Consumer, info.AckFloor.Stream, info.Delivered.Stream, nil
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, nats.ErrConnectionClosed) {
			return 0, 0, 0, 0, err
		}
		p.log.Warn("reading the consumer's state failed; retrying", "err", err)
		p.consumerTrouble(cons, attempt, err)
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return 0, 0, 0, 0, err
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
		marks = append(marks, delivery{win: win, mark: bySubject[subj], markSubject: subj, sid: p.sessionOf(subj), horizon: upto, at: now})
	}
	return marks
}

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
	// sid is the session the input's (or the marker's) subject names, ""
	// when it names none: read once, on receipt (see sessionOf).
	sid     string
	metaErr error
	horizon uint64
	// base is the fetcher's base when it was delivered (see fetcher): 0
	// for a marker.
	base uint64
	at   time.Time // when it was received, for the decision latency
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

// sessionOf returns the session an input's subject names, "" when it
// names none.
func (p *Processor) sessionOf(subject string) string {
	sid, err := p.subj.SessionOf(subject)
	if err != nil {
		return ""
	}
	return sid
}

// route is the subject that picks the shard of an input on subject: its
// session's stored events subject for a control input too, so that a
// session's inputs all meet in one shard, in stream order.
func (p *Processor) route(subject string) string {
	return p.subj.Route(subject)
}

// foreign reports whether subject is the control subject of a session of a
// partition other than part: with control subjects stored apart
// (events.Subjects.ControlApart) every partition's consumer reads every
// control subject, and only the session's own partition decides it. (The
// consumer of part < 0 takes only control subjects of more than one token,
// which name no session.)
func (p *Processor) foreign(subject string, part int) bool {
	if part < 0 {
		return false
	}
	tok, ok := p.subj.ControlToken(subject)
	return ok && !strings.Contains(tok, ".") && p.subj.Partition(tok) != part
}
