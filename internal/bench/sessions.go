package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/heapwatch"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
)

// SessionsResult is what many live sessions cost: at each number of live
// sessions, seamguard's events per second on events spread over them, and
// three raw JetStream anchors measured on the same server at the same key
// count, in the same run.
type SessionsResult struct {
	// Where the server ran: when "in process", RSS includes the server's
	// own memory and says little about the processor's.
	Server string `json:"server"`
	// Sync is the setting every figure was measured under; Populate the
	// one the sessions and events were written under before (the server
	// restarts in between, on the same storage).
	Sync     string         `json:"sync"`
	Populate string         `json:"populate_sync"`
	Sizes    []SessionsSize `json:"sizes"`
	// Memory of the processor of the largest size, after its round: RSS
	// of this process and Go heap, per session it held.
	RSSBase        uint64  `json:"rss_base_bytes"`
	RSSAfter       uint64  `json:"rss_after_bytes"`
	RSSPeak        uint64  `json:"rss_peak_bytes"` // VmHWM: includes the publisher's buffers
	RSSPerSession  float64 `json:"rss_per_session_bytes"`
	HeapPerSession float64 `json:"heap_per_session_bytes"` // Go heap in use, after a GC
	// Snapshot bytes in the session bucket per session, at the end.
	SnapshotBytes float64 `json:"snapshot_bytes_per_session"`
	// MaxSessions is the processor's cap on sessions in memory; Held is how
	// many the last processor held at the end, Dropped how many left memory
	// past the cap.
	MaxSessions int    `json:"max_sessions"`
	Held        int    `json:"held_sessions"`
	Dropped     uint64 `json:"dropped_sessions"`
	// LazySync is the setting of the lazy run at the largest size (see
	// SessionsSize.LazyPerSec); LazySkipped says why there was none.
	LazySync    string `json:"lazy_sync,omitempty"`
	LazySkipped string `json:"lazy_skipped,omitempty"`
	// Recovery is the crash of the server and the processor at the
	// largest size, and how long until an event is decided again.
	Recovery *Recovery `json:"recovery,omitempty"`
}

// Recovery is a crash of both the server and the processor while the
// processor runs idle at the largest size: the server's child process is
// killed (SIGKILL) and the processor aborted. The server then starts again
// on the same storage (the run's sync setting), a fresh processor starts
// with one turn of a live session waiting, and the turn is decided.
type Recovery struct {
	// Skipped says why there was no crash (the server is not the bench's
	// child process); every figure is then 0.
	Skipped  string `json:"skipped,omitempty"`
	Sessions int    `json:"sessions"` // live sessions in the bucket
	Sync     string `json:"sync"`
	// ServerRestart is from starting the server again until JetStream
	// answers (account info and the events stream's info).
	ServerRestart float64 `json:"server_restart_seconds"`
	// FirstDecision is from the fresh processor's start (processor.New)
	// until the waiting turn is decided and acknowledged (its partition
	// consumer's ack floor reaches it).
	FirstDecision float64 `json:"first_decision_seconds"`
	// Total is ServerRestart plus FirstDecision: recovery after SIGKILL,
	// time to the first decision.
	Total float64 `json:"total_seconds"`
	// LeaseTaken is from the fresh processor's start until it took the
	// lease of the turn's partition: the crashed instance's lease must
	// expire first (LeaseTTL after its last renewal).
	LeaseTaken float64 `json:"lease_taken_seconds"`
	LeaseTTL   float64 `json:"lease_ttl_seconds"`
}

