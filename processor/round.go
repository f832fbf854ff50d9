package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/processor/ledger"
)

// This file holds a shard's round: one batch of deliveries decided in
// order, its verdicts published, its touched sessions stored once (a group
// commit), and only then its inputs finished in their ack windows.
//
// A round's states are sent to the bucket through the processor's writer
// (startStores) and then settled (settle): waited for, those not plainly
// stored stored on their own, and the round's inputs finished. While they
// are stored the shard decides its next batch and publishes its verdicts
// (overlapRounds); the pending round is settled before the next round's
// states are sent, so a session's states are stored in order, and each
// input is acknowledged only once its own round's state is stored. What
// the next round decides from memory is the pending round's state, which
// is what the bucket will hold unless another writer moved the session on:
// then the settle leaves the session, and the next round leaves it too
// (its verdicts stand, as a fenced round's do; its inputs wait for the
// session's owner). Whatever may have let another writer in (a new lease
// of the partition, a break in delivery) settles the pending round before
// the session is used (load), and so does whatever reads or judges the
// stored state itself (a spill's ownership check, a park record).

// ack is what to do with one input once its effects are durable.
type ack struct {
	msg     jetstream.Msg
	win     *ackWindow // nil: send at once (no metadata: not in any window)
	seq     uint64
	session string // the session it changed, if any
	term    string // non-empty: terminate with this reason instead of acking
}

// round is the state of one batch on its shard's goroutine.
//
// A session whose effects cannot be made durable now (a failure retrying
// cannot fix, or one that outlasted the batch's retry budget) is left like
// one another instance took over: its inputs stay unacknowledged and are
// redelivered after the ack deadline, when it is tried again from its
// stored state. Until one of its inputs is finished it is stuck, and the
// processor reports itself unready. Every other session of the batch goes
// on. Only the end of Run (ctx) stops the batch.
type round struct {
	s   *shard
	p   *Processor
	ctx context.Context
	b   *budget // the batch's retry budget, shared by all its loops

	acks    []ack       // inputs to finish once the batch is durable
	pubs    []published // outputs, in order
	touched []*session  // sessions to store
	// fenced holds the sessions the batch left (another instance took
	// them over, or they are stuck or parked): none of their inputs is
	// acknowledged, nothing more of them is published, and their state
	// is not stored.
	fenced map[string]bool
	// parked holds the sessions of fenced parked during the batch: their
	// inputs are acknowledged after all, into the park record.
	parked map[string]bool

	// spilled holds, for each session whose spill outcome the round
	// decided, the delivery under whose lease it was decided (see
	// publish).
	spilled map[string]delivery

	n     uint64     // the round's number on its shard, from 1
	batch []delivery // the round's deliveries
	// lastOf is the highest stream sequence of each session in batch,
	// made when the round first leaves a session (see leave).
	lastOf map[string]uint64
	stores *storeBatch
	// settling is set while the round's stores are settled, when the
	// next round may be deciding: a session left then (settleLeft) is
	// left by that round too.
	settling   bool
	settleLeft []string
}

// handle runs a batch: steps every message, publishes the outputs and
// waits for every publish ack, then settles the shard's pending round and
// sends this round's states (a group commit), leaving it pending: its
// inputs are acknowledged once they are stored (settle).
func (s *shard) handle(ctx context.Context, batch []delivery) error {
	s.rounds++
	r := &round{s: s, p: s.p, ctx: ctx, b: &budget{limit: s.p.cfg.RetryFor, notice: s.p.noticeFailure}, n: s.rounds, batch: batch}
	r.acks = make([]ack, 0, len(batch))
	s.cur = r
	defer func() { s.cur = nil }()
	s.fill(ctx, batch)
	defer s.pre.clear()
	for _, d := range batch {
		var err error
		if d.mark != nil {
			err = r.marker(d)
		} else {
			err = r.input(d)
		}
		if err != nil {
			return err
		}
	}
	if err := r.publish(); err != nil {
		return err
	}
	if err := s.settle(); err != nil {
		return err
	}
	r.stores = s.startStores(ctx, r.touched, r.fenced, r.park, r.n)
	s.pending = r
	if !overlapRounds {
		return s.settle()
	}
	return nil
}

