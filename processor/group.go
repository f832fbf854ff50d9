package processor

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds group commit: one writer per processor and stream kind
// (verdicts, session states) takes the writes every shard hands over and
// writes them, so that the writes of many shard batches become one atomic
// batch.
//
// A server that syncs every write stores a stream's messages one at a time,
// an fsync each, and an atomic batch with a few fsyncs for all of it; a
// batch is worth it from minAtomicBatch writes on. A shard's batch seldom
// holds that many verdicts or touches that many sessions when a
// partition's sessions are spread over eight shards, so each shard alone
// would write one message at a time. The writer gathers instead: while it
// writes one group, the writes shards hand over wait, and the next group
// is everything that waited. An idle writer takes a shard's writes at once
// (nothing waits for a timer); a busy one makes groups as large as the
// load, which is when fsyncs bound the rate.
//
// What is written, and when an input is acknowledged, does not change: a
// group is written as one atomic batch when it holds minAtomicBatch
// messages or more (all or nothing: a compare-and-swap or a dedupe check
// that fails refuses the whole batch), and otherwise, and for whatever such
// a batch did not commit, each message on its own, all at once. Every
// write is answered; the shard settles whatever was not plainly stored as
// it did before groups (store for a state, publish and confirm for a
// verdict). A shard's sessions belong to it alone, so a group never holds
// two writes of one key. A shard's verdicts that must be confirmed in
// order (a spill's announcement before what follows it) are written by the
// writer only in an atomic batch, never one by one.

// maxGroupWait bounds how long a shard waits for the writer to answer: the
// writer's own writes are bounded by pubAckWait each. A shard that stops
// waiting settles the writes itself while the writer may still be writing
// them: a message handed to the writer is read, never changed, by both.
var maxGroupWait = 3 * pubAckWait

// groupQueue is how many shards' writes may wait for a writer at once.
const groupQueue = 64

// writeGroup is the processor's writer of one kind of write.
type writeGroup struct {
	p      *Processor
	states bool // session states, else verdicts
	in     chan *groupReq
}

// groupReq is one shard's writes, and where their outcome goes.
type groupReq struct {
	msgs []*nats.Msg
	// ordered: not to be written one by one here (see above).
	ordered bool
	done    chan []groupAck // buffered: the writer never waits for a shard
}

// groupAck is the outcome of one write: the stream sequence it is stored
// at (a state's revision), or ok false when it is not known to be stored.
type groupAck struct {
	seq uint64
	ok  bool
}

// newWriteGroup returns a writer of states or verdicts; run starts it.
func newWriteGroup(p *Processor, states bool) *writeGroup {
	return &writeGroup{p: p, states: states, in: make(chan *groupReq, groupQueue)}
}

// run writes the groups handed over until ctx ends; it must end only after
// every shard has (a shard waits for its answer).
func (g *writeGroup) run(ctx context.Context) {
	for {
		var first *groupReq
		select {
		case first = <-g.in:
		case <-ctx.Done():
			return
		}
		reqs, n := []*groupReq{first}, len(first.msgs)
	gather:
		for n < maxAtomicBatch {
			select {
			case r := <-g.in:
				reqs = append(reqs, r)
				n += len(r.msgs)
			default:
				break gather
			}
		}
		g.write(ctx, reqs, n)
	}
}

// submit hands msgs to the writer and returns the outcome of each. Without
// a running writer (nil g), the caller's goroutine writes them.
func (g *writeGroup) submit(ctx context.Context, p *Processor, states, ordered bool, msgs []*nats.Msg) []groupAck {
	return g.send(ctx, p, states, ordered, msgs).wait(ctx)
}

// groupTicket is writes handed to a writer whose outcome is not read yet.
type groupTicket struct {
	r        *groupReq
	deadline time.Time // when the shard stops waiting for the answer
	failed   bool      // never handed over: nothing is known stored
}