// SessionsSize is one number of live sessions: seamguard and the raw
// anchors on Events events, one each for as many distinct sessions, in a
// shuffled order of all of them.
type SessionsSize struct {
	Sessions int `json:"sessions"` // live: opened, with a state in the bucket
	Events   int `json:"events"`
	// NewKeysPerSec is how fast the raw bucket took the new keys of this
	// size (pipelined puts, under the populate setting): a reference only.
	NewKeysPerSec float64 `json:"new_keys_per_sec"`
	// Seamguard: a processor started with no session in memory decides
	// the events (each reads its session's state, catches it up, steps it
	// and stores it with compare-and-swap), until every one is acked.
	SeamguardPerSec float64 `json:"seamguard_per_sec"`
	// Put: the raw bucket of as many keys takes an update of as many
	// existing keys, pipelined (async puts, 4,096 in flight).
	PutPerSec float64 `json:"raw_put_per_sec"`
	// CAS: the same keys again, each a compare-and-set on its revision
	// (what kv.Update sends, and the processor's state write), pipelined.
	CASPerSec float64 `json:"raw_cas_per_sec"`
	// Consume: one durable pull consumer reads the very events seamguard
	// decided, fetching as the processor does and acknowledging each batch
	// by its last message (AckAll, as the processor's partitions do).
	ConsumePerSec float64 `json:"raw_consume_per_sec"`
	// Get: the raw bucket's keys of the same sessions, in the same order,
	// each read once (kv.Get, 64 at a time), before the raw writes touch
	// them: what reading a state the processor does not hold costs the
	// server at this key count. A reference, not an anchor: seamguard
	// reads each state once too, and the writes bound it first.
	GetPerSec float64 `json:"raw_get_per_sec"`
	// Lowest names the lowest anchor; Ratio is seamguard over it.
	Lowest string  `json:"lowest_anchor"`
	Ratio  float64 `json:"ratio"`
	// CASRatio is seamguard over the raw CAS updates.
	CASRatio float64 `json:"cas_ratio"`
	// PerMessage: a processor with Config.NoAtomicBatches (every verdict
	// and state written as a message of its own), started likewise with
	// no session in memory, decides as many events of sessions no other
	// run of this size touches, published and then the server restarted
	// as for seamguard's. AtomicOverPerMessage is seamguard over it.
	PerMessagePerSec     float64 `json:"per_message_per_sec"`
	AtomicOverPerMessage float64 `json:"atomic_over_per_message"`
	// Lazy (the largest size only, when the run syncs always on a server
	// of its own): the server restarted on the same storage syncing every
	// 2 minutes, and a processor with the defaults deciding as many events
	// of other fresh sessions. LazyRatio is seamguard (always) over it.
	LazyPerSec float64 `json:"lazy_per_sec,omitempty"`
	LazyRatio  float64 `json:"lazy_ratio,omitempty"`
	// The seamguard processor's atomic batches (see processor.Stats).
	AtomicBatches  uint64 `json:"atomic_batches"`
	BatchedWrites  uint64 `json:"batched_writes"`
	BatchFallbacks uint64 `json:"batch_fallbacks"`
	// Floored is how many of seamguard's states read fresh their
	// partition's floor showed caught up (processor.Stats.Floored).
	Floored uint64 `json:"floored"`
	// FloorWrites is how many floors seamguard's run stored besides.
	FloorWrites uint64 `json:"floor_writes"`
	// Snapshot writes per event (one per event here: no two events of a
	// session share a batch).
	WritesPerEvent float64 `json:"snapshot_writes_per_event"`
	Seamguard      Usage   `json:"seamguard_usage"`
	Put            Usage   `json:"raw_put_usage"`
	CAS            Usage   `json:"raw_cas_usage"`
	Consume        Usage   `json:"raw_consume_usage"`
	PerMessage     Usage   `json:"per_message_usage"`
	Lazy           *Usage  `json:"lazy_usage,omitempty"`
}

// anchors returns the raw figures of z by name.
func (z SessionsSize) anchors() []struct {
	name string
	v    float64
} {
	return []struct {
		name string
		v    float64
	}{{"raw KV CAS updates", z.CASPerSec}, {"raw KV puts", z.PutPerSec}, {"raw consume", z.ConsumePerSec}}
}

// populateSync is how the server syncs while sessions and events are
// written ahead of a measurement, when the run's setting is always: setup,
// not measured, and at a fsync per write a million keys would take most of
// an hour.
const populateSync = 2 * time.Minute

// sessionsRun is one sessions measurement: its server (restarted between
// populating and measuring), the processor's configuration and the state of
// the workload so far.
type sessionsRun struct {
	cfg      Config
	dir      string
	srv      *server
	pcfg     processor.Config
	rawKV    string // bucket of the raw anchors
	gen      *gen
	heads    []uint32 // each session's next turn offset
	rawRevs  []uint64 // each raw key's revision
	rawVal   []byte   // what the raw anchors write: a session state's size
	live     int
	progress func(string, ...any)
}

// restart stops the server and starts it again on the same storage,
// syncing as sync says (with cfg.URL it stays as it is).
func (r *sessionsRun) restart(sync time.Duration) error {
	if r.cfg.URL != "" && r.srv != nil {
		return nil
	}
	if r.srv != nil {
		r.srv.close()
		r.srv = nil
	}
	c := r.cfg
	c.SyncInterval = sync
	s, err := startServer(c, r.dir)
	if err != nil {
		return err
	}
	r.srv = s
	return nil
}

