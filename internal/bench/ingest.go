package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// IngestResult compares the processor with plain durable pull consumers on
// the same events, each read from a file-backed stream that already holds
// them all, and with a raw durable publish of the same events. Each side is
// measured Rounds times, interleaved, and its median is reported: the
// machines are shared, and a single pass of a second or two swings by a
// fifth from one run to the next.
type IngestResult struct {
	BodyBytes int `json:"body_bytes"`
	Events    int `json:"events"`
	Sessions  int `json:"sessions"`
	Requests  int `json:"requests"` // compaction requests among them, each allowed
	// PublishPerSec is how fast the raw stream took the events once, as
	// setup (a single pass; RawPublishPerSec is the measured anchor).
	PublishPerSec float64 `json:"publish_per_sec"`
	Rounds        int     `json:"rounds"`
	// Raw reads the events with one durable pull consumer on a stream of
	// their own, acknowledging each: the reference, and a read
	// rate.
	RawPerSec float64 `json:"raw_per_sec"`
	// RawPublish publishes the first PublishEvents of the same events into
	// a new file-backed stream of their own on the same server, pipelined
	// (asynchronous publishes, 4,096 acks outstanding), until every one is
	// acknowledged: a write rate, under the run's sync setting. Under
	// always it is the stream's fsync rate, which more events would not
	// change, and would take minutes a round to measure.
	RawPublishPerSec float64 `json:"raw_publish_per_sec"`
	PublishEvents    int     `json:"publish_events"`
	PublishRatio     float64 `json:"publish_ratio"` // seamguard / raw publish
	// Layout reads the processor's events stream through consumers laid
	// out as the processor's are (one per partition plus one for subjects
	// without a session, filtered), fetching as the processor does and acknowledging as it does (a partition's
	// batch by its last message, AckAll), with no processing: what the
	// broker costs for that layout.
	LayoutPerSec    float64 `json:"layout_per_sec"`
	SeamguardPerSec float64 `json:"seamguard_per_sec"`
	Ratio           float64 `json:"ratio"`        // seamguard / raw
	LayoutRatio     float64 `json:"layout_ratio"` // layout / raw
	// PerMessage is the same processor with Config.NoAtomicBatches: every
	// verdict and every session state written as a message of its own.
	PerMessagePerSec float64 `json:"per_message_per_sec"`
	PerMessageRatio  float64 `json:"per_message_ratio"` // per-message / raw
	// AtomicOverPerMessage is seamguard (atomic batches, the default) over
	// per-message writes: what batching buys.
	AtomicOverPerMessage float64 `json:"atomic_over_per_message"`
	// Per round: events/s and CPU of each side.
	RawRounds        []Round `json:"raw_rounds"`
	RawPublishRounds []Round `json:"raw_publish_rounds"`
	LayoutRounds     []Round `json:"layout_rounds"`
	SeamguardRounds  []Round `json:"seamguard_rounds"`
	PerMessageRounds []Round `json:"per_message_rounds"`
	// Snapshot writes per input: one per session touched by a batch.
	WritesPerEvent float64 `json:"snapshot_writes_per_event"`
	CaughtUp       uint64  `json:"caught_up"` // inputs read from the stream ahead of their delivery
	// The seamguard processors' atomic batches over all rounds (see
	// processor.Stats): committed, the messages they held, and those that
	// did not commit and were written one message at a time.
	AtomicBatches  uint64 `json:"atomic_batches"`
	BatchedWrites  uint64 `json:"batched_writes"`
	BatchFallbacks uint64 `json:"batch_fallbacks"`
	// The CPU each side spends per event: what bounds the ratio when
	// neither side waits on the disk.
	SeamguardCPU CPUPerEvent `json:"seamguard_cpu"`
	RawCPU       CPUPerEvent `json:"raw_cpu"`
}

// CPUPerEvent is the CPU one side of a comparison spent per event, each
// figure the median over its rounds. Process is the bench process's (the
// processor, or the raw consumer, and the clients), Server the server's;
// with the server in the bench process (--in-process, or a server at
// --nats-url, whose CPU is not measured) all of it is in Process.
type CPUPerEvent struct {
	ProcessMicros float64 `json:"process_us"`
	ServerMicros  float64 `json:"server_us"`
	TotalMicros   float64 `json:"total_us"`
	// CoresBusy is CPU seconds per second of the round: how much of the
	// machine the side kept busy.
	CoresBusy float64 `json:"cores_busy"`
}

