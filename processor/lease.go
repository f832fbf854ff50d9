package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// leases decides which partitions this instance consumes. Each partition
// has a key "p<n>" in the leases bucket, whose value names its holder; the
// bucket's MaxAge is the lease TTL, so a key nobody renews disappears and
// anyone may create it again. Each instance also keeps a key "m.<id>" there,
// so that all know how many share the partitions and take at most their
// fair share, handing the rest over.
//
// A holder renews its keys by compare-and-swap every TTL/4, and fetches a
// partition only while its last renewal is recent enough that the key
// cannot have expired before a fetch begun now has ended (see begin). So a
// new holder's first fetch comes after the old holder's last one began: at
// most one fetch in flight overlaps, and the session fence (compare-and-swap
// on the session state) keeps that harmless.
type leases struct {
	kv     jetstream.KeyValue
	stream jetstream.Stream // the bucket's stream, for the member count
	bucket string
	id     string
	ttl    time.Duration
	log    *slog.Logger
	now    func() time.Time
	// report is told, after each round, the round's first failure to
	// reach the bucket, or nil (set before run; may be nil).
	report func(error)
	fault  error // this round's first failure (the run goroutine's own)

	mu    sync.Mutex
	parts []leaseState
	wake  chan struct{} // closed (and replaced) whenever a lease is taken or renewed
}

// leaseState is one partition's lease as this instance sees it.
type leaseState struct {
	// epoch counts the times this instance took the key: a session read
	// under an earlier epoch may have been moved on by another instance
	// since, and is read again (see shard.load).
	epoch     uint64
	held      bool      // this instance holds the key
	releasing bool      // handing it over: no new fetch begins
	busy      bool      // a fetch (and the dispatch of its messages) is under way
	rev       uint64    // revision of the key as last written here
	renewed   time.Time // when the write of that revision was sent
}

// newLeases returns the lease keeper of partitions 0..n-1.
func newLeases(kv jetstream.KeyValue, stream jetstream.Stream, bucket string, n int, ttl time.Duration, log *slog.Logger) *leases {
	return &leases{
		kv: kv, stream: stream, bucket: bucket, id: instanceID(), ttl: ttl,
		log: log, now: time.Now, parts: make([]leaseState, n), wake: make(chan struct{}),
	}
}

// instanceID names this instance in the bucket: host, process and a random
// part, so that a restarted process is a new holder.
func instanceID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, host)
	if host == "" {
		host = "host"
	}
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + nuid.Next()
}

func partKey(p int) string { return "p" + strconv.Itoa(p) }

// begin reports whether a fetch of partition p may start now, and if so
// marks it under way until end and returns how long the fetch may wait for
// messages, and the lease's epoch. It may not when this instance does not hold the lease, is
// handing it over, or last renewed it so long ago that the key might expire
// within 50ms. The wait ends, with a tenth of the TTL to spare, before the
// key could expire, so that the server sends nothing of this fetch after
// another instance could have taken the partition.
func (l *leases) begin(p int, most time.Duration) (time.Duration, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	left := l.left(p)
	if left < leaseMinLeft {
		return 0, 0, false
	}
	l.parts[p].busy = true
	return min(most, left), l.parts[p].epoch, true
}

// current reports whether this instance still holds partition p under the
// lease of epoch, with time left before the key could expire: only then
// may it decide what that lease's fetches delivered. An instance paused
// (or cut off) past its lease wakes with deliveries in hand that another
// instance may have decided since, from a state this one has not seen; it
// leaves them. A partition being handed over is still current: its
// deliveries are decided until the key is deleted.
func (l *leases) current(p int, epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := &l.parts[p]
	return s.held && s.epoch == epoch && l.now().Before(s.renewed.Add(l.ttl-l.ttl/10))
}

// left is how much longer this instance may fetch partition p: until a
// tenth of the TTL before its key could expire; zero when it does not hold
// it or is handing it over. l.mu is held.
func (l *leases) left(p int) time.Duration {
	s := &l.parts[p]
	if !s.held || s.releasing {
		return 0
	}
	return max(s.renewed.Add(l.ttl-l.ttl/10).Sub(l.now()), 0)
}

// end marks partition p's fetch done.
func (l *leases) end(p int) {
	l.mu.Lock()
	l.parts[p].busy = false
	l.mu.Unlock()
}

// held returns the partitions this instance holds.
func (l *leases) held() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for p, s := range l.parts {
		if s.held {
			out = append(out, p)
		}
	}
	return out
}