func runSessions(ctx context.Context, cfg Config, dir string, sizes []int, perSize int, heapProfile, cpuProfile string, progress func(string, ...any)) (res *SessionsResult, err error) {
	r := &sessionsRun{cfg: cfg, dir: dir, pcfg: benchProcessorConfig("benchs"), rawKV: "benchs-raw", gen: newGen(benchProcessorConfig("benchs").Subjects(), Seed+2), progress: progress}
	defer func() {
		if r.srv != nil {
			dropResources(context.WithoutCancel(ctx), r.srv.js, r.pcfg)
			_ = r.srv.js.DeleteKeyValue(context.WithoutCancel(ctx), r.rawKV)
			r.srv.close()
		}
	}()
	pop := populateSync
	if cfg.SyncInterval > 0 {
		pop = cfg.SyncInterval
	}
	if err := r.restart(pop); err != nil {
		return nil, err
	}
	res = &SessionsResult{Server: r.srv.mode, Sync: syncName(cfg), Populate: pop.String()}
	if cfg.URL != "" {
		res.Populate = "as configured"
	}
	if _, err := processor.Provision(ctx, r.srv.js, r.pcfg); err != nil {
		return nil, err
	}
	if _, err := createConsumers(ctx, r.srv.js, r.pcfg); err != nil {
		return nil, err
	}
	if _, err := r.srv.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: r.rawKV, History: 1, Storage: jetstream.FileStorage}); err != nil {
		return nil, err
	}
	maxN := sizes[len(sizes)-1]
	r.heads = make([]uint32, maxN)
	r.rawRevs = make([]uint64, maxN)
	if r.rawVal, err = r.stateSize(); err != nil {
		return nil, err
	}
	lazy := cfg.URL == "" && cfg.SyncInterval == 0
	switch {
	case cfg.URL != "":
		res.LazySkipped = "the server is not the bench's own (--nats-url): it syncs as configured"
	case !lazy:
		res.LazySkipped = fmt.Sprintf("the run is already lazy (sync every %s)", cfg.SyncInterval)
	default:
		res.LazySync = lazySync.String()
	}
	for i, n := range sizes {
		last := i == len(sizes)-1
		// Each run decides events of sessions of its own: seamguard,
		// per-message writes, and at the largest size the lazy run.
		runs := 2
		if last && lazy {
			runs = 3
		}
		m := min(perSize, n/runs)
		z := SessionsSize{Sessions: n, Events: m}
		if cfg.URL == "" && i > 0 {
			if err := r.restart(pop); err != nil {
				return res, err
			}
		}
		if z.NewKeysPerSec, err = r.grow(ctx, n); err != nil {
			return res, err
		}
		perm := rand.New(rand.NewPCG(Seed+3, uint64(n))).Perm(n)
		order := perm[:m]
		// The memory before the round is taken before its events are
		// published: settling it hands the heap back to the system, and
		// the publishing, not the timed round, then grows it again (in
		// process, where the heap is the server's too, a round started
		// right after ran at about 0.6 of one that was not).
		var rssBase, heapBase uint64
		if last {
			rssBase, _ = settledMemory()
			heapBase = heapwatch.InUse()
		}
		first, err := r.publishRound(ctx, order)
		if err != nil {
			return res, err
		}
		if err := r.restart(cfg.SyncInterval); err != nil {
			return res, err
		}
		js := r.srv.js

		// seamguard
		kvStream, err := js.Stream(ctx, r.pcfg.Names().SessionsStream())
		if err != nil {
			return res, err
		}
		writes0 := kvStream.CachedInfo().State.LastSeq
		progress("sessions: %d live, seamguard on %d events", n, m)
		prof := ""
		if last {
			prof = cpuProfile
		}
		var st processor.Stats
		z.SeamguardPerSec, z.Seamguard, st, err = r.decide(ctx, r.pcfg, m, prof, func(p *processor.Processor) error {
			if !last {
				return nil
			}
			// Memory while p holds the sessions of its round.
			res.RSSBase = rssBase
			res.RSSAfter, res.RSSPeak = settledMemory()
			st := p.Stats()
			res.MaxSessions, res.Held, res.Dropped = p.Config().MaxSessions, st.Sessions, st.Dropped
			held := float64(max(st.Sessions, 1))
			res.HeapPerSession = (float64(heapwatch.InUse()) - float64(heapBase)) / held
			res.RSSPerSession = (float64(res.RSSAfter) - float64(res.RSSBase)) / held
			if heapProfile != "" {
				return writeHeapProfile(heapProfile)
			}
			return nil
		})
		if err != nil {
			return res, err
		}
		z.AtomicBatches, z.BatchedWrites, z.BatchFallbacks = st.AtomicBatches, st.BatchedWrites, st.BatchFallbacks
		info, err := kvStream.Info(ctx)
		if err != nil {
			return res, err
		}
		// The partitions' floors ride in the same bucket: not state writes.
		z.WritesPerEvent = float64(info.State.LastSeq-writes0-st.FloorWrites) / float64(m)
		z.FloorWrites = st.FloorWrites
		if last {
			res.SnapshotBytes = float64(info.State.Bytes) / float64(info.State.Msgs)
		}
		z.Floored = st.Floored
		progress("sessions: %d live, seamguard %.0f events/s (%d states read shown caught up by their partition's floor)", n, z.SeamguardPerSec, st.Floored)

		// The raw anchors, on the same server at the same key count; the
		// reads first, while the raw keys are as cold as the states
		// seamguard read.
		if z.GetPerSec, err = r.rawGets(ctx, order); err != nil {
			return res, err
		}
		progress("sessions: %d live, raw KV gets %.0f/s", n, z.GetPerSec)
		if z.PutPerSec, z.Put, err = r.rawWrites(ctx, order, false); err != nil {
			return res, err
		}
		progress("sessions: %d live, raw KV puts %.0f/s", n, z.PutPerSec)
		if z.CASPerSec, z.CAS, err = r.rawWrites(ctx, order, true); err != nil {
			return res, err
		}
		progress("sessions: %d live, raw KV CAS updates %.0f/s", n, z.CASPerSec)
		meter := r.srv.meter()
		took, err := consumeFrom(ctx, js, r.pcfg, fmt.Sprintf("rawsessions%d", i), first, m)
		if err != nil {
			return res, err
		}
		z.Consume = meter.stop()
		z.ConsumePerSec = float64(m) / took.Seconds()
		progress("sessions: %d live, raw consume %.0f events/s", n, z.ConsumePerSec)
		lowest := 0.0
		for _, a := range z.anchors() {
			if z.Lowest == "" || a.v < lowest {
				z.Lowest, lowest = a.name, a.v
			}
		}
		z.Ratio = ratio(z.SeamguardPerSec, lowest)
		z.CASRatio = ratio(z.SeamguardPerSec, z.CASPerSec)

		// Per-message writes, on sessions of their own.
		if err := r.freshRound(ctx, perm[m:2*m], pop, cfg.SyncInterval); err != nil {
			return res, err
		}
		pm := r.pcfg
		pm.NoAtomicBatches = true
		progress("sessions: %d live, seamguard with per-message writes on %d other events", n, m)
		z.PerMessagePerSec, z.PerMessage, st, err = r.decide(ctx, pm, m, "", nil)
		if err != nil {
			return res, err
		}
		if st.AtomicBatches != 0 {
			return res, fmt.Errorf("bench: the processor with NoAtomicBatches committed %d atomic batches", st.AtomicBatches)
		}
		z.AtomicOverPerMessage = ratio(z.SeamguardPerSec, z.PerMessagePerSec)
		progress("sessions: %d live, per-message writes %.0f events/s", n, z.PerMessagePerSec)
		res.Sizes = append(res.Sizes, z)
		if !last {
			continue
		}

		// A crash of server and processor, and the first decision after.
		if res.Recovery, err = r.recovery(ctx, perm[0]); err != nil {
			return res, fmt.Errorf("recovery: %w", err)
		}
		if res.Recovery.Skipped != "" {
			progress("sessions: recovery after a crash skipped: %s", res.Recovery.Skipped)
		}

		// The same server syncing lazily, on other sessions.
		if !lazy {
			progress("sessions: lazy run skipped: %s", res.LazySkipped)
			continue
		}
		if err := r.freshRound(ctx, perm[2*m:3*m], pop, lazySync); err != nil {
			return res, err
		}
		progress("sessions: %d live, seamguard on %d other events, the server syncing every %s", n, m, lazySync)
		zz := &res.Sizes[len(res.Sizes)-1]
		var u Usage
		if zz.LazyPerSec, u, _, err = r.decide(ctx, r.pcfg, m, "", nil); err != nil {
			return res, err
		}
		zz.Lazy = &u
		zz.LazyRatio = ratio(zz.SeamguardPerSec, zz.LazyPerSec)
		progress("sessions: %d live, lazy %.0f events/s", n, zz.LazyPerSec)
	}
	return res, nil
}

