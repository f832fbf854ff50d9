package processor

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// ackWindow is what one consumer delivered and has not had acknowledged,
// and decides which acknowledgements to send.
//
// A partition's consumer acknowledges with AckAll: one ack of stream
// sequence s acknowledges every message of the consumer up to s. That is one
// ack per batch instead of one per message, which is most of what the broker
// spends on a message, but it means an ack may go out only once every input
// up to it is finished: its effects durable, or it was found applied before.
// The shards finish inputs in any order, so the window keeps the inputs in
// stream order and releases the longest finished prefix.
//
// The window must know every input the server holds pending for the
// consumer up to the highest it delivered here, or an ack could cover one
// nobody applied. Inputs delivered elsewhere (before a restart, or while
// another instance held the partition) enter as placeholders (see hold),
// finished when their session has caught up past them; an ack is only ever
// sent through a message delivered here, the last finished one of the
// prefix.
//
// The consumer of events that name no session acknowledges explicitly
// (explicit is set): each input is acknowledged as soon as it is finished.
//
// Safe for concurrent use: the fetcher adds, the shards finish and release.
type ackWindow struct {
	mu       sync.Mutex
	explicit bool
	// finished, if set, is raised to the last input each release
	// acknowledges: every input up to it is finished (floor.go).
	finished *atomic.Uint64
	q        []pendingInput // sorted by seq from head on
	head     int
	ready    []ackAction // explicit: finished, not yet released
}

// pendingInput is one input of the window.
type pendingInput struct {
	seq  uint64
	msg  jetstream.Msg // nil for a placeholder
	done bool
	term string // finished as rejected: terminate with this reason
}

// ackAction is one acknowledgement to send: Ack, or TermWithReason when
// term is set.
type ackAction struct {
	msg  jetstream.Msg
	term string
}

// send acknowledges or terminates.
func (a ackAction) send() error {
	if a.term != "" {
		return a.msg.TermWithReason(a.term)
	}
	return a.msg.Ack()
}

// find returns the index of seq in q[head:] and whether it is there.
func (w *ackWindow) find(seq uint64) (int, bool) {
	i, ok := slices.BinarySearchFunc(w.q[w.head:], seq, func(p pendingInput, s uint64) int {
		switch {
		case p.seq < s:
			return -1
		case p.seq > s:
			return 1
		}
		return 0
	})
	return w.head + i, ok
}

// insert puts p in order; an input already there takes p's message (a
// redelivery: the newest delivery is the one to acknowledge) and is
// unfinished again unless p is a placeholder.
func (w *ackWindow) insert(p pendingInput) {
	if n := len(w.q); n == w.head || w.q[n-1].seq < p.seq {
		w.q = append(w.q, p)
		return
	}
	i, ok := w.find(p.seq)
	if ok {
		if p.msg != nil {
			w.q[i].msg, w.q[i].done, w.q[i].term = p.msg, false, ""
		}
		return
	}
	if i == w.head && w.head > 0 {
		w.head--
		w.q[w.head] = p
		return
	}
	w.q = slices.Insert(w.q, i, p)
}

// add records a delivery here of stream sequence seq.
func (w *ackWindow) add(seq uint64, msg jetstream.Msg) {
	if w.explicit {
		return
	}
	w.mu.Lock()
	w.insert(pendingInput{seq: seq, msg: msg})
	w.mu.Unlock()
}

// hold records stream sequence seq as pending here although it was
// delivered elsewhere: no ack may cover it until it is finished.
func (w *ackWindow) hold(seq uint64) {
	if w.explicit {
		return
	}
	w.mu.Lock()
	w.insert(pendingInput{seq: seq})
	w.mu.Unlock()
}

// finish marks the input seq (delivered as msg) done: its effects are
// durable. A non-empty term terminates it rather than acknowledging it.
// Nothing is sent until release.
func (w *ackWindow) finish(seq uint64, msg jetstream.Msg, term string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.explicit {
		w.ready = append(w.ready, ackAction{msg: msg, term: term})
		return
	}
	if i, ok := w.find(seq); ok {
		w.q[i].done, w.q[i].term = true, term
	}
}

// prune forgets every input at or below floor, the consumer's ack floor on
// the server: those are acknowledged, by whichever instance.
func (w *ackWindow) prune(floor uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.head < len(w.q) && w.q[w.head].seq <= floor {
		w.q[w.head] = pendingInput{}
		w.head++
	}
	w.compact()
}

// release returns the acknowledgements to send now, in stream order: the
// finished prefix up to its last input delivered here, each rejected input in
// it terminated (which, under AckAll, acknowledges everything before it too)
// and the last acknowledged unless it was just terminated. Finished
// placeholders after that input wait for a later one.
func (w *ackWindow) release() []ackAction {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.explicit {
		out := w.ready
		w.ready = nil
		return out
	}
	end := w.head // one past the last finished input delivered here
	for i := w.head; i < len(w.q) && w.q[i].done; i++ {
		if w.q[i].msg != nil {
			end = i + 1
		}
	}
	if end == w.head {
		return nil
	}
	var out []ackAction
	for i := w.head; i < end; i++ {
		if p := w.q[i]; p.msg != nil && p.term != "" {
			out = append(out, ackAction{msg: p.msg, term: p.term})
		}
	}
	if last := w.q[end-1]; last.term == "" {
		out = append(out, ackAction{msg: last.msg})
	}
	if w.finished != nil {
		raise(w.finished, w.q[end-1].seq)
	}
	clear(w.q[w.head:end])
	w.head = end
	w.compact()
	return out
}

// compact reclaims the released front once it is most of the slice.
func (w *ackWindow) compact() {
	if w.head == len(w.q) {
		w.q, w.head = w.q[:0], 0
		return
	}
	if w.head > 64 && w.head*2 > len(w.q) {
		n := copy(w.q, w.q[w.head:])
		clear(w.q[n:])
		w.q, w.head = w.q[:n], 0
	}
}

// blocked reports whether the window holds an input that holds back the
// acks of those after it: an unfinished one before any finished input
// delivered here. Finished placeholders ahead of it release nothing on
// their own (there is no delivery of theirs to acknowledge), so they do
// not unblock it.
func (w *ackWindow) blocked() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.q[w.head:] {
		switch {
		case !p.done:
			return true
		case p.msg != nil:
			return false
		}
	}
	return false
}

// pending is the number of inputs in the window (tests, stats).
func (w *ackWindow) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.q) - w.head + len(w.ready)
}
