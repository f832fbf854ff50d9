package processor

import (
	"bytes"
	"context"
	"sync/atomic"
	"time"
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
	p     *Processor
	index int // among the processor's shards
	lease *leases
	// states and verdicts are the processor's writers (group.go; nil:
	// the shard writes its own).
	states, verdicts *writeGroup
	q                chan delivery
	sessions         map[string]*session
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
	// seen holds, for each session the shard decided an input of whose
	// partition's stored floor is not past it, the highest such input;
	// seenPruned is, by partition, the floor up to which it was forgotten,
	// and seenNext the size at which to forget again (floor.go).
	seen       map[string]floorSeen
	seenPruned map[int]uint64
	seenNext   int
	// rounds counts the shard's rounds; pending is the round whose
	// states are in flight, cur the round being decided (round.go).
	rounds       uint64
	pending, cur *round
}

// maxLeft bounds a shard's left entries: past it they fold into leftAll.
const maxLeft = 1 << 16

// horizon is the highest stream sequence up to which session id must
// catch up before deciding delivery d: d's horizon, or higher when this
// shard left inputs of the session undecided.
func (s *shard) horizon(id string, d delivery) uint64 {
	return max(d.horizon, s.left[id], s.leftAll)
}

// forgetLeft forgets what the sessions acks finished have caught up past
// (round.leave records what a round leaves, the moment it leaves it;
// fenced holds the sessions the round left). A shard that remembers
// nothing left costs nothing here.
func (s *shard) forgetLeft(fenced map[string]bool, acks []ack) {
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

// lastSeqs returns the highest stream sequence of each session in batch.
func (s *shard) lastSeqs(batch []delivery) map[string]uint64 {
	out := map[string]uint64{}
	for _, d := range batch {
		if d.sid != "" {
			out[d.sid] = max(out[d.sid], d.seq())
		}
	}
	return out
}

// noteLeftAt records that the inputs of session id up to stream sequence
// seq were left undecided here.
func (s *shard) noteLeftAt(id string, seq uint64) {
	if s.left == nil {
		s.left = map[string]uint64{}
	}
	s.left[id] = max(s.left[id], seq)
	if len(s.left) > maxLeft {
		for _, seq := range s.left {
			s.leftAll = max(s.leftAll, seq)
		}
		clear(s.left)
	}
}

// put caches sess.
func (s *shard) put(sess *session) {
	if _, ok := s.sessions[sess.id]; !ok {
		s.p.count.cached.Add(1)
	}
	s.sessions[sess.id] = sess
}

// drop removes session id from the cache.
func (s *shard) drop(id string) {
	if _, ok := s.sessions[id]; ok {
		s.p.count.cached.Add(-1)
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
		case sess.dirty == 0 && !sess.l.Pending():
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
		if sess.l == nil && sess.dirty == 0 {
			s.drop(id)
			s.p.count.dropped.Add(1)
		}
	}
}

func (s *shard) run(ctx context.Context) error {
	// Two batches: one may be pending while the next is decided.
	var bufs [2][]delivery
	for i := range bufs {
		bufs[i] = make([]delivery, 0, s.p.cfg.MaxBatch)
	}
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		m, ok, err := s.next(ctx, tick.C)
		if err != nil {
			return err
		}
		if !ok {
			return s.settle()
		}
		batch := s.take(ctx, append(bufs[s.rounds%2][:0], m))
		if err := s.handle(ctx, batch); err != nil {
			return err
		}
		if idleAll {
			// Every session of the batch idled: none may be pending.
			if err := s.settle(); err != nil {
				return err
			}
		}
		if s.woken >= maxLive || idleAll {
			s.sweep()
		}
	}
}

// take adds to batch what is queued, up to its capacity, without waiting
// (but for a test's first round, see FirstRoundTakes).
func (s *shard) take(ctx context.Context, batch []delivery) []delivery {
	for len(batch) < cap(batch) {
		var m delivery
		var ok bool
		select {
		case m, ok = <-s.q:
		default:
			if len(batch) >= int(firstRoundTakes.Load()) {
				return batch
			}
			// A test's first round waits for the inputs it must hold.
			select {
			case m, ok = <-s.q:
			case <-ctx.Done():
			}
		}
		if !ok {
			break
		}
		batch = append(batch, m)
	}
	if n := firstRoundTakes.Load(); n > 0 && len(batch) >= int(n) {
		firstRoundTakes.Store(0)
	}
	return batch
}

// firstRoundTakes, when above 0, is the number of inputs a shard's first
// round waits to hold (a test's; see FirstRoundTakes).
var firstRoundTakes atomic.Int32

// next returns the next delivery, not ok once the queue is closed. With
// nothing queued it settles the pending round before it waits; it sweeps
// on every tick.
func (s *shard) next(ctx context.Context, tick <-chan time.Time) (m delivery, ok bool, err error) {
	for {
		select {
		case m, ok = <-s.q:
			return m, ok, nil
		case <-tick:
			s.sweep()
			continue
		case <-ctx.Done():
			return m, false, ctx.Err()
		default:
		}
		if err := s.settle(); err != nil {
			return m, false, err
		}
		select {
		case m, ok = <-s.q:
			return m, ok, nil
		case <-tick:
			s.sweep()
		case <-ctx.Done():
			return m, false, ctx.Err()
		}
	}
}

// sendAck acknowledges or terminates inputs whose effects are durable.
func (p *Processor) sendAck(a ackAction) {
	if err := a.send(); err != nil {
		// The effects are durable; a lost ack means a redelivery that
		// the stored sequence skips.
		p.log.Warn("ack failed", "subject", a.msg.Subject(), "err", err)
	}
}