// lazySync is how the server syncs for the lazy run at the largest size.
const lazySync = 2 * time.Minute

// freshRound publishes one turn for each session in order, with the server
// syncing as pop says, and then restarts the server syncing as sync says:
// a run on these sessions starts, as seamguard's does, on a server just
// started, with its events written before (and with URL, on the server as
// it is).
func (r *sessionsRun) freshRound(ctx context.Context, order []int, pop, sync time.Duration) error {
	if err := r.restart(pop); err != nil {
		return err
	}
	if _, err := r.publishRound(ctx, order); err != nil {
		return err
	}
	return r.restart(sync)
}

// decide starts a processor of cfg with no session in memory and runs it
// until it has decided m events and every one is acknowledged, then checks
// that it published no verdict. It returns the events per second, the
// usage and the processor's counters. held, if not nil, is called while
// the processor still runs; with cpuProfile it is profiled while it runs.
func (r *sessionsRun) decide(ctx context.Context, cfg processor.Config, m int, cpuProfile string, held func(*processor.Processor) error) (float64, Usage, processor.Stats, error) {
	js := r.srv.js
	p, err := processor.New(ctx, js, cfg, procOpts()...)
	if err != nil {
		return 0, Usage{}, processor.Stats{}, err
	}
	stopProf := func() {}
	if cpuProfile != "" {
		if stopProf, err = startCPUProfile(cpuProfile); err != nil {
			return 0, Usage{}, processor.Stats{}, err
		}
	}
	defer stopProf()
	meter := r.srv.meter()
	var u Usage
	var heldErr error
	took, err := process(ctx, js, p, uint64(m), func() {
		u = meter.stop()
		stopProf()
		if held != nil {
			heldErr = held(p)
		}
	}, nil)
	if err == nil {
		err = heldErr
	}
	if err != nil {
		return 0, Usage{}, processor.Stats{}, err
	}
	if err := checkSessions(ctx, js, cfg); err != nil {
		return 0, Usage{}, processor.Stats{}, err
	}
	return float64(m) / took.Seconds(), u, p.Stats(), nil
}

