package processor

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds the partitions' floors: what lets a session read fresh
// from the bucket skip its catch-up's lookups in the events stream.
//
// A session read fresh is checked against the events stream before
// anything is decided on it (catchup.go): its stored state may be behind
// the inputs acknowledged for it. At a fleet's scale nearly every input is
// such a session, and the lookup (a request per session) costs the server
// more than reading the state. A floor shows, for most of them, that the
// lookup would find nothing but the input at hand.
//
//   - The floor of a partition is a key of the session bucket,
//     floor.<partitions>.<partition>, holding two stream sequences of the
//     events stream, low and X: every input of the partition after low up
//     to X is finished (applied, its state stored; or acknowledged into a
//     park record), and every state those inputs changed was stored before
//     the floor. X is the last input the partition's ack window released
//     here. The states' writer (group.go) puts the floors whose X moved on
//     into a group of states large enough for an atomic batch, at most one
//     group every floorEvery, and the processor stores them once more when
//     it has drained.
//   - low is where this processor's holding of the partition took over
//     the floors: when it takes the partition (or its delivery breaks) at
//     base, the highest stream sequence the consumer had delivered, it
//     keeps the stored floor's low if that floor reaches base, and starts
//     again at base if not (inputs up to base were finished by another
//     holder, or before the break, and no floor vouches for them). A
//     holder that lost the partition may still write its floor: what it
//     writes is as true.
//   - A batch's states are read with the floors of their partitions and
//     each session's park record, in one request (multiget.go): one view
//     of the bucket, as of one stream sequence. A view that ends before
//     the last write this processor stored shows nothing.
//   - Every message of the partition past base comes to this instance, in
//     stream order, and the shard remembers, for each session it decided
//     an input of, the highest one (seen), until a stored floor passes it.
//
// A state read fresh for an input of the partition is then taken as caught
// up to X, its catch-up's lookups not made, when: the view holds the
// partition's floor; X is at least base and at least what the shard has
// forgotten of seen; the state is stored by a processor (StateHeader: a
// state put by hand has none), is not a deletion, and holds the inputs up
// to low (its sequence is at least low); the view holds no park record of
// the session, or its deletion, newer than the state; and the shard has
// seen no input of the session past the state. Every input of the session
// up to X is in the state then, and every message of its partition between
// X and the input came here, in order, and none was the session's. The
// horizon (a break in delivery, inputs left undecided) still has it catch
// up past X when it must.
//
// This rests on the bucket losing, if anything, the tail of its log, with
// its floors: a stream restored from a backup, a replica behind its
// leader, a lazy server's power cut that drops what it had not synced. A
// restore under a running processor shows as its writes stored at
// sequences it had passed: it then stops writing and trusting floors,
// deletes them, and logs it. A state put by hand (kv put) has no
// StateHeader and is always caught up; states republished key by key with
// their headers are not noticed, and their floors must be deleted with
// them.

// floorMinGroup is the fewest states a group holds to carry floors: as
// many as make it an atomic batch; and floorEvery is the least time
// between two groups that carry them (tests lower both).
var (
	floorMinGroup = minAtomicBatch
	floorEvery    = 100 * time.Millisecond
)

// FloorKeyPrefix is the prefix of the floor keys in the session bucket.
const FloorKeyPrefix = "floor."

// FloorKey is the key in the session bucket of the floor of partition part
// of partitions: a floor is only ever read under the partition count it
// was written for.
func FloorKey(partitions, part int) string {
	return FloorKeyPrefix + strconv.Itoa(partitions) + "." + strconv.Itoa(part)
}

// StateHeader is the header every state the processor stores carries; a
// state without it is always caught up from the events stream when read.
const StateHeader = "Seamguard-State"

// floorSeen is what the shard remembers of a session's inputs decided
// here: the highest stream sequence, and its partition.
type floorSeen struct {
	seq  uint64
	part int
}

// floors holds, by partition, what this processor knows of the floors,
// and what the writer knows of the bucket's log.
type floors struct {
	// finished is the last input of the partition's consumer released
	// (acknowledged) here: every input up to it is finished.
	finished []atomic.Uint64
	// low is the low end of the floors this holding of the partition
	// writes (see lowAt), valid once lowKnown is set.
	low      []atomic.Uint64
	lowKnown []atomic.Bool
	// stored is the floor last stored.
	stored []atomic.Uint64
	// maxRev is the highest stream sequence of the bucket the writer had
	// stored at; a view of the bucket that ends before it is behind this
	// processor's own writes, and shows nothing caught up.
	maxRev atomic.Uint64
	// lastAt is when the writer last put floors into a group (unix
	// nanoseconds): at most one group every floorEvery carries them.
	lastAt atomic.Int64
	// off is set once a write of the writer was stored at a sequence at or
	// below maxRev: the bucket's log went back (the stream restored from
	// a backup, or made anew, under the processor), so acknowledged inputs
	// may be in no state. No floor is written or trusted after that.
	off atomic.Bool
}