// overlapRounds lets a round's states be stored while the shard decides
// and publishes its next batch (see above). Off, a round is settled before
// the shard takes its next batch.
var overlapRounds = true

// settle waits for the pending round's states, stores those not plainly
// stored, and finishes its inputs; a session it leaves, the round being
// decided leaves too. It returns an error only when Run ends.
func (s *shard) settle() error {
	r := s.pending
	if r == nil {
		return nil
	}
	s.pending = nil
	r.settling = true
	r.stores.wait(r.ctx, s)
	if err := r.store(); err != nil {
		return err
	}
	r.finish()
	// Its deliveries and states are done with: what the shard keeps of
	// the round must not keep them from the garbage collector.
	clear(r.batch)
	r.stores = nil
	if cur := s.cur; cur != nil {
		for _, id := range r.settleLeft {
			cur.leave(id)
			if r.parked[id] {
				if cur.parked == nil {
					cur.parked = map[string]bool{}
				}
				cur.parked[id] = true
			}
		}
	}
	return nil
}

// settleFor settles the pending round before session id is used; the
// error is errFenced when the settle left the session (the round at hand
// leaves it too).
func (s *shard) settleFor(id string) error {
	if err := s.settle(); err != nil {
		return err
	}
	if s.cur != nil && s.cur.fenced[id] {
		return fmt.Errorf("%w: %s (left when the round before was stored)", errFenced, id)
	}
	return nil
}

// leave drops session id from the batch and the shard's memory, and
// records at once that the batch's inputs of it are left undecided: the
// shard's next round may run before this one is settled, and a session it
// reads again must catch up past them before it decides anything later
// (shard.horizon), or it would skip them.
func (r *round) leave(id string) {
	if r.fenced == nil {
		r.fenced = map[string]bool{}
	}
	r.fenced[id] = true
	r.s.drop(id)
	if r.lastOf == nil {
		r.lastOf = r.s.lastSeqs(r.batch)
	}
	if seq, ok := r.lastOf[id]; ok {
		r.s.noteLeftAt(id, seq)
	}
	if r.settling {
		r.settleLeft = append(r.settleLeft, id)
	}
}

// fence leaves a session another instance moved on.
func (r *round) fence(id string, err error) {
	if r.fenced[id] {
		return
	}
	r.p.log.Warn("session moved on under another instance; leaving it", "session", id, "err", err)
	r.p.count.fenced.Add(1)
	r.leave(id)
}

// fail handles err from an effect of session id: errFenced fences it,
// anything else leaves it stuck (or parks it, see park). It returns an
// error only when Run ends.
func (r *round) fail(id string, err error) error {
	if errors.Is(err, errFenced) {
		r.fence(id, err)
		return nil
	}
	return r.park(id, err)
}

// park leaves session id stuck on err, or parks it when it has been stuck
// for good (park.go): its inputs are then acknowledged into the park
// record once it is stored.
func (r *round) park(id string, err error) error {
	p := r.p
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	if r.fenced[id] {
		return nil
	}
	p.noticeFailure(err)
	if p.health.set(stuckPrefix+id, err) {
		p.obs.Stuck(id, true)
	}
	if p.parkable(id, err) {
		// The record says what the bucket holds: the pending round's
		// states first.
		if err := r.s.settle(); err != nil {
			return err
		}
		if r.fenced[id] {
			return nil
		}
		perr := p.park(r.ctx, id, err)
		if perr == nil {
			if r.parked == nil {
				r.parked = map[string]bool{}
			}
			r.parked[id] = true
			r.leave(id)
			return nil
		}
		p.log.Error("cannot park the session; it stays stuck", "session", id, "err", perr)
	}
	p.log.Error("session stuck: its inputs wait for redelivery", "session", id, "err", err, "stuck_sessions", p.health.stuck.Load())
	r.leave(id)
	return nil
}

// touch marks sess to be stored at the end of the batch.
func (r *round) touch(sess *session) {
	if sess.dirty != r.n {
		sess.dirty = r.n
		r.touched = append(r.touched, sess)
	}
}