// publishTurn publishes the next turn of session s and returns its stream
// sequence.
func (r *sessionsRun) publishTurn(ctx context.Context, s int) (uint64, error) {
	m := r.gen.turn(sessionID(s), uint64(r.heads[s]), 256)
	r.heads[s]++
	ack, err := r.srv.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, fmt.Errorf("bench: publish a turn of %s: %w", sessionID(s), err)
	}
	return ack.Sequence, nil
}

// recovery crashes the server and a processor that runs idle, starts the
// server again on the same storage and then a fresh processor, and times
// the decision of a turn of session s published in between (see
// Recovery).
func (r *sessionsRun) recovery(ctx context.Context, s int) (*Recovery, error) {
	rec := &Recovery{Sessions: r.live, Sync: syncName(r.cfg), LeaseTTL: r.pcfg.WithDefaults().LeaseTTL.Seconds()}
	switch {
	case r.cfg.URL != "":
		rec.Skipped = "the server is not the bench's own (--nats-url)"
		return rec, nil
	case r.srv.pid == 0:
		rec.Skipped = "the server runs in this process (--in-process): killing it would end the bench"
		return rec, nil
	}
	names := r.pcfg.Names()
	part := r.pcfg.Subjects().Partition(sessionID(s))
	consumer := r.pcfg.ConsumerName(part)

	// A processor running, idle once it has decided a turn of the
	// session: it holds the lease of the session's partition.
	p, err := processor.New(ctx, r.srv.js, r.pcfg, procOpts()...)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	seq, err := r.publishTurn(ctx, s)
	if err == nil {
		err = waitAcked(ctx, r.srv.js, names.Events, consumer, seq)
	}
	if err != nil {
		cancel()
		<-done
		return nil, err
	}

	// The crash: the server's process killed, the processor aborted.
	r.progress("sessions: %d live, recovery: killing the server (pid %d) and aborting the processor", r.live, r.srv.pid)
	proc, err := os.FindProcess(r.srv.pid)
	if err == nil {
		err = proc.Kill() // SIGKILL
	}
	if err != nil {
		cancel()
		<-done
		return nil, fmt.Errorf("bench: kill the server: %w", err)
	}
	p.Abort()
	select {
	case <-done: // its error is the crash's
	case <-time.After(30 * time.Second):
		return nil, errors.New("bench: the processor did not stop within 30s of Abort")
	}
	cancel()

	// The server again, on the same storage.
	start := time.Now()
	if err := r.restart(r.cfg.SyncInterval); err != nil {
		return nil, err
	}
	js := r.srv.js
	if err := jetStreamReady(ctx, js, names.Events); err != nil {
		return nil, err
	}
	rec.ServerRestart = time.Since(start).Seconds()
	r.progress("sessions: %d live, recovery: the server answers after %.2fs", r.live, rec.ServerRestart)

	// A turn waits; a fresh processor starts and decides it. The lease of
	// the partition ("p<n>" in the leases bucket) is watched to tell when
	// the new processor took it.
	kv, err := js.KeyValue(ctx, names.Leases)
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, "p"+strconv.Itoa(part), jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	if seq, err = r.publishTurn(ctx, s); err != nil {
		return nil, err
	}
	pstart := time.Now()
	taken := make(chan time.Duration, 1)
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil && e.Operation() == jetstream.KeyValuePut {
					taken <- time.Since(pstart)
					return
				}
			case <-stopWatch:
				return
			}
		}
	}()
	p, err = processor.New(ctx, js, r.pcfg, procOpts()...)
	if err != nil {
		return nil, err
	}
	rctx, cancel = context.WithCancel(ctx)
	defer cancel()
	done = make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	err = waitAcked(ctx, js, names.Events, consumer, seq)
	rec.FirstDecision = time.Since(pstart).Seconds()
	if err == nil {
		select {
		case d := <-taken:
			rec.LeaseTaken = d.Seconds()
		case <-time.After(time.Second):
			err = errors.New("bench: the turn was decided, and no new lease of its partition was seen")
		}
	}
	if st := p.Stats(); err == nil && st.Handled+st.CaughtUp == 0 {
		err = errors.New("bench: the turn was acknowledged, and the processor decided nothing")
	}
	cancel()
	if rerr := <-done; err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	if err := checkSessions(ctx, js, r.pcfg); err != nil {
		return nil, err
	}
	rec.Total = rec.ServerRestart + rec.FirstDecision
	r.progress("sessions: %d live, recovery: first decision %.2fs after the processor's start (lease taken after %.2fs)", r.live, rec.FirstDecision, rec.LeaseTaken)
	return rec, nil
}