// run keeps the leases until ctx ends, a round every TTL/4.
func (l *leases) run(ctx context.Context) {
	every := max(l.ttl/4, leaseMinRound)
	for {
		l.fault = nil
		l.round(ctx)
		if l.report != nil && ctx.Err() == nil {
			l.report(l.fault)
		}
		if sleep(ctx, every) != nil {
			return
		}
	}
}

// round renews what is held, announces this instance, and takes or hands
// over partitions towards the fair share.
func (l *leases) round(ctx context.Context) {
	for p := range l.parts {
		l.renew(ctx, p)
	}
	if _, err := l.kv.Put(ctx, "m."+l.id, []byte(l.id)); err != nil && ctx.Err() == nil {
		l.log.Warn("announcing this instance in the leases bucket failed", "bucket", l.bucket, "err", err)
		l.failed(err)
	}
	members, err := l.members(ctx)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("counting the instances failed", "bucket", l.bucket, "err", err)
			l.failed(err)
		}
		return
	}
	share := (len(l.parts) + members - 1) / members
	held := l.held()
	// Hand over the partitions beyond the share: those being handed over
	// already, then idle ones, then those with a fetch under way, the
	// highest first. The others are kept, also one whose hand-over began
	// in an earlier round: the share may have grown since (an instance
	// left), and a partition left marked for hand-over would never be
	// fetched again, nor deleted for another instance to take.
	over := len(held) - share
	l.mu.Lock()
	rank := func(p int) int {
		switch s := l.parts[p]; {
		case s.releasing:
			return 0
		case !s.busy:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(held, func(x, y int) int {
		if c := rank(x) - rank(y); c != 0 {
			return c
		}
		return y - x
	})
	l.mu.Unlock()
	for i, p := range held {
		if i < over {
			l.release(ctx, p)
		} else {
			l.keep(p)
		}
	}
	if len(held) >= share {
		return
	}
	// Try the others, starting at a place of this instance's own, so that
	// instances starting together do not all ask for the same keys. As
	// many at once as the share lacks: a server that syncs every write
	// stores each with an fsync, and one after another a fresh instance
	// would wait for all of them before its last partition is fetched.
	start := int(nuidHash(l.id) % uint32(len(l.parts)))
	n := len(held)
	for i := 0; i < len(l.parts) && n < share; {
		var took atomic.Int32
		var wg sync.WaitGroup
		for k := n; k < share && i < len(l.parts); k++ {
			p := (start + i) % len(l.parts)
			i++
			wg.Go(func() {
				if l.take(ctx, p) {
					took.Add(1)
				}
			})
		}
		wg.Wait()
		n += int(took.Load())
	}
}

func nuidHash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// renew rewrites a held key with compare-and-swap. A mismatch means the key
// expired and another instance took it (or this one's last write landed
// unseen): the key is read to tell which.
func (l *leases) renew(ctx context.Context, p int) {
	l.mu.Lock()
	s := l.parts[p]
	l.mu.Unlock()
	if !s.held {
		return // (one being handed over is renewed until it is deleted)
	}
	sent := l.now()
	rev, err := l.kv.Update(ctx, partKey(p), []byte(l.id), s.rev)
	if err == nil {
		l.set(p, func(s *leaseState) { s.rev, s.renewed = rev, sent })
		return
	}
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		e, gerr := l.kv.Get(ctx, partKey(p))
		if gerr == nil && string(e.Value()) == l.id {
			// Still this instance's: the last renewal was written but its
			// answer lost. Renew on that revision at the next round.
			l.set(p, func(s *leaseState) { s.rev = e.Revision() })
			return
		}
		l.set(p, func(s *leaseState) { *s = leaseState{busy: s.busy, epoch: s.epoch} })
		holder := "nobody"
		if gerr == nil {
			holder = string(e.Value())
		}
		l.log.Warn("lost a partition's lease (it expired)", "partition", p, "holder", holder)
		return
	}
	l.log.Warn("renewing a partition's lease failed; retrying", "partition", p, "err", err)
	l.failed(err)
}

// failed notes a failure to reach the bucket in this round (takes run
// at once: see round).
func (l *leases) failed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fault == nil {
		l.fault = err
	}
}

// take creates partition p's key if no one holds it.
func (l *leases) take(ctx context.Context, p int) bool {
	l.mu.Lock()
	held := l.parts[p].held
	l.mu.Unlock()
	if held {
		return false
	}
	sent := l.now()
	rev, err := l.kv.Create(ctx, partKey(p), []byte(l.id))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			l.log.Warn("taking a partition's lease failed", "partition", p, "err", err)
			l.failed(err)
		}
		return false
	}
	l.set(p, func(s *leaseState) {
		*s = leaseState{held: true, busy: s.busy, rev: rev, renewed: sent, epoch: s.epoch + 1}
	})
	l.log.Info("took a partition", "partition", p, "instance", l.id)
	return true
}