// marker handles a marker (see adopt): the session catches up from the
// stream past the inputs it holds, which are then finished along with the
// batch. A subject that names no valid session is left for its
// redelivery; a parked session's are acknowledged into its record.
func (r *round) marker(d delivery) error {
	sid := d.sid
	if sid == "" {
		return nil
	}
	r.s.see(sid, d.mark[len(d.mark)-1], d.part)
	switch {
	case r.fenced[sid] && !r.parked[sid]:
		return nil
	case !r.fenced[sid] && !r.s.current(d, sid):
		r.leave(sid)
		return nil
	case r.parked[sid] || r.p.parked.has(sid):
		for _, seq := range d.mark {
			r.acks = append(r.acks, ack{win: d.win, seq: seq})
		}
		r.p.count.parkedInputs.Add(uint64(len(d.mark)))
		return nil
	}
	sess, err := r.s.load(r.ctx, r.b, sid, d.horizon, d.epoch)
	if err != nil {
		return r.park(sid, err)
	}
	first, before := len(r.pubs), sess.seq
	if err := r.s.catchUp(r.ctx, r.b, sess, d.mark[len(d.mark)-1], d, &r.pubs); err != nil {
		return r.fail(sid, err)
	}
	r.received(first, d)
	sess.fresh = false
	sess.caughtUp = max(sess.caughtUp, d.horizon)
	if sess.seq != before {
		r.touch(sess)
	}
	for _, seq := range d.mark {
		r.acks = append(r.acks, ack{win: d.win, seq: seq, session: sid})
	}
	return nil
}

// received stamps the outputs from index first on with d's receipt: they
// were decided on it, caught-up outputs too.
func (r *round) received(first int, d delivery) {
	for i := first; i < len(r.pubs); i++ {
		r.pubs[i].received = d.at
	}
}

// input decides one input: routes it (a session left, parked or past its
// lease), readies its session's state, steps it, and records what to
// publish, store and acknowledge.
func (r *round) input(d delivery) error {
	p, m := r.p, d.msg
	if d.metaErr != nil {
		p.log.Error("message without JetStream metadata", "subject", m.Subject(), "err", d.metaErr)
		r.acks = append(r.acks, ack{msg: m, term: "seamguard: no JetStream metadata"})
		return nil
	}
	seq := d.meta.Sequence.Stream
	first := len(r.pubs) // outputs from here on were decided on d
	var sess *session
	if d.sid != "" {
		var done bool
		var err error
		sess, done, err = r.ready(d, d.sid, seq)
		r.s.see(d.sid, seq, d.part) // after its read: floor.go
		if err != nil || done {
			return err
		}
	}
	outs, term, err := p.step(r.ctx, sess, m.Subject(), m.Headers(), m.Data(), seq, func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
		return r.s.spill(ctx, r.b, d, sess, req)
	})
	if err != nil {
		if sess == nil {
			return err
		}
		// Its ledger may wait for a spill result: it is read again.
		return r.fail(sess.id, err)
	}
	sid := ""
	if sess != nil {
		sid = sess.id
	}
	if err := p.publishAll(r.ctx, r.b, outs, &r.pubs); err != nil {
		return r.park(sid, err)
	}
	if sess != nil {
		sess.seq = seq
		r.touch(sess)
		if h := r.s.horizon(sess.id, d); h > sess.caughtUp {
			if err := r.s.catchUp(r.ctx, r.b, sess, h, d, &r.pubs); err != nil {
				return r.fail(sess.id, err)
			}
			sess.caughtUp = h
		}
	}
	r.received(first, d)
	p.count.handled.Add(1)
	r.acks = append(r.acks, ack{msg: m, win: d.win, seq: seq, term: term, session: sid})
	return nil
}