// waitAcked waits until the ack floor of the durable consumer of stream
// reaches seq (at most 5 minutes).
func waitAcked(ctx context.Context, js jetstream.JetStream, stream, consumer string, seq uint64) error {
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream >= seq {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s did not acknowledge stream sequence %d within 5 minutes (ack floor %d)", consumer, seq, info.AckFloor.Stream)
		}
		if err := waitCtx(ctx, 2*time.Millisecond); err != nil {
			return err
		}
	}
}

// jetStreamReady waits until JetStream answers: the account's info, and
// the stream's (at most 5 minutes).
func jetStreamReady(ctx context.Context, js jetstream.JetStream, stream string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		_, err := js.AccountInfo(ctx)
		if err == nil {
			_, err = js.Stream(ctx, stream)
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: JetStream did not answer within 5 minutes of the server's start: %w", err)
		}
		if err := waitCtx(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// syncName says how cfg's servers sync.
func syncName(cfg Config) string {
	switch {
	case cfg.URL != "":
		return "as configured"
	case cfg.SyncInterval == 0:
		return "always"
	}
	return cfg.SyncInterval.String()
}

func sessionID(i int) string { return fmt.Sprintf("s%07d", i) }

// openState is the state the processor stores for a session after its
// session.opened at stream sequence seq: the pure core's own.
func (r *sessionsRun) openState(m *nats.Msg, seq uint64) ([]byte, error) {
	ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, r.pcfg.Subjects())
	if err != nil {
		return nil, fmt.Errorf("bench: a generated session.opened: %w", err)
	}
	ev.Meta.Seq = seq
	l := new(ledger.Ledger)
	res, err := ledger.Step(l, ledger.Input{Event: ev}, ledger.Config{})
	if err != nil {
		return nil, err
	}
	if !res.Accepted {
		return nil, fmt.Errorf("bench: the core did not accept a generated session.opened: %+v", res.Outputs)
	}
	return processor.MarshalState(seq, l)
}

// stateSize returns a value as big as the state a session has after its
// open and one turn (what the processor writes for it in a round): the
// raw anchors write values of that size.
func (r *sessionsRun) stateSize() ([]byte, error) {
	g := newGen(r.pcfg.Subjects(), Seed+4)
	id := sessionID(0)
	l := new(ledger.Ledger)
	for i, m := range []*nats.Msg{g.open(id, 12), g.turn(id, 0, 256)} {
		ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, r.pcfg.Subjects())
		if err != nil {
			return nil, err
		}
		ev.Meta.Seq = uint64(i + 1)
		if _, err := ledger.Step(l, ledger.Input{Event: ev}, ledger.Config{}); err != nil {
			return nil, err
		}
	}
	st, err := processor.MarshalState(1_000_000_000, l)
	if err != nil {
		return nil, err
	}
	val := make([]byte, len(st))
	for i := range val {
		val[i] = 'a' + byte(i%26)
	}
	return val, nil
}