// cpuPerEvent is the median CPU per event of rounds that each handled
// events events.
func cpuPerEvent(rs []Round, events int) CPUPerEvent {
	if events <= 0 || len(rs) == 0 {
		return CPUPerEvent{}
	}
	var proc, srv, total, busy []float64
	for _, r := range rs {
		u := r.Usage
		proc = append(proc, 1e6*u.ClientCPU/float64(events))
		srv = append(srv, 1e6*u.ServerCPU/float64(events))
		total = append(total, 1e6*(u.ClientCPU+u.ServerCPU)/float64(events))
		if u.Wall > 0 {
			busy = append(busy, (u.ClientCPU+u.ServerCPU)/u.Wall)
		}
	}
	return CPUPerEvent{ProcessMicros: medianOf(proc), ServerMicros: medianOf(srv), TotalMicros: medianOf(total), CoresBusy: medianOf(busy)}
}

// Round is one measurement of one side of the ingest comparison.
type Round struct {
	PerSec float64 `json:"per_sec"`
	// FirstMs is how long after the clock started the first input was
	// delivered (raw, layout) or decided (the processor, which starts with
	// the clock: its connections, leases and consumers' state).
	FirstMs float64 `json:"first_ms"`
	Usage   Usage   `json:"usage"`
}

// benchProcessorConfig is the processor's configuration in every
// measurement: the defaults of serve, with the given prefix.
func benchProcessorConfig(prefix string) processor.Config {
	return processor.Config{Prefix: prefix, Source: "urn:seamguard:bench", SpillVerify: true}
}

func median(rs []Round) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.PerSec
	}
	return medianOf(v)
}