func newFloors(partitions int) *floors {
	return &floors{finished: make([]atomic.Uint64, partitions), low: make([]atomic.Uint64, partitions),
		lowKnown: make([]atomic.Bool, partitions), stored: make([]atomic.Uint64, partitions)}
}

// storedAt returns the floor of part last known stored (0: none).
func (f *floors) storedAt(part int) uint64 {
	if f == nil || part < 0 || part >= len(f.stored) {
		return 0
	}
	return f.stored[part].Load()
}

// finishedOf returns where part's ack window records its releases (nil
// for no partition).
func (f *floors) finishedOf(part int) *atomic.Uint64 {
	if f == nil || part < 0 || part >= len(f.finished) {
		return nil
	}
	return &f.finished[part]
}

// raise sets a to v when v is higher.
func raise(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if cur >= v || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// floorValue is a floor as stored: its low end and its sequence.
func FloorValue(low, x uint64) []byte {
	b := strconv.AppendUint(nil, low, 10)
	b = append(b, ' ')
	return strconv.AppendUint(b, x, 10)
}

// parseFloor reads a floor as stored.
func parseFloor(data []byte) (low, x uint64, ok bool) {
	a, b, found := strings.Cut(strings.TrimSpace(string(data)), " ")
	if !found {
		return 0, 0, false
	}
	low, err1 := strconv.ParseUint(a, 10, 64)
	x, err2 := strconv.ParseUint(b, 10, 64)
	return low, x, err1 == nil && err2 == nil && low <= x
}

// lowAt sets the low end of the floors this processor writes for part,
// now that its delivery of the partition begins (again) at base: the low
// end of the partition's stored floor when that floor reaches base (every
// input up to base is then vouched for by the floors before), and base
// itself otherwise: inputs up to base were finished by another holder, or
// before a break in delivery, and no floor says their states hold them.
// Until it knows, this processor writes no floor for part.
func (p *Processor) lowAt(ctx context.Context, part int, base uint64) {
	f := p.floors
	if f == nil || part < 0 || part >= len(f.low) || p.res == nil || p.res.Sessions == nil {
		return
	}
	f.lowKnown[part].Store(false)
	low := base
	e, err := p.res.Sessions.Get(ctx, FloorKey(len(f.low), part))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		p.log.Warn("reading a partition's floor failed; sessions read fresh from the bucket are caught up from the events stream until its next lease", "partition", part, "err", err)
		return
	default:
		if plow, x, ok := parseFloor(e.Value()); ok && x >= base {
			low = plow
		}
	}
	f.low[part].Store(low)
	f.lowKnown[part].Store(true)
}

// lowRaise raises the low end of part's floors to base after a break in
// its delivery: what was delivered before base may have been finished
// elsewhere.
func (p *Processor) lowRaise(part int, base uint64) {
	if f := p.floors; f != nil && part >= 0 && part < len(f.low) {
		raise(&f.low[part], base)
	}
}

// floorWrite is one floor on its way to the bucket.
type floorWrite struct {
	part int
	x    uint64
}

// floorMsgs returns the floors of every partition whose acknowledgements
// moved past the floor last stored, as messages for the bucket, and which
// floors they are; none within floorEvery of the last, unless final.
func (p *Processor) floorMsgs(final bool) ([]*nats.Msg, []floorWrite) {
	f := p.floors
	if f == nil || f.off.Load() {
		return nil, nil
	}
	now := time.Now().UnixNano()
	if !final && now-f.lastAt.Load() < int64(floorEvery) {
		return nil, nil
	}
	f.lastAt.Store(now)
	var msgs []*nats.Msg
	var ws []floorWrite
	for part := range f.finished {
		x := f.finished[part].Load()
		if !f.lowKnown[part].Load() || x == 0 || x <= f.stored[part].Load() {
			continue
		}
		low := f.low[part].Load()
		if x < low {
			continue // released before the partition's last break
		}
		m := nats.NewMsg(KVPrefix(p.cfg.Names().Sessions) + FloorKey(len(f.finished), part))
		m.Data = FloorValue(low, x)
		msgs = append(msgs, m)
		ws = append(ws, floorWrite{part: part, x: x})
	}
	return msgs, ws
}

// floorsStored records floors written and stored.
func (p *Processor) floorsStored(ws []floorWrite) {
	for _, w := range ws {
		raise(&p.floors.stored[w.part], w.x)
	}
	p.count.floorWrites.Add(uint64(len(ws)))
}

