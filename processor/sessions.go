package processor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/processor/ledger"
)

// This file holds a shard's sessions and their state: loading a session
// from the bucket, the lease check that a delivery may still be decided, and
// storing touched sessions with compare-and-swap (the fence against another
// instance that moved a session on).

// session is a shard's cached state of one session.
type session struct {
	id string
	// l is the ledger; nil while the session is idle, when idle holds its
	// snapshot instead (see shard.sweep), or before its first event.
	l    *ledger.Ledger
	idle []byte
	used bool   // stepped since the last sweep
	seq  uint64 // last applied stream sequence
	rev  uint64 // KV revision of the stored state; 0 when none is stored
	// dirty is the shard's round that changed it last and whose store
	// has not completed (see round.go); 0 when the bucket holds all of
	// it. A dirty session stays in memory: the bucket is behind it.
	dirty uint64
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

// load returns the cached session, reading its stored state on first use.
//
// A session cached since before horizon is read again: after a break in
// delivery another instance may have moved it on (its own writes are always
// stored before its inputs are acked, so the cache never knows more than
// the bucket). So is one cached under an earlier lease of its partition
// (epoch): the partition was held elsewhere in between, and its new holder
// may have decided and stored since, even with nothing left pending.
//
// A session changed by the pending round (dirty from it) is settled first
// when it is not current: whatever the pending round stored is in the
// bucket then, and the session is read again from there (not from the
// batch's prefetch, which may have read it before that store). Deciding
// from memory after a new lease or a break in delivery would decide from
// a state another instance may have moved on meanwhile.
func (s *shard) load(ctx context.Context, b *budget, id string, horizon, epoch uint64) (*session, error) {
	if sess := s.sessions[id]; sess != nil {
		current := sess.loaded >= horizon && sess.epoch == epoch
		pending := s.pending != nil && sess.dirty == s.pending.n
		// A session changed in the batch at hand is newer than the bucket
		// until the batch is stored; if another instance moved it on, the
		// compare-and-swap at the end of the batch says so.
		if current || sess.dirty != 0 && !pending {
			return sess, nil
		}
		if pending {
			if err := s.settleFor(id); err != nil {
				return nil, err
			}
			s.pre.state(id) // read before the settle: not used
		}
		if s.sessions[id] != nil {
			s.drop(id)
			s.p.count.reloaded.Add(1)
		}
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
	if !s.leaseEnded(d) {
		return true
	}
	s.p.log.Info("the partition's lease ended before this input was decided; leaving it to the partition's next holder",
		"session", id, "partition", d.part, "seq", d.seq())
	return false
}

// leaseHeld is errFenced when the lease delivery d was fetched under has
// ended (see leaseEnded) before an effect of session id was used; when is
// what was under way.
func (s *shard) leaseHeld(d delivery, id string, when string) error {
	if !s.leaseEnded(d) {
		return nil
	}
	return fmt.Errorf("%w: %s: the lease of partition %d ended %s", errFenced, id, d.part, when)
}

// leaseEnded reports, and counts, whether the lease delivery d was fetched
// under is no longer this instance's, or about to end (leases.current).
// Deliveries of the consumer that needs no lease never end.
func (s *shard) leaseEnded(d delivery) bool {
	if d.part < 0 || s.lease == nil || s.lease.current(d.part, d.epoch) {
		return false
	}
	s.p.count.expired.Add(1)
	return true
}

// read reads a session's stored state into the cache.
func (s *shard) read(ctx context.Context, b *budget, id string) (*session, error) {
	if got, ok := s.pre.state(id); ok {
		sess := &session{id: id, fresh: true, rev: got.rev}
		if got.state != nil {
			sess.l, sess.seq = &got.state.Ledger, got.state.Seq
		}
		if got.proven > 0 {
			// Its partition's floor shows it holds every input up to
			// there (floor.go).
			sess.fresh, sess.caughtUp = false, got.proven
			s.p.count.floored.Add(1)
		}
		s.put(sess)
		s.woken++
		return sess, nil
	}
	kv := s.p.res.Sessions
	for attempt := 0; ; attempt++ {
		s.p.count.readInBatch.Add(1)
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

// sentStore is a session's state on its way to the bucket.
type sentStore struct {
	sess  *session
	val   []byte // the state sent, as of the end of its round
	round uint64 // the round it was sent for
	sent  time.Time
	done  bool // stored (storedAt was called)
}

// storeBatch is the states of one round on their way to the bucket.
type storeBatch struct {
	out    []sentStore
	ticket *groupTicket // nil: nothing was sent
}

// startStores sends the state of every session in touched to the bucket,
// each a compare-and-swap on the session's revision (what kv.Update and
// kv.Create publish), through the processor's writer of states (group.go),
// with other shards' states, as one atomic batch where there are enough,
// and otherwise each on its own, all at once; wait reads the outcome. A
// state plainly stored is done; whatever was not goes through store, which
// sorts out conflicts and lost replies. Sessions fenced during the batch
// are not sent.
func (s *shard) startStores(ctx context.Context, touched []*session, fenced map[string]bool, park func(string, error) error, round uint64) *storeBatch {
	p := s.p
	sb := &storeBatch{out: make([]sentStore, 0, len(touched))}
	msgs := make([]*nats.Msg, 0, len(touched))
	for _, sess := range touched {
		if fenced[sess.id] {
			continue // another instance's now, or left: nothing of it is stored
		}
		val, err := sess.state()
		if err != nil {
			_ = park(sess.id, fmt.Errorf("processor: session %s: %w: %w", sess.id, errPermanent, err))
			continue
		}
		msg := nats.NewMsg(p.cfg.Names().SessionSubject(sess.id))
		msg.Data = val
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(sess.rev, 10))
		msg.Header.Set(StateHeader, "1")
		sb.out = append(sb.out, sentStore{sess: sess, val: val, round: round, sent: time.Now()})
		msgs = append(msgs, msg)
	}
	if len(msgs) > 0 {
		sb.ticket = s.states.send(ctx, p, true, false, msgs)
	}
	return sb
}

// wait records the outcome of the batch's writes: each state plainly
// stored is done.
func (sb *storeBatch) wait(ctx context.Context, s *shard) {
	if sb.ticket == nil {
		return
	}
	for k, a := range sb.ticket.wait(ctx) {
		if a.ok {
			s.storedAt(sb.out[k].sess, a.seq, sb.out[k].sent, sb.out[k].round)
			sb.out[k].done = true
		}
	}
}

// storedAt records that sess's state as of round is stored at revision
// rev: the session is clean unless a later round changed it since.
func (s *shard) storedAt(sess *session, rev uint64, sent time.Time, round uint64) {
	sess.rev = rev
	if sess.dirty == round {
		sess.dirty = 0
	}
	s.p.obs.Stored(time.Since(sent))
	if sess.closed() && sess.dirty == 0 {
		s.drop(sess.id) // closed: nothing more to cache
	}
}

// store writes a session's state as sent (st) with compare-and-swap on
// its revision, until it is stored or the session is fenced.
func (s *shard) store(ctx context.Context, b *budget, st sentStore) error {
	p, sess, val := s.p, st.sess, st.val
	kv := p.res.Sessions
	for attempt := 0; ; attempt++ {
		var rev uint64
		var err error
		if sess.rev == 0 {
			rev, err = kv.Create(ctx, sess.id, val)
		} else {
			rev, err = kv.Update(ctx, sess.id, val, sess.rev)
		}
		if err == nil {
			s.storedAt(sess, rev, st.sent, st.round)
			return nil
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			p.obs.CASConflict()
			// Our own earlier attempt may have landed with its reply lost.
			e, gerr := kv.Get(ctx, sess.id)
			switch {
			case gerr == nil && bytes.Equal(e.Value(), val):
				s.storedAt(sess, e.Revision(), st.sent, st.round)
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