// release hands partition p over: no new fetch begins; once the fetch under
// way (if any) has ended, the key is deleted so that another instance can
// take it at once. Until then it is left to the next round.
func (l *leases) release(ctx context.Context, p int) {
	l.mu.Lock()
	s := &l.parts[p]
	if !s.held {
		l.mu.Unlock()
		return
	}
	s.releasing = true
	if s.busy {
		l.mu.Unlock()
		return
	}
	rev := s.rev
	l.mu.Unlock()
	err := l.kv.Delete(ctx, partKey(p), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// A renewal landed whose answer never came (cut off by the end of
		// the keeper's rounds): the key may still be this instance's, at
		// a later revision. Delete that one, or the partition waits out
		// its TTL.
		if e, gerr := l.kv.Get(ctx, partKey(p)); gerr == nil && string(e.Value()) == l.id {
			err = l.kv.Delete(ctx, partKey(p), jetstream.LastRevision(e.Revision()))
		}
	}
	if err != nil && ctx.Err() == nil && !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		l.log.Warn("handing a partition over failed; retrying", "partition", p, "err", err)
		return
	}
	l.set(p, func(s *leaseState) { *s = leaseState{busy: s.busy, epoch: s.epoch} })
	if err == nil {
		l.log.Info("handed a partition over", "partition", p, "instance", l.id)
	}
}

// keep calls off the hand-over of partition p, if one began.
func (l *leases) keep(p int) {
	l.mu.Lock()
	releasing := l.parts[p].releasing && l.parts[p].held
	l.mu.Unlock()
	if releasing {
		l.set(p, func(s *leaseState) { s.releasing = false })
		l.log.Info("kept a partition it was handing over: its share grew", "partition", p, "instance", l.id)
	}
}

// releaseAll hands every held partition over and withdraws this instance:
// the end of a drain, with no fetch under way.
func (l *leases) releaseAll(ctx context.Context) {
	for _, p := range l.held() {
		l.release(ctx, p)
	}
	if err := l.kv.Delete(ctx, "m."+l.id); err != nil && ctx.Err() == nil {
		l.log.Warn("withdrawing this instance from the leases bucket failed", "err", err)
	}
}

func (l *leases) set(p int, f func(*leaseState)) {
	l.mu.Lock()
	f(&l.parts[p])
	close(l.wake) // a fetcher waiting to begin looks again
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// changed returns a channel closed at the next change of any lease here.
func (l *leases) changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.wake
}

// members counts the instances whose member key is live (not deleted).
// The bucket's stream lists the member subjects; a key deleted by a drained
// instance stays there as a marker until it ages out, so each is read.
func (l *leases) members(ctx context.Context) (int, error) {
	prefix := KVPrefix(l.bucket) + "m."
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
	if err != nil {
		return 0, fmt.Errorf("processor: list the instances in %s: %w", l.bucket, err)
	}
	n := 0
	for subj := range info.State.Subjects {
		id := strings.TrimPrefix(subj, prefix)
		if id == l.id {
			n++
			continue
		}
		if _, err := l.kv.Get(ctx, "m."+id); err == nil {
			n++
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, fmt.Errorf("processor: read instance %s in %s: %w", id, l.bucket, err)
		}
	}
	return max(n, 1), nil
}

// LeaseHolder is an instance that holds partitions' leases, as the leases
// bucket records it.
type LeaseHolder struct {
	// Instance is the holder's id as written in the keys: its host, its
	// process id and a random part ("rebuild-" first for a rebuild).
	Instance   string
	Partitions []int
	// Renewed is when the holder last wrote one of those keys (the
	// server's clock), and Revision that write's revision in the bucket.
	Renewed  time.Time
	Revision uint64
}

// LeasesHeldError is a rebuild's refusal: other instances hold partitions'
// leases, so that a rebuild beside them would decide and write what they
// decide and write.
type LeasesHeldError struct {
	Bucket  string
	TTL     time.Duration // the leases' TTL: how long a stopped holder's lease outlives it
	Holders []LeaseHolder // sorted by instance
}