// ready returns the session of input d (stream sequence seq), read and
// caught up to just before it, or done when the input needs nothing more
// from the batch: its session left, parked, or past the input already.
func (r *round) ready(d delivery, sid string, seq uint64) (sess *session, done bool, err error) {
	p, s, m := r.p, r.s, d.msg
	if r.fenced[sid] {
		if r.parked[sid] {
			r.acks = append(r.acks, ack{msg: m, win: d.win, seq: seq})
			p.count.parkedInputs.Add(1)
		}
		return nil, true, nil
	}
	if !s.current(d, sid) {
		r.leave(sid)
		return nil, true, nil
	}
	if p.parked.has(sid) {
		if !p.subj.IsControl(m.Subject()) {
			// Acknowledged into the park record: it waits in the events
			// stream.
			r.acks = append(r.acks, ack{msg: m, win: d.win, seq: seq})
			p.count.parkedInputs.Add(1)
			return nil, true, nil
		}
		// An operator's input: out of the park, read afresh and caught up
		// over every waiting input before it.
		if err := p.unpark(r.ctx, sid); err != nil {
			return nil, true, r.park(sid, err)
		}
		s.drop(sid)
		s.pre.state(sid) // read before the unpark: not used
	}
	sess, err = s.load(r.ctx, r.b, sid, d.horizon, d.epoch)
	if err != nil {
		return nil, true, r.park(sid, err)
	}
	if seq <= sess.seq {
		// Applied before (a restart, a catch-up): never twice. The ack
		// waits for the session's store like any other: if the batch
		// loses the session to another instance, what this instance
		// applied may not be stored anywhere.
		r.acks = append(r.acks, ack{msg: m, win: d.win, seq: seq, session: sess.id})
		return nil, true, nil
	}
	if s.horizon(sid, d) > sess.caughtUp || sess.fresh {
		// The messages before this one that may be pending elsewhere;
		// those after it follow in input. A state just read always
		// checks (catchup.go): it may be behind the stream.
		if err := s.catchUp(r.ctx, r.b, sess, seq-1, d, &r.pubs); err != nil {
			return nil, true, r.fail(sess.id, err)
		}
		sess.fresh = false
	}
	return sess, false, nil
}

// publish sends the batch's outputs and waits for each to be confirmed;
// a session one of whose outputs is not confirmed is left.
//
// A spill's outcome is published only while the lease it was decided under
// is still this instance's (see shard.spill): a round that went on for long
// after it may have outlasted the lease, and the partition's next holder
// may be deciding the same compaction with another outcome.
func (r *round) publish() error {
	p := r.p
	for id, d := range r.spilled {
		if r.fenced[id] {
			continue
		}
		if err := r.s.leaseHeld(d, id, "before its spill's outcome was published"); err != nil {
			r.fence(id, err)
		}
	}
	if err := r.s.sendVerdicts(r.ctx, r.b, r.pubs, r.fenced, r.park); err != nil {
		return err
	}
	for _, pub := range r.pubs {
		if r.fenced[pub.out.Session] {
			continue // left: what it published stands, its inputs wait
		}
		if err := p.confirm(r.ctx, r.b, pub); err != nil {
			if err := r.park(pub.out.Session, err); err != nil {
				return err
			}
			continue
		}
		p.observe(pub)
	}
	return nil
}

// noteSpill records that the round decided session id's spill outcome
// under the lease of delivery d.
func (r *round) noteSpill(id string, d delivery) {
	if r == nil {
		return
	}
	if r.spilled == nil {
		r.spilled = map[string]delivery{}
	}
	r.spilled[id] = d
}

// store settles the round's states that were not plainly stored (see
// startStores): each is stored on its own, and a session whose state
// cannot be is left.
func (r *round) store() error {
	for _, st := range r.stores.out {
		if r.fenced[st.sess.id] || st.done {
			continue
		}
		// A conflict means another instance owns the session now (the
		// partition moved): its inputs are left unacknowledged for the
		// owner, which applies them in order or skips them; what was
		// published is what the owner publishes, since decisions depend
		// only on the inputs (and a spill's failure only once the owner
		// is checked, see spill).
		if err := r.s.store(r.ctx, r.b, st); err != nil {
			if err := r.fail(st.sess.id, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish finishes the inputs of every session the batch did not leave
// (and of those it parked) in their ack windows, and sends the acks the
// windows release. A left session's inputs stay unfinished: no ack may
// cover them (see ackWindow) until the owner has them.
func (r *round) finish() {
	p := r.p
	var wins []*ackWindow
	unstuck := p.health.stuck.Load() > 0
	for _, a := range r.acks {
		if r.fenced[a.session] {
			if !r.parked[a.session] {
				continue
			}
			p.count.parkedInputs.Add(1)
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
	r.s.forgetLeft(r.fenced, r.acks)
}