// medianOf is the median of v (0 for none); v is sorted in place.
func medianOf(v []float64) float64 {
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// publishAnchorEvents bounds the events of the raw publish anchor.
const publishAnchorEvents = 10_000

func runIngest(ctx context.Context, s *server, tag string, body, n, sessions, rounds int, cpuProfile string, progress func(string, ...any)) (IngestResult, error) {
	res := IngestResult{BodyBytes: body, Events: n, Sessions: sessions, Rounds: rounds}
	prefix := "bench" + tag
	cfg := benchProcessorConfig(prefix)
	msgs := ingestEvents(cfg.Subjects(), "s", sessions, n, body)
	for _, m := range msgs {
		if m.Header.Get("ce-type") == events.TypeCompactionRequested {
			res.Requests++
		}
	}

	// Raw JetStream: the same messages on a file-backed stream of its own.
	rawStream := strings.ToUpper(prefix) + "_RAW"
	rawSubj := prefix + "raw"
	if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: rawStream, Subjects: []string{rawSubj + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		return res, err
	}
	defer s.js.DeleteStream(context.WithoutCancel(ctx), rawStream)
	raw := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		c := *m
		c.Subject = rawSubj + strings.TrimPrefix(m.Subject, prefix)
		raw[i] = &c
	}
	// The raw publish anchor: the same messages again, on subjects of a
	// stream made anew for each round (their message ids would be
	// duplicates in the same stream).
	pubStream := strings.ToUpper(prefix) + "_PUB"
	pubSubj := prefix + "pub"
	pub := make([]*nats.Msg, min(len(msgs), publishAnchorEvents))
	res.PublishEvents = len(pub)
	for i, m := range msgs[:len(pub)] {
		c := *m
		c.Subject = pubSubj + strings.TrimPrefix(m.Subject, prefix)
		pub[i] = &c
	}
	defer s.js.DeleteStream(context.WithoutCancel(ctx), pubStream)
	progress("ingest %d KiB: publishing %d events twice", body>>10, n)
	start := time.Now()
	if _, err := publishAll(ctx, s.js, raw, 4096); err != nil {
		return res, err
	}
	res.PublishPerSec = float64(n) / time.Since(start).Seconds()

	defer dropResources(context.WithoutCancel(ctx), s.js, cfg)
	if _, err := processor.Provision(ctx, s.js, cfg); err != nil {
		return res, err
	}
	if _, err := publishAll(ctx, s.js, msgs, 4096); err != nil {
		return res, err
	}

	maxAck := processor.DefaultShards * processor.DefaultQueueDepth
	for r := range rounds {
		// timed runs one reader, metered, and adds its round to out. The
		// meter stops when the reader's timing ends (a processor's
		// shutdown is not timed, and so not metered either).
		timed := func(what string, out *[]Round, n int, run func(first *time.Duration, end func()) (time.Duration, error)) error {
			progress("ingest %d KiB, round %d of %d: %s", body>>10, r+1, rounds, what)
			m := s.meter()
			var (
				first time.Duration
				u     *Usage
			)
			end := func() {
				if u == nil {
					got := m.stop()
					u = &got
				}
			}
			d, err := run(&first, end)
			if err != nil {
				return err
			}
			end()
			*out = append(*out, Round{PerSec: float64(n) / d.Seconds(), FirstMs: float64(first.Microseconds()) / 1000, Usage: *u})
			return nil
		}
		if err := timed("raw pull consumer", &res.RawRounds, n, func(first *time.Duration, _ func()) (time.Duration, error) {
			return consumeRaw(ctx, s.js, rawStream, fmt.Sprintf("raw-%d", r), n, maxAck, first)
		}); err != nil {
			return res, err
		}

		if err := s.js.DeleteStream(ctx, pubStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return res, err
		}
		if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: pubStream, Subjects: []string{pubSubj + ".>"}, Storage: jetstream.FileStorage}); err != nil {
			return res, err
		}
		if err := timed("raw durable publish (pipelined)", &res.RawPublishRounds, len(pub), func(*time.Duration, func()) (time.Duration, error) {
			start := time.Now()
			_, err := publishAll(ctx, s.js, pub, 4096)
			return time.Since(start), err
		}); err != nil {
			return res, err
		}

		lcfg := cfg
		lcfg.Durable = fmt.Sprintf("layout%d", r)
		if err := timed("the processor's consumer layout, no processing", &res.LayoutRounds, n, func(first *time.Duration, _ func()) (time.Duration, error) {
			return consumeLayout(ctx, s.js, lcfg, n, false, first)
		}); err != nil {
			return res, err
		}

		// The processor with atomic batches (the default) and with
		// per-message writes, each from nothing (new consumers, no
		// state), the one or the other first in alternate rounds.
		for k := range 2 {
			perMessage := k != r%2
			pcfg := cfg
			pcfg.Durable = fmt.Sprintf("seamguard%d", r)
			what, out := "seamguard processor", &res.SeamguardRounds
			if perMessage {
				pcfg.Durable = fmt.Sprintf("permessage%d", r)
				pcfg.NoAtomicBatches = true
				what, out = "seamguard processor, per-message writes", &res.PerMessageRounds
			}
			if err := freshState(ctx, s.js, pcfg); err != nil {
				return res, err
			}
			if _, err := createConsumers(ctx, s.js, pcfg); err != nil {
				return res, err
			}
			p, err := processor.New(ctx, s.js, pcfg, procOpts()...)
			if err != nil {
				return res, err
			}
			if err := timed(what, out, n, func(first *time.Duration, end func()) (time.Duration, error) {
				if cpuProfile != "" && !perMessage && r == rounds-1 {
					stop, err := startCPUProfile(cpuProfile)
					if err != nil {
						return 0, err
					}
					defer stop()
				}
				return process(ctx, s.js, p, uint64(n), end, first)
			}); err != nil {
				return res, err
			}
			st := p.Stats()
			if !perMessage {
				res.CaughtUp += st.CaughtUp
				res.AtomicBatches += st.AtomicBatches
				res.BatchedWrites += st.BatchedWrites
				res.BatchFallbacks += st.BatchFallbacks
			} else if st.AtomicBatches != 0 {
				return res, fmt.Errorf("bench: the processor with NoAtomicBatches committed %d atomic batches", st.AtomicBatches)
			}
			if err := checkIngest(ctx, s.js, pcfg, &res, !perMessage); err != nil {
				return res, err
			}
		}
	}
	res.RawPerSec, res.LayoutPerSec, res.SeamguardPerSec = median(res.RawRounds), median(res.LayoutRounds), median(res.SeamguardRounds)
	res.RawPublishPerSec, res.PerMessagePerSec = median(res.RawPublishRounds), median(res.PerMessageRounds)
	res.Ratio, res.LayoutRatio = ratio(res.SeamguardPerSec, res.RawPerSec), ratio(res.LayoutPerSec, res.RawPerSec)
	res.PublishRatio = ratio(res.SeamguardPerSec, res.RawPublishPerSec)
	res.PerMessageRatio = ratio(res.PerMessagePerSec, res.RawPerSec)
	res.AtomicOverPerMessage = ratio(res.SeamguardPerSec, res.PerMessagePerSec)
	res.SeamguardCPU, res.RawCPU = cpuPerEvent(res.SeamguardRounds, res.Events), cpuPerEvent(res.RawRounds, res.Events)
	return res, nil
}