func (e *LeasesHeldError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "processor: rebuild refused: live instances hold partitions' leases in %s, and a rebuild must be the only writer:", e.Bucket)
	for i, h := range e.Holders {
		if i > 0 {
			b.WriteString(";")
		}
		parts := make([]string, len(h.Partitions))
		for j, p := range h.Partitions {
			parts[j] = strconv.Itoa(p)
		}
		fmt.Fprintf(&b, " instance %s holds partition(s) %s (renewed %s, revision %d)",
			h.Instance, strings.Join(parts, ","), h.Renewed.UTC().Format(time.RFC3339Nano), h.Revision)
	}
	fmt.Fprintf(&b, "; stop them first (a drain hands their partitions over at once; a killed instance's leases expire %s after its last renewal), then run the rebuild again", e.TTL)
	return b.String()
}

// takeAll takes every partition's lease for an instance that must be the
// only writer (a rebuild). A partition held by another instance is watched
// until wait has passed: a holder that stopped without handing over stops
// renewing, and its key expires (and is taken here) within the TTL of its
// last renewal; a holder that renews the key meanwhile (every TTL/4), or a
// key taken by yet another instance, is live, and takeAll gives back what
// it took and refuses at once with a *LeasesHeldError naming the holders,
// as it does when wait has passed with partitions still held.
func (l *leases) takeAll(ctx context.Context, wait time.Duration) error {
	deadline := l.now().Add(wait)
	first := map[int]uint64{} // revision of another's key when first seen
	for {
		holders := map[string]*LeaseHolder{}
		live := false
		for p := range l.parts {
			sent := l.now()
			if l.isHeld(p) || l.take(ctx, p) {
				continue
			}
			if ctx.Err() != nil {
				l.giveBack(ctx)
				return ctx.Err()
			}
			e, err := l.kv.Get(ctx, partKey(p))
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				continue // expired (or handed over) since: taken in the next look
			case err != nil:
				l.giveBack(ctx)
				return fmt.Errorf("processor: read the lease of partition %d in %s: %w", p, l.bucket, err)
			case string(e.Value()) == l.id:
				// This instance's create landed, its answer lost.
				l.set(p, func(s *leaseState) {
					*s = leaseState{held: true, rev: e.Revision(), renewed: sent, epoch: s.epoch + 1}
				})
				continue
			}
			if rev, ok := first[p]; !ok {
				first[p] = e.Revision()
			} else if rev != e.Revision() {
				live = true
			}
			h := holders[string(e.Value())]
			if h == nil {
				h = &LeaseHolder{Instance: string(e.Value())}
				holders[h.Instance] = h
			}
			h.Partitions = append(h.Partitions, p)
			if e.Created().After(h.Renewed) {
				h.Renewed, h.Revision = e.Created(), e.Revision()
			}
		}
		if len(holders) == 0 {
			return nil
		}
		if live || !l.now().Before(deadline) {
			l.giveBack(ctx)
			herr := &LeasesHeldError{Bucket: l.bucket, TTL: l.ttl}
			for _, h := range holders {
				herr.Holders = append(herr.Holders, *h)
			}
			slices.SortFunc(herr.Holders, func(a, b LeaseHolder) int { return strings.Compare(a.Instance, b.Instance) })
			return herr
		}
		if err := sleep(ctx, max(min(l.ttl/20, leaseTakeMaxWait), leaseMinRound)); err != nil {
			l.giveBack(ctx)
			return err
		}
	}
}

func (l *leases) isHeld(p int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parts[p].held
}

// keepAll renews every held lease each TTL/4 until ctx ends, for an
// instance that must hold them all (a rebuild): lost is called, and
// keepAll returns, as soon as one is no longer held (it expired and
// another instance took it).
func (l *leases) keepAll(ctx context.Context, lost func(error)) {
	every := max(l.ttl/4, leaseMinRound)
	for sleep(ctx, every) == nil {
		for p := range l.parts {
			l.renew(ctx, p)
			if ctx.Err() != nil {
				return
			}
			if !l.isHeld(p) {
				lost(fmt.Errorf("processor: lost the lease of partition %d in %s (not renewed within %s): another instance may have taken it", p, l.bucket, l.ttl))
				return
			}
		}
	}
}

// allCurrent reports, as an error, a partition whose lease this instance
// does not hold, or last renewed so long ago that the key might expire
// within a tenth of the TTL: a writer that must be alone writes only
// while it is nil.
func (l *leases) allCurrent() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, s := range l.parts {
		if !s.held || !l.now().Before(s.renewed.Add(l.ttl-l.ttl/10)) {
			return fmt.Errorf("processor: the lease of partition %d in %s is not held or not renewed in time; stopping before another instance could take it", p, l.bucket)
		}
	}
	return nil
}

// giveBack deletes every key this instance holds (none may be under way),
// so that other instances can take them at once.
func (l *leases) giveBack(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseWait)
	defer cancel()
	for _, p := range l.held() {
		l.release(ctx, p)
	}
}
