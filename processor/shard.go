package processor

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/processor/ledger"
)

// This file holds a shard's batch: the owner goroutine of a set of
// sessions takes the deliveries the fetchers sent it, decides each input on
// its session's ledger, publishes the verdicts, stores every touched session
// once and only then finishes the inputs in their ack windows.

// shardOf is FNV-32a of the subject modulo n.
//
// FNV-1a's low bits are a poor hash on their own: the stored subject holds
// the partition digit, itself FNV-1a of the session modulo the partitions,
// and with both taken modulo a power of two they cancel (every session of
// an even-length id went to shard 0 or 4 of 8). So the sum is mixed
// (murmur3's finalizer) before it is reduced.
func shardOf(subject string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(subject); i++ {
		h ^= uint32(subject[i])
		h *= 16777619
	}
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return int(h % uint32(n))
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
	pre   prefetch // the batch's reads, made ahead (prefetch.go)
	// left holds, for each session with inputs this shard left undecided
	// (fenced, stuck, or past its partition's lease), the highest of them.
	// Those wait for their redelivery, which may come after later inputs
	// of the session: until the session has caught up past them from the
	// stream, each later input first catches up (see handle).
	left map[string]uint64
	// leftAll stands for the entries of left dropped to bound it (see
	// maxLeft): every session catches up past it once.
	leftAll uint64
}

// maxLeft bounds a shard's left entries: past it they fold into leftAll.
const maxLeft = 1 << 16

// horizon is the highest stream sequence up to which session id must
// catch up before deciding delivery d: d's horizon, or higher when this
// shard left inputs of the session undecided.
func (s *shard) horizon(id string, d delivery) uint64 {
	return max(d.horizon, s.left[id], s.leftAll)
}

// noteLeft records the inputs of batch whose sessions the batch left
// (fenced holds them), and forgets what the sessions acks finished have
// caught up past. A batch that left nothing, on a shard that remembers
// nothing left, costs nothing here.
func (s *shard) noteLeft(batch []delivery, fenced map[string]bool, acks []ack) {
	if len(fenced) > 0 {
		for _, d := range batch {
			subject := d.markSubject
			if d.msg != nil {
				subject = d.msg.Subject()
			}
			sid, err := s.p.subj.SessionOf(subject)
			if err != nil || !fenced[sid] {
				continue
			}
			if s.left == nil {
				s.left = map[string]uint64{}
			}
			s.left[sid] = max(s.left[sid], d.seq())
		}
		if len(s.left) > maxLeft {
			for _, seq := range s.left {
				s.leftAll = max(s.leftAll, seq)
			}
			clear(s.left)
		}
	}
	if len(s.left) == 0 {
		return
	}
	for _, a := range acks {
		seq, ok := s.left[a.session]
		if !ok || fenced[a.session] {
			continue
		}
		if sess := s.sessions[a.session]; sess != nil && sess.caughtUp >= seq {
			delete(s.left, a.session)
		}
	}
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
	b := &budget{limit: p.cfg.RetryFor, notice: p.noticeFailure}
	s.fill(ctx, batch)
	defer s.pre.clear()
	// parkedNow holds the sessions of fenced parked during the batch: their
	// inputs are acknowledged after all.
	var parkedNow map[string]bool
	park := func(id string, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fenced[id] {
			return nil
		}
		p.noticeFailure(err)
		if p.health.set(stuckPrefix+id, err) {
			p.obs.Stuck(id, true)
		}
		if p.parkable(id, err) {
			// Stuck for good: parked, its inputs acknowledged into the
			// record once it is stored (park.go).
			perr := p.park(ctx, id, err)
			if perr == nil {
				if parkedNow == nil {
					parkedNow = map[string]bool{}
				}
				parkedNow[id] = true
				leave(id)
				return nil
			}
			p.log.Error("cannot park the session; it stays stuck", "session", id, "err", perr)
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
			if sid, err := p.subj.SessionOf(d.markSubject); err == nil && (parkedNow[sid] || !fenced[sid] && p.parked.has(sid)) {
				for _, seq := range d.mark {
					acks = append(acks, ack{win: d.win, seq: seq})
				}
				p.parkedInputs.Add(uint64(len(d.mark)))
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
			if parkedNow[sid] {
				acks = append(acks, ack{msg: m, win: d.win, seq: seq})
				p.parkedInputs.Add(1)
			}
			continue
		}
		if serr == nil {
			if !s.current(d, sid) {
				leave(sid)
				continue
			}
			if p.parked.has(sid) {
				if !p.subj.IsControl(m.Subject()) {
					// Acknowledged into the park record: it waits in the
					// events stream.
					acks = append(acks, ack{msg: m, win: d.win, seq: seq})
					p.parkedInputs.Add(1)
					continue
				}
				// An operator's input: out of the park, read afresh and
				// caught up over every waiting input before it.
				if err := p.unpark(ctx, sid); err != nil {
					if err := park(sid, err); err != nil {
						return err
					}
					continue
				}
				s.drop(sid)
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
			if s.horizon(sid, d) > sess.caughtUp || sess.fresh {
				// The messages before this one that may be pending
				// elsewhere; those after it follow below. A state just
				// read always checks (catchup.go): it may be behind
				// the stream.
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
		if err := p.publishAll(ctx, b, outs, &pubs); err != nil {
			if err := park(sid, err); err != nil {
				return err
			}
			continue
		}
		if sess != nil {
			sess.seq = seq
			if !sess.dirty {
				sess.dirty = true
				touched = append(touched, sess)
			}
			if h := s.horizon(sess.id, d); h > sess.caughtUp {
				if err := s.catchUp(ctx, b, sess, h, m, &pubs); errors.Is(err, errFenced) {
					fence(sess.id, err)
					continue
				} else if err != nil {
					if err := park(sess.id, err); err != nil {
						return err
					}
					continue
				}
				sess.caughtUp = h
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
	if err := s.sendVerdicts(ctx, b, pubs, fenced, park); err != nil {
		return err
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
	stores := s.sendStores(ctx, touched, fenced, park)
	for _, st := range stores {
		if fenced[st.sess.id] || st.done || s.stored(ctx, st) {
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
			if !parkedNow[a.session] {
				continue
			}
			p.parkedInputs.Add(1)
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
	s.noteLeft(batch, fenced, acks)
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