// send hands msgs to the writer and returns at once; the ticket's wait
// returns their outcome. Without a running writer (nil g), the caller's
// goroutine writes them before send returns.
func (g *writeGroup) send(ctx context.Context, p *Processor, states, ordered bool, msgs []*nats.Msg) *groupTicket {
	r := &groupReq{msgs: msgs, ordered: ordered, done: make(chan []groupAck, 1)}
	t := &groupTicket{r: r, deadline: time.Now().Add(maxGroupWait)}
	if g == nil {
		(&writeGroup{p: p, states: states}).write(ctx, []*groupReq{r}, len(msgs))
		return t
	}
	select {
	case g.in <- r:
		return t
	default:
	}
	timer := time.NewTimer(maxGroupWait)
	defer timer.Stop()
	select {
	case g.in <- r:
	case <-ctx.Done():
		t.failed = true
	case <-timer.C:
		t.failed = true
	}
	return t
}

// wait returns the outcome of each of the ticket's writes. One not known
// stored (ok false) is settled by the shard (the writer may still write
// it; a state's compare-and-swap and a verdict's id make that safe).
func (t *groupTicket) wait(ctx context.Context) []groupAck {
	if t.failed {
		return make([]groupAck, len(t.r.msgs))
	}
	select {
	case acks := <-t.r.done:
		return acks
	default:
	}
	timer := time.NewTimer(time.Until(t.deadline))
	defer timer.Stop()
	select {
	case acks := <-t.r.done:
		return acks
	case <-ctx.Done():
	case <-timer.C:
	}
	return make([]groupAck, len(t.r.msgs))
}

// write writes the n messages of reqs, as one atomic batch where it is
// worth one, and answers each request.
func (g *writeGroup) write(ctx context.Context, reqs []*groupReq, n int) {
	p := g.p
	msgs := make([]*nats.Msg, 0, n)
	for _, r := range reqs {
		msgs = append(msgs, r.msgs...)
	}
	acks := make([]groupAck, n)
	done := 0
	// A group of states large enough carries the floors of the partitions
	// whose acknowledgements moved on: they cover states stored before
	// this group (floor.go), so anywhere in it will do, and a floor not
	// stored is only written again with a later group.
	var floorMsgs []*nats.Msg
	var floors []floorWrite
	if g.states && n >= floorMinGroup {
		floorMsgs, floors = p.floorMsgs(false)
	}
	if n >= minAtomicBatch && p.batches.on(g.states) {
		seqs, err := p.batches.write(ctx, g.states, append(msgs, floorMsgs...))
		if len(seqs) == n+len(floorMsgs) && len(floors) > 0 {
			p.floorsStored(floors)
		}
		floorMsgs = nil
		seqs = seqs[:min(len(seqs), n)]
		for k, seq := range seqs {
			acks[k] = groupAck{seq: seq, ok: true}
		}
		done = len(seqs)
		if err != nil {
			p.log.Debug("an atomic batch did not commit; writing its messages one by one", "states", g.states, "messages", n-done, "err", err)
		}
	}
	// One by one: what no batch stored, but an ordered request's writes.
	var each []*nats.Msg
	var at []int
	k := 0
	for _, r := range reqs {
		for range r.msgs {
			if k >= done && !r.ordered {
				each = append(each, msgs[k])
				at = append(at, k)
			}
			k++
		}
	}
	got := make([]groupAck, len(each)+len(floorMsgs))
	p.sendEach(ctx, append(each, floorMsgs...), got)
	for i, a := range got[:len(each)] {
		acks[at[i]] = a
	}
	if len(floorMsgs) > 0 {
		stored := floors[:0]
		for i, a := range got[len(each):] {
			if a.ok {
				stored = append(stored, floors[i])
			}
		}
		p.floorsStored(stored)
	}
	if g.states && g.in != nil {
		// The running writer's groups are stored one after another.
		g.storedRevs(acks)
	}
	k = 0
	for _, r := range reqs {
		r.done <- acks[k : k+len(r.msgs)]
		k += len(r.msgs)
	}
}

// sendEach publishes each of msgs on its own, all at once, and waits for
// their acks (at most pubAckWait in all), recording each in acks.
func (p *Processor) sendEach(ctx context.Context, msgs []*nats.Msg, acks []groupAck) {
	if len(msgs) == 0 {
		return
	}
	fs := make([]jetstream.PubAckFuture, len(msgs))
	for k, m := range msgs {
		if f, err := p.js.PublishMsgAsync(m); err == nil {
			fs[k] = f
		}
	}
	t := time.NewTimer(pubAckWait)
	defer t.Stop()
	for k, f := range fs {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			acks[k] = groupAck{seq: ack.Sequence, ok: true}
		case <-f.Err():
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