// freshState deletes the snapshots bucket and the verdict stream of cfg, so
// that a processor with new consumers starts from nothing, and provisions
// them again.
func freshState(ctx context.Context, js jetstream.JetStream, cfg processor.Config) error {
	n := cfg.Names()
	for _, st := range []string{n.Verdicts, n.SessionsStream()} {
		if err := js.DeleteStream(ctx, st); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("bench: delete %s: %w", st, err)
		}
	}
	_, err := processor.Provision(ctx, js, cfg)
	return err
}

// checkIngest checks what the processor decided (every request allowed,
// nothing else) and, with record, records the snapshot writes per event.
func checkIngest(ctx context.Context, js jetstream.JetStream, cfg processor.Config, res *IngestResult, record bool) error {
	kv, err := js.Stream(ctx, cfg.Names().SessionsStream())
	if err != nil {
		return err
	}
	if record {
		res.WritesPerEvent = float64(kv.CachedInfo().State.LastSeq) / float64(res.Events)
	}
	vs, err := js.Stream(ctx, cfg.Names().Verdicts)
	if err != nil {
		return err
	}
	info, err := vs.Info(ctx, jetstream.WithSubjectFilter(cfg.Subjects().VerdictsWildcard("allowed")))
	if err != nil {
		return err
	}
	var allowed uint64
	for _, c := range info.State.Subjects {
		allowed += c
	}
	if info.State.Msgs != uint64(res.Requests) || allowed != uint64(res.Requests) {
		return fmt.Errorf("bench: the processor published %d verdicts, %d of them allowed; the workload holds %d requests, all healthy", info.State.Msgs, allowed, res.Requests)
	}
	return nil
}

// createConsumers creates the consumers a processor of cfg reads, so that
// a measurement does not count their creation, and returns those it
// created (all of them unless there is an error).
func createConsumers(ctx context.Context, js jetstream.JetStream, cfg processor.Config) ([]jetstream.Consumer, error) {
	cfg = cfg.WithDefaults()
	var conss []jetstream.Consumer
	for part := -1; part < cfg.Partitions; part++ {
		c, err := js.CreateOrUpdateConsumer(ctx, cfg.Names().Events, cfg.ConsumerConfig(part))
		if err != nil {
			return conss, fmt.Errorf("bench: consumer %s: %w", cfg.ConsumerName(part), err)
		}
		conss = append(conss, c)
	}
	return conss, nil
}

// process runs p until it has handled want inputs and acknowledged every
// one, and returns how long that took. held, if not nil, is called then,
// before p stops.
func process(ctx context.Context, js jetstream.JetStream, p *processor.Processor, want uint64, held func(), first *time.Duration) (time.Duration, error) {
	// Every input is either decided on delivery (Handled) or read from the
	// stream ahead of its delivery (CaughtUp) and then skipped.
	decided := func() uint64 { st := p.Stats(); return st.Handled + st.CaughtUp }
	before := decided()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(rctx) }()
	stopped := func() error {
		select {
		case err := <-done:
			return fmt.Errorf("bench: processor stopped: %v", err)
		default:
			return nil
		}
	}
	for got := decided() - before; got < want; got = decided() - before {
		if got > 0 && first != nil && *first == 0 {
			*first = time.Since(start)
		}
		if err := stopped(); err != nil {
			return 0, err
		}
		if err := waitCtx(ctx, 2*time.Millisecond); err != nil {
			return 0, err
		}
	}
	// Handled counts inputs decided; acks follow their batch's stores.
	for {
		pending, err := ackPending(ctx, js, p.Config())
		if err != nil {
			return 0, err
		}
		if pending == 0 {
			break
		}
		if err := waitCtx(ctx, 2*time.Millisecond); err != nil {
			return 0, err
		}
	}
	took := time.Since(start)
	if held != nil {
		held() // p still runs, with what it holds
	}
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	return took, nil
}

// LogEnv, when set in the environment, makes the processors of a run log
// to standard error at that level (debug, info, warn, error).
const LogEnv = "SEAMGUARD_BENCH_LOG"

// procOpts gives the processors of a run a logger when LogEnv is set.
func procOpts() []processor.Option {
	var level slog.Level
	if v := os.Getenv(LogEnv); v == "" || level.UnmarshalText([]byte(v)) != nil {
		return nil
	}
	return []processor.Option{processor.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))}
}

// ackPending adds up what the processor's consumers have delivered and not
// had acknowledged, plus what they have yet to deliver.
func ackPending(ctx context.Context, js jetstream.JetStream, cfg processor.Config) (uint64, error) {
	var n uint64
	for part := -1; part < cfg.Partitions; part++ {
		c, err := js.Consumer(ctx, cfg.Names().Events, cfg.ConsumerName(part))
		if err != nil {
			return 0, err
		}
		info := c.CachedInfo()
		n += uint64(info.NumAckPending) + info.NumPending
	}
	return n, nil
}

