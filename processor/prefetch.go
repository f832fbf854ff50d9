package processor

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// This file holds the batch's prefetch: the reads a shard would make one
// after another while deciding a batch, made at once before it begins.
//
// A fleet's batch mostly holds sessions the shard does not have in memory,
// each read from the bucket and caught up from the events stream: two or
// three lookups per input, each a round trip, one after another. The
// prefetch reads every state of the batch in one request (multiget.go),
// sends each session's first lookup as a direct get (direct.go), then the
// rest concurrently, and keeps the answers; the batch
// then decides exactly as before, taking an answer from the prefetch where
// there is one and asking the server where there is not (a failed
// prefetch is only asked again, with the batch's retries).
//
// The answers are as good as the ones the batch would get: a state read
// early is checked by the compare-and-swap that stores the session, like
// any state read; and a lookup made after the batch was fetched sees every
// message any catch-up of the batch reads, since none reads past a message
// delivered before the batch began (its horizon, or an input the shard
// left undecided earlier).

// prefetchConcurrency bounds a shard's prefetch lookups in flight.
const prefetchConcurrency = 32

// lookupKey names one lookup of the events stream: the first message at or
// after seq whose subject matches filter.
type lookupKey struct {
	filter string
	seq    uint64
}

// span is the answer to a lookup from seq from: msg, or nil when there was
// none. It answers every lookup of the same filter from a sequence between
// from and msg's (or any beyond from when msg is nil: the batch reads no
// further than what the stream held when it was asked, see above).
type span struct {
	from uint64
	msg  *jetstream.RawStreamMsg
	// position: msg holds its subject and sequence only (probe.go).
	position bool
}

// prefetched is what the prefetch read of one session's stored state.
type prefetched struct {
	rev   uint64 // the state's revision in the bucket (or its deletion's)
	state *State // nil: no state stored
	// What the same view of the bucket held besides (floor.go): the
	// floor of the session's partition and its low end (floorOK: there
	// is one), the revision of its park record or of the record's
	// deletion (0: none), and whether the state carries StateHeader.
	floor       uint64
	floorLow    uint64
	floorOK     bool
	parkRev     uint64
	byProcessor bool
	// proven is what the floor showed the state caught up to (0: not
	// shown, it is caught up from the stream).
	proven uint64
}

// prefetch holds a batch's answers. The shard's goroutine reads it once
// the prefetch has ended, and clears it when the batch ends.
type prefetch struct {
	states  map[string]prefetched
	lookups map[string][]span // by filter
	// control, when not nil, names every session with a message on its
	// control subject up to control.upTo; the others' catch-ups up to
	// there need not look at that subject.
	control *controlled
}

func (pf *prefetch) clear() {
	clear(pf.states)
	clear(pf.lookups)
	pf.control = nil
}

// noControl reports whether session id is known to have no message on its
// control subject at or below stream sequence limit.
func (pf *prefetch) noControl(id string, limit uint64) bool {
	return pf != nil && pf.control != nil && limit <= pf.control.upTo && !pf.control.ids[id]
}

// controlled is what the events stream held on control subjects (operators'
// resumes, rare) when it was asked: every session with a message there
// stored at or below upTo is in ids.
type controlled struct {
	upTo uint64
	ids  map[string]bool
}

// controlCache is the processor's latest answer of which sessions have
// messages on their control subject, shared by its shards: a batch whose
// catch-ups read no further than what it covers uses it as it is.
type controlCache struct {
	mu   sync.Mutex // held while asking the stream: one question at a time
	last *controlled
}