// storeFinalFloors stores the floors of what this processor finished, once
// it has drained, so that the partitions' next holders go on from them.
func (p *Processor) storeFinalFloors(ctx context.Context) {
	msgs, ws := p.floorMsgs(true)
	for i, m := range msgs {
		if _, err := p.js.PublishMsg(ctx, m); err != nil {
			p.log.Warn("storing a partition's floor failed", "partition", ws[i].part, "err", err)
			continue
		}
		p.floorsStored(ws[i : i+1])
	}
}

// storedRevs records the stream sequences a group of the writer's was
// stored at. One at or below what an earlier group was stored at means the
// bucket's log went back under the processor: the floors are turned off
// for good, and the floor keys deleted, so that no instance takes a state
// on the word of a floor written before it noticed.
func (g *writeGroup) storedRevs(acks []groupAck) {
	f := g.p.floors
	if f == nil || len(acks) == 0 {
		return
	}
	before := f.maxRev.Load()
	least, most := uint64(0), uint64(0)
	for _, a := range acks {
		if !a.ok {
			continue
		}
		if least == 0 || a.seq < least {
			least = a.seq
		}
		most = max(most, a.seq)
	}
	if most == 0 {
		return
	}
	if least <= before && !f.off.Swap(true) {
		g.p.log.Warn("the session bucket's log went back under the processor (a stream restored or made anew): its states may miss acknowledged inputs; every session read from it is caught up from the events stream until the processor restarts",
			"stored_at", least, "stored_before", before)
		g.deleteFloors()
	}
	raise(&f.maxRev, most)
}

// deleteFloors deletes every partition's floor key, as kv.Delete does.
func (g *writeGroup) deleteFloors() {
	p := g.p
	if p.js == nil {
		return
	}
	for part := range p.floors.stored {
		m := nats.NewMsg(KVPrefix(p.cfg.Names().Sessions) + FloorKey(len(p.floors.stored), part))
		m.Header.Set("KV-Operation", "DEL")
		if _, err := p.js.PublishMsgAsync(m); err != nil {
			p.log.Warn("deleting a partition's floor failed", "partition", part, "err", err)
		}
	}
}

// floored marks every prefetched state of tasks that a floor shows caught
// up, and returns the tasks whose lookups are still to be read.
func (s *shard) floored(tasks []prefetchTask) []prefetchTask {
	out := tasks[:0]
	for _, t := range tasks {
		got, ok := s.pre.states[t.id]
		if ok {
			if x := s.proven(t.id, got, t.part, t.base); x > 0 {
				got.proven = x
				s.pre.states[t.id] = got
				continue
			}
		}
		out = append(out, t)
	}
	return out
}

// proven returns the stream sequence up to which the state got, read for
// the first input in the batch of session id (delivered by part's
// consumer, whose base was base), holds every input of the session (see
// above), or 0 when that is not shown.
func (s *shard) proven(id string, got prefetched, part int, base uint64) uint64 {
	if got.state == nil || !got.byProcessor || !got.floorOK || part < 0 || s.p.floors.off.Load() {
		return 0
	}
	if got.parkRev != 0 && got.parkRev > got.rev {
		return 0
	}
	x := got.floor
	if x < base || x < s.seenPruned[part] || got.state.Seq < got.floorLow {
		return 0
	}
	if seen, ok := s.seen[id]; ok && seen.seq > got.state.Seq {
		return 0
	}
	return x
}

// see records that the shard decided session id's input at seq of part,
// and forgets, once there are many, what stored floors cover.
func (s *shard) see(id string, seq uint64, part int) {
	if part < 0 || s.p.floors == nil || s.p.floors.off.Load() {
		return // no floor is trusted: nothing to remember
	}
	if s.seen == nil {
		s.seen = map[string]floorSeen{}
		s.seenPruned = map[int]uint64{}
	}
	if cur, ok := s.seen[id]; !ok || cur.seq < seq {
		s.seen[id] = floorSeen{seq: seq, part: part}
	}
	if len(s.seen) < max(seenPruneAt, s.seenNext) {
		return
	}
	stored := map[int]uint64{}
	for id, e := range s.seen {
		x, ok := stored[e.part]
		if !ok {
			x = s.p.floors.storedAt(e.part)
			stored[e.part] = x
		}
		if e.seq <= x {
			delete(s.seen, id)
		}
	}
	for part, x := range stored {
		s.seenPruned[part] = max(s.seenPruned[part], x)
	}
	if len(s.seen) > maxSeen {
		// Floors are far behind (few are written under a light load):
		// forget everything, and take no floor short of what was seen.
		for _, e := range s.seen {
			s.seenPruned[e.part] = max(s.seenPruned[e.part], e.seq)
		}
		clear(s.seen)
	}
	s.seenNext = 2 * len(s.seen) // floors behind: not every input
}

// seenPruneAt is how many sessions the shard remembers before it forgets
// those stored floors cover; past maxSeen it forgets them all.
const (
	seenPruneAt = 4096
	maxSeen     = 1 << 16
)