// consumeRaw reads n messages from stream with the durable pull consumer durable,
// fetching in batches and acknowledging each message, and returns how long
// that took until the server held no ack pending.
func consumeRaw(ctx context.Context, js jetstream.JetStream, stream, durable string, n, maxAckPending int, first *time.Duration) (time.Duration, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: maxAckPending,
		AckWait: time.Minute, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	got := 0
	for got < n {
		// Never more than what is left: a fetch ends when its batch is full
		// or at its expiry.
		batch, err := cons.Fetch(min(processor.DefaultMaxBatch*2, n-got), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return 0, err
		}
		for m := range batch.Messages() {
			if got == 0 && first != nil {
				*first = time.Since(start)
			}
			if err := m.Ack(); err != nil {
				return 0, err
			}
			got++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
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

// dropResources deletes what a processor of cfg provisioned.
func dropResources(ctx context.Context, js jetstream.JetStream, cfg processor.Config) {
	n := cfg.Names()
	for _, s := range []string{n.Events, n.Verdicts, n.SessionsStream(), n.SpillsStream()} {
		_ = js.DeleteStream(ctx, s)
	}
}

// consumeLayout reads cfg's events stream through consumers laid out as the
// processor lays out its own (see IngestResult.Layout), until n messages
// are acknowledged, and returns how long that took. The consumers are
// created (or found) before the clock starts, and deleted after unless keep
// is set.
func consumeLayout(ctx context.Context, js jetstream.JetStream, cfg processor.Config, n int, keep bool, first *time.Duration) (time.Duration, error) {
	cfg = cfg.WithDefaults()
	conss, err := createConsumers(ctx, js, cfg)
	defer func() {
		for _, c := range conss {
			if !keep {
				_ = js.DeleteConsumer(context.WithoutCancel(ctx), cfg.Names().Events, c.CachedInfo().Name)
			}
		}
	}()
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if keep {
		// The consumers are left as a processor would leave them: with
		// no pull request of ours still open for what is published next.
		defer waitNoPulls(ctx, conss)
	}
	var got atomic.Int64
	errs := make(chan error, len(conss))
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range conss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			empty := false // the last fetch brought nothing
			// As the processor does: an AckAll consumer's batch is
			// acknowledged by its last message.
			all := c.CachedInfo().Config.AckPolicy == jetstream.AckAllPolicy
			for got.Load() < int64(n) && rctx.Err() == nil {
				if empty {
					// Nothing came: done when the consumer has nothing
					// left (then a lost delivery is reported below,
					// rather than waited for).
					info, err := c.Info(rctx)
					if err != nil {
						errs <- err
						cancel()
						return
					}
					if info.NumPending == 0 && info.NumAckPending == 0 {
						return
					}
				}
				batch, err := c.Fetch(cfg.MaxBatch*2, jetstream.FetchMaxWait(100*time.Millisecond), jetstream.FetchMaxBytes(processor.FetchBytes(js.Conn(), cfg)))
				if err != nil {
					errs <- err
					cancel()
					return
				}
				var last jetstream.Msg
				empty = true
				for m := range batch.Messages() {
					empty = false
					last = m
					if got.Add(1) == 1 && first != nil {
						*first = time.Since(start)
					}
					if all {
						continue
					}
					if err := m.Ack(); err != nil {
						errs <- err
						cancel()
						return
					}
				}
				if all && last != nil {
					if err := last.Ack(); err != nil {
						errs <- err
						cancel()
						return
					}
				}
				if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrBatchCompleted) && !errors.Is(err, jetstream.ErrMaxBytesExceeded) {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("bench: layout consumers: %w", err)
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if got := got.Load(); got < int64(n) {
		return 0, fmt.Errorf("bench: layout consumers: %d of %d events delivered, and nothing is pending (a delivery was lost, and acknowledged by a later ack)", got, n)
	}
	for {
		pending := 0
		for _, c := range conss {
			info, err := c.Info(ctx)
			if err != nil {
				return 0, err
			}
			pending += info.NumAckPending + int(info.NumPending)
		}
		if pending == 0 {
			return time.Since(start), nil
		}
		if err := waitCtx(ctx, 2*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// waitNoPulls waits, a few seconds at most, until none of conss has a
// pull request waiting.
func waitNoPulls(ctx context.Context, conss []jetstream.Consumer) {
	deadline := time.Now().Add(3 * time.Second)
	for _, c := range conss {
		for time.Now().Before(deadline) {
			info, err := c.Info(ctx)
			if err != nil || info.NumWaiting == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