// readControlled makes known which sessions have any message on their
// control subject at or below stream sequence need, from the processor's
// cache when it covers need, or else by asking the events stream (once for
// the processor: shards that need it meanwhile wait for its answer). A
// session not named then needs no control lookup in catch-ups up to the
// sequence known: the check that a state read is not behind the stream
// costs one lookup, of its events subject. On failure nothing is known,
// and every catch-up looks at both subjects.
func (s *shard) readControlled(ctx context.Context, need uint64) {
	c := &s.p.control
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && c.last.upTo >= need {
		s.pre.control = c.last
		return
	}
	info, err := s.p.res.Events.Info(ctx, jetstream.WithSubjectFilter(s.p.subj.StoredControlFilter()))
	if err != nil {
		return
	}
	// The server counts subjects after it reads the last sequence: every
	// message at or below it is counted.
	got := &controlled{upTo: info.State.LastSeq, ids: make(map[string]bool, len(info.State.Subjects))}
	for subj := range info.State.Subjects {
		if id, ok := s.p.subj.ControlSession(subj); ok {
			got.ids[id] = true
		}
	}
	c.last = got
	s.pre.control = got
}

// state takes the prefetched state of session id, once.
func (pf *prefetch) state(id string) (prefetched, bool) {
	st, ok := pf.states[id]
	if ok {
		delete(pf.states, id)
	}
	return st, ok
}

// lookup returns the prefetched answer of a lookup, if there is one, and
// whether it is a message's position only (probe.go).
func (pf *prefetch) lookup(k lookupKey) (msg *jetstream.RawStreamMsg, position, ok bool) {
	if pf == nil {
		return nil, false, false
	}
	for _, sp := range pf.lookups[k.filter] {
		if k.seq >= sp.from && (sp.msg == nil || k.seq <= sp.msg.Sequence) {
			return sp.msg, sp.position, true
		}
	}
	return nil, false, false
}

// prefetchTask is the reading of one session: its state, then the
// lookups its catch-ups will make.
type prefetchTask struct {
	id string
	// at is the stream sequence of the session's only input in the batch,
	// 0 when it has several (then only the first catch-up is prefetched).
	at uint64
	// h is the horizon the session catches up to (shard.horizon).
	h uint64
	// part and base are those of its first input (delivery).
	part int
	base uint64
}

// fill reads, concurrently, the state and catch-up lookups of every
// session of batch that the shard will have to read, and returns when
// all are answered or have failed.
func (s *shard) fill(ctx context.Context, batch []delivery) {
	pf := &s.pre
	pf.clear()
	tasks := s.prefetchTasks(batch)
	if len(tasks) == 0 {
		return
	}
	if pf.states == nil {
		pf.states = make(map[string]prefetched, len(tasks))
		pf.lookups = make(map[string][]span, 2*len(tasks))
	}
	s.prefetchStates(ctx, tasks)
	// A state its partition's floor shows caught up needs no lookup
	// (floor.go); the others' lookups follow.
	if tasks = s.floored(tasks); len(tasks) == 0 {
		return
	}
	var need uint64
	for _, t := range tasks {
		need = max(need, t.h, t.at)
	}
	s.readControlled(ctx, need)
	s.directLookups(ctx, tasks)
	f := &filler{s: s, ctx: ctx, pf: pf}
	var wg sync.WaitGroup
	sem := make(chan struct{}, prefetchConcurrency)
	for _, t := range tasks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f.read(t)
		}()
	}
	wg.Wait()
}

// prefetchTasks lists the sessions of batch the shard will have to read:
// those not in memory, or not current there.
func (s *shard) prefetchTasks(batch []delivery) []prefetchTask {
	var tasks []prefetchTask
	index := map[string]int{}
	for _, d := range batch {
		if d.mark != nil || d.meta == nil {
			continue
		}
		id := d.sid
		if id == "" {
			continue
		}
		if i, ok := index[id]; ok {
			tasks[i].at = 0
			tasks[i].h = max(tasks[i].h, s.horizon(id, d), d.meta.Sequence.Stream)
			continue
		}
		if sess := s.sessions[id]; sess != nil && sess.loaded >= d.horizon && sess.epoch == d.epoch {
			continue // in memory and current: load keeps it
		}
		index[id] = len(tasks)
		tasks = append(tasks, prefetchTask{id: id, at: d.meta.Sequence.Stream, h: s.horizon(id, d), part: d.part, base: d.base})
	}
	return tasks
}