// grow opens sessions up to n: their session.opened events go into the
// events stream and their states, as the processor would have stored them,
// into its bucket; the processor's consumers are acknowledged past the
// events; the raw bucket gets as many keys. It returns how fast the raw
// bucket took its new keys.
func (r *sessionsRun) grow(ctx context.Context, n int) (float64, error) {
	const chunk = 8192
	js := r.srv.js
	sessions := processor.KVPrefix(r.pcfg.Names().Sessions)
	raw := processor.KVPrefix(r.rawKV)
	from := r.live
	if n <= from {
		return 0, nil
	}
	r.progress("sessions: opening sessions %d to %d", from, n)
	var rawTime time.Duration
	for at := from; at < n; at += chunk {
		k := min(chunk, n-at)
		opens := make([]*nats.Msg, k)
		for i := range k {
			opens[i] = r.gen.open(sessionID(at+i), 12)
		}
		seqs, err := publishAll(ctx, js, opens, 4096)
		if err != nil {
			return 0, err
		}
		states := make([]*nats.Msg, k)
		keys := make([]*nats.Msg, k)
		for i, m := range opens {
			val, err := r.openState(m, seqs[i])
			if err != nil {
				return 0, err
			}
			states[i] = &nats.Msg{Subject: sessions + sessionID(at+i), Data: val, Header: nats.Header{processor.StateHeader: []string{"1"}}}
			keys[i] = &nats.Msg{Subject: raw + sessionID(at+i), Data: r.rawVal}
		}
		if _, err := publishAll(ctx, js, states, 4096); err != nil {
			return 0, err
		}
		start := time.Now()
		revs, err := publishAll(ctx, js, keys, 4096)
		if err != nil {
			return 0, err
		}
		rawTime += time.Since(start)
		copy(r.rawRevs[at:], revs)
	}
	// The processor would have acknowledged the opens: its consumers
	// start after them.
	if _, err := consumeLayout(ctx, js, r.pcfg, n-from, true, nil); err != nil {
		return 0, err
	}
	// And it would have stored its partitions' floors past them.
	if err := r.floors(ctx); err != nil {
		return 0, err
	}
	r.live = n
	return float64(n-from) / rawTime.Seconds(), nil
}

// floors stores each partition's floor (processor/floor.go) at the events
// stream's last sequence, every message of which the processor's consumers
// have acknowledged, as the processor's own writes of states would.
func (r *sessionsRun) floors(ctx context.Context) error {
	js := r.srv.js
	s, err := js.Stream(ctx, r.pcfg.Names().Events)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	sessions := processor.KVPrefix(r.pcfg.Names().Sessions)
	n := r.pcfg.WithDefaults().Partitions
	for part := range n {
		if _, err := js.Publish(ctx, sessions+processor.FloorKey(n, part), processor.FloorValue(0, info.State.LastSeq)); err != nil {
			return err
		}
	}
	return nil
}

// publishRound publishes one turn for each session in order and returns
// the stream sequence of the first.
func (r *sessionsRun) publishRound(ctx context.Context, order []int) (uint64, error) {
	const chunk = 8192
	r.progress("sessions: publishing %d turns over %d sessions", len(order), r.live)
	// A processor stopped a moment ago may still have pull requests
	// waiting, which the server would fill with these turns for nobody:
	// the next processor would start with them delivered elsewhere.
	conss, err := createConsumers(ctx, r.srv.js, r.pcfg)
	if err != nil {
		return 0, err
	}
	waitNoPulls(ctx, conss)
	var first uint64
	for at := 0; at < len(order); at += chunk {
		part := order[at:min(at+chunk, len(order))]
		msgs := make([]*nats.Msg, len(part))
		for i, s := range part {
			msgs[i] = r.gen.turn(sessionID(s), uint64(r.heads[s]), 256)
			r.heads[s]++
		}
		seqs, err := publishAll(ctx, r.srv.js, msgs, 4096)
		if err != nil {
			return 0, err
		}
		if at == 0 {
			first = seqs[0]
		}
	}
	return first, nil
}