// prefetchStates reads the stored states of tasks in one request (multiget.go)
// into the prefetch; on failure each is read on its own by the lookups.
func (s *shard) prefetchStates(ctx context.Context, tasks []prefetchTask) {
	if len(tasks) < 2 || s.p.multiGetOff.Load() {
		return
	}
	ids := make([]string, len(tasks))
	parts := make([]int, len(tasks))
	for i, t := range tasks {
		ids[i], parts[i] = t.id, t.part
	}
	got, err := s.p.readStates(ctx, s.p.readConn(s.index), ids, parts)
	if err == nil {
		s.pre.states = got
		return
	}
	if ctx.Err() == nil && !s.p.multiGetOff.Swap(true) {
		// Most likely an identity that may not make the request (no
		// answer comes): every batch would wait for it.
		s.p.log.Warn("reading a batch's states in one request failed; reading each on its own from now on (the processor's identity needs publish on $JS.API.DIRECT.GET.<bucket stream>)", "sessions", len(ids), "err", err)
	}
}

// filler is one batch's prefetch while its reads are in flight: they
// share the prefetch under mu.
type filler struct {
	s   *shard
	ctx context.Context
	pf  *prefetch
	mu  sync.Mutex
}

// read reads session t's state, unless the batch read already has it, and
// the lookups its catch-ups will make.
func (f *filler) read(t prefetchTask) {
	got, ok := f.state(t.id)
	if !ok {
		return // asked again by the batch, with its retries
	}
	from := uint64(1)
	if got.state != nil {
		from = got.state.Seq + 1
	}
	// A catch-up of the batch applies a message found here only up to the
	// session's horizon, never its one input itself (delivered to be
	// decided), so that one is read for its position only; with several
	// inputs, all is read whole.
	want := func(seq uint64) bool {
		return t.at == 0 || seq != t.at && seq <= max(t.h, t.at)
	}
	for i, filter := range f.s.p.subj.SessionFilters(t.id) {
		if filter == "" || i == 1 && f.pf.noControl(t.id, max(t.h, t.at)) {
			continue
		}
		raw, ok := f.known(lookupKey{filter: filter, seq: from})
		if !ok {
			raw, ok = f.lookup(lookupKey{filter: filter, seq: from}, want)
		}
		// The session's events filter (the first) finds its input of this
		// batch: the catch-up after it looks past it, when its horizon is
		// past it.
		if ok && i == 0 && t.at != 0 && t.h > t.at && raw != nil && raw.Sequence == t.at {
			f.lookup(lookupKey{filter: filter, seq: t.at + 1}, want)
		}
	}
}

// state returns session id's prefetched state, reading it from the bucket
// when the batch read did not; false when it could not be read.
func (f *filler) state(id string) (prefetched, bool) {
	f.mu.Lock()
	got, ok := f.pf.states[id]
	f.mu.Unlock()
	if ok {
		return got, true
	}
	p := f.s.p
	p.count.readAhead.Add(1)
	e, err := p.res.Sessions.Get(f.ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return prefetched{}, false
	default:
		st, err := UnmarshalState(e.Value())
		if err != nil {
			return prefetched{}, false // read says what is wrong with it
		}
		got = prefetched{rev: e.Revision(), state: &st}
	}
	f.mu.Lock()
	f.pf.states[id] = got
	f.mu.Unlock()
	return got, true
}

// known returns the answer of k the prefetch has already (direct.go).
func (f *filler) known(k lookupKey) (*jetstream.RawStreamMsg, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw, _, ok := f.pf.lookup(k)
	return raw, ok
}

// lookup reads the answer of k, whole when want says a catch-up of the
// batch may apply the message found, and keeps it in the prefetch.
func (f *filler) lookup(k lookupKey, want func(uint64) bool) (*jetstream.RawStreamMsg, bool) {
	f.s.p.count.readAhead.Add(1)
	raw, position, err := f.s.p.findNext(f.ctx, k.seq, k.filter, want)
	if err != nil {
		return nil, false // asked again by the batch, with its retries
	}
	f.mu.Lock()
	f.pf.lookups[k.filter] = append(f.pf.lookups[k.filter], span{from: k.seq, msg: raw, position: position})
	f.mu.Unlock()
	return raw, true
}