// rawWrites updates the raw bucket's keys of the sessions in order,
// pipelined with 4,096 in flight: plain puts, or with cas each a
// compare-and-set on the key's revision (kv.Update's message, sent
// asynchronously as the processor sends its state writes).
func (r *sessionsRun) rawWrites(ctx context.Context, order []int, cas bool) (float64, Usage, error) {
	js := r.srv.js
	subj := processor.KVPrefix(r.rawKV)
	const window = 4096
	type sent struct {
		key int
		f   jetstream.PubAckFuture
	}
	futs := make([]sent, 0, window)
	flush := func() error {
		for _, s := range futs {
			select {
			case a := <-s.f.Ok():
				r.rawRevs[s.key] = a.Sequence
			case err := <-s.f.Err():
				return fmt.Errorf("bench: raw KV write of %s: %w", sessionID(s.key), err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		futs = futs[:0]
		return nil
	}
	m := r.srv.meter()
	start := time.Now()
	for _, k := range order {
		msg := &nats.Msg{Subject: subj + sessionID(k), Data: r.rawVal}
		var opts []jetstream.PublishOpt
		if cas {
			opts = append(opts, jetstream.WithExpectLastSequencePerSubject(r.rawRevs[k]))
		}
		f, err := js.PublishMsgAsync(msg, opts...)
		if err != nil {
			return 0, Usage{}, fmt.Errorf("bench: raw KV write: %w", err)
		}
		futs = append(futs, sent{key: k, f: f})
		if len(futs) == window {
			if err := flush(); err != nil {
				return 0, Usage{}, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, Usage{}, err
	}
	took := time.Since(start)
	return float64(len(order)) / took.Seconds(), m.stop(), nil
}

// rawGets reads the raw bucket's keys of the sessions in order, each once,
// with 64 reads in flight, and returns the reads per second.
func (r *sessionsRun) rawGets(ctx context.Context, order []int) (float64, error) {
	kv, err := r.srv.js.KeyValue(ctx, r.rawKV)
	if err != nil {
		return 0, fmt.Errorf("bench: raw bucket %s: %w", r.rawKV, err)
	}
	const inFlight = 64
	next := make(chan int)
	errs := make(chan error, inFlight)
	start := time.Now()
	var wg sync.WaitGroup
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				if _, err := kv.Get(ctx, sessionID(k)); err != nil {
					errs <- fmt.Errorf("bench: raw KV get of %s: %w", sessionID(k), err)
					return
				}
			}
		}()
	}
	var failed error
feed:
	for _, k := range order {
		select {
		case next <- k:
		case failed = <-errs:
			break feed
		case <-ctx.Done():
			failed = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if failed == nil {
		select {
		case failed = <-errs:
		default:
		}
	}
	if failed != nil {
		return 0, failed
	}
	return float64(len(order)) / time.Since(start).Seconds(), nil
}

// consumeFrom reads n events of cfg's events stream from sequence first
// with a durable pull consumer of its own, fetching as the processor's
// partitions do (twice a batch, bounded in bytes) and acknowledging each
// fetch by its last message (AckAll), and returns how long that took until
// the server held no ack pending. The consumer is created before the clock
// starts and deleted after.
func consumeFrom(ctx context.Context, js jetstream.JetStream, cfg processor.Config, durable string, first uint64, n int) (time.Duration, error) {
	cfg = cfg.WithDefaults()
	stream := cfg.Names().Events
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckAllPolicy, MaxAckPending: cfg.MaxAckPending,
		AckWait: time.Minute, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first,
	})
	if err != nil {
		return 0, err
	}
	defer js.DeleteConsumer(context.WithoutCancel(ctx), stream, durable)
	start := time.Now()
	got := 0
	for got < n {
		batch, err := cons.Fetch(min(cfg.MaxBatch*2, n-got), jetstream.FetchMaxWait(time.Second), jetstream.FetchMaxBytes(processor.FetchBytes(js.Conn(), cfg)))
		if err != nil {
			return 0, err
		}
		var last jetstream.Msg
		for m := range batch.Messages() {
			last = m
			got++
		}
		if last != nil {
			if err := last.Ack(); err != nil {
				return 0, err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrBatchCompleted) && !errors.Is(err, jetstream.ErrMaxBytesExceeded) {
			return 0, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return 0, err
		}
		if info.NumAckPending == 0 {
			return time.Since(start), nil
		}
		if err := waitCtx(ctx, 2*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// checkSessions checks that the processor decided every turn without a
// verdict: each was accepted, none rejected.
func checkSessions(ctx context.Context, js jetstream.JetStream, cfg processor.Config) error {
	vs, err := js.Stream(ctx, cfg.Names().Verdicts)
	if err != nil {
		return err
	}
	if n := vs.CachedInfo().State.Msgs; n != 0 {
		return fmt.Errorf("bench: the processor published %d verdicts; every turn of the sessions workload is accepted without one", n)
	}
	return nil
}

// startCPUProfile profiles this process's CPU into path, and where its
// goroutines wait into path+".block" (a block profile, one sample per 10µs
// blocked), until the returned function is called.
func startCPUProfile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	var once sync.Once
	return func() { once.Do(func() { stopProfiles(f, path) }) }, nil
}

// stopProfiles ends what startCPUProfile began.
func stopProfiles(f *os.File, path string) {
	pprof.StopCPUProfile()
	f.Close()
	if bf, err := os.Create(path + ".block"); err == nil {
		_ = pprof.Lookup("block").WriteTo(bf, 0)
		bf.Close()
	}
	runtime.SetBlockProfileRate(0)
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: heap profile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: heap profile: %w", err)
	}
	return f.Close()
}

// settledMemory collects garbage, returns freed memory to the system and
// reads the process's resident set size and its peak (VmRSS, VmHWM; 0
// where /proc is not there).
func settledMemory() (rss, hwm uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	time.Sleep(100 * time.Millisecond)
	debug.FreeOSMemory()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) < 1 {
			continue
		}
		kb, _ := strconv.ParseUint(fields[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm
}
