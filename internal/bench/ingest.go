package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// IngestResult compares the processor with a plain durable pull consumer on
// the same events, each read from a file-backed stream that already holds
// them all.
type IngestResult struct {
	BodyBytes        int     `json:"body_bytes"`
	Events           int     `json:"events"`
	Sessions         int     `json:"sessions"`
	Requests         int     `json:"requests"` // compaction requests among them, each allowed
	PublishPerSec    float64 `json:"publish_per_sec"`
	RawSeconds       float64 `json:"raw_seconds"`
	RawPerSec        float64 `json:"raw_per_sec"`
	SeamguardSeconds float64 `json:"seamguard_seconds"`
	SeamguardPerSec  float64 `json:"seamguard_per_sec"`
	Ratio            float64 `json:"ratio"`
	RawUsage         Usage   `json:"raw_usage"`
	SeamguardUsage   Usage   `json:"seamguard_usage"`
	// Snapshot writes per input: one per session touched by a batch.
	WritesPerEvent float64 `json:"snapshot_writes_per_event"`
	CaughtUp       uint64  `json:"caught_up"` // inputs read from the stream ahead of their delivery
}

// benchProcessorConfig is the processor's configuration in every
// measurement: the defaults of serve, with the given prefix.
func benchProcessorConfig(prefix string) processor.Config {
	return processor.Config{Prefix: prefix, Source: "urn:seamguard:bench", SpillVerify: true}
}

func runIngest(ctx context.Context, s *server, tag string, body, n, sessions int, progress func(string, ...any)) (IngestResult, error) {
	res := IngestResult{BodyBytes: body, Events: n, Sessions: sessions}
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
	progress("ingest %d KiB: publishing %d events twice", body>>10, n)
	start := time.Now()
	if _, err := publishAll(ctx, s.js, raw, 4096); err != nil {
		return res, err
	}
	res.PublishPerSec = float64(n) / time.Since(start).Seconds()

	defer dropResources(context.WithoutCancel(ctx), s.js, cfg)
	if err := createConsumers(ctx, s.js, cfg); err != nil {
		return res, err
	}
	p, err := processor.New(ctx, s.js, cfg, procOpts()...)
	if err != nil {
		return res, err
	}
	if _, err := publishAll(ctx, s.js, msgs, 4096); err != nil {
		return res, err
	}

	progress("ingest %d KiB: raw pull consumer", body>>10)
	m := s.meter()
	d, err := consumeRaw(ctx, s.js, rawStream, n, processor.DefaultShards*processor.DefaultQueueDepth)
	if err != nil {
		return res, err
	}
	res.RawUsage = m.stop()
	res.RawSeconds, res.RawPerSec = d.Seconds(), float64(n)/d.Seconds()

	progress("ingest %d KiB: seamguard processor", body>>10)
	m = s.meter()
	d, err = process(ctx, s.js, p, uint64(n))
	if err != nil {
		return res, err
	}
	res.SeamguardUsage = m.stop()
	res.SeamguardSeconds, res.SeamguardPerSec = d.Seconds(), float64(n)/d.Seconds()
	res.Ratio = res.SeamguardPerSec / res.RawPerSec
	res.CaughtUp = p.Stats().CaughtUp
	kv, err := s.js.Stream(ctx, "KV_"+cfg.Names().Sessions)
	if err != nil {
		return res, err
	}
	res.WritesPerEvent = float64(kv.CachedInfo().State.LastSeq) / float64(n)

	// What it decided: every request allowed, nothing else.
	vs, err := s.js.Stream(ctx, cfg.Names().Verdicts)
	if err != nil {
		return res, err
	}
	info, err := vs.Info(ctx, jetstream.WithSubjectFilter(prefix+".verdicts.*.allowed"))
	if err != nil {
		return res, err
	}
	var allowed uint64
	for _, c := range info.State.Subjects {
		allowed += c
	}
	if info.State.Msgs != uint64(res.Requests) || allowed != uint64(res.Requests) {
		return res, fmt.Errorf("bench: the processor published %d verdicts, %d of them allowed; the workload holds %d requests, all healthy", info.State.Msgs, allowed, res.Requests)
	}
	return res, nil
}

// createConsumers runs a processor of cfg until its consumers exist, then
// drains it, so that a measurement does not count their creation.
func createConsumers(ctx context.Context, js jetstream.JetStream, cfg processor.Config) error {
	p, err := processor.New(ctx, js, cfg, procOpts()...)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	for p.Ready() != nil {
		select {
		case err := <-done:
			cancel()
			return fmt.Errorf("bench: processor stopped while starting: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	return <-done
}

// process runs p until it has handled want inputs and acknowledged every
// one, and returns how long that took.
func process(ctx context.Context, js jetstream.JetStream, p *processor.Processor, want uint64) (time.Duration, error) {
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
	for decided()-before < want {
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

// consumeRaw reads n messages from stream with one durable pull consumer,
// fetching in batches and acknowledging each message, and returns how long
// that took until the server held no ack pending.
func consumeRaw(ctx context.Context, js jetstream.JetStream, stream string, n, maxAckPending int) (time.Duration, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: maxAckPending,
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
	for _, s := range []string{n.Events, n.Verdicts, "KV_" + n.Sessions, "OBJ_" + n.Spills} {
		_ = js.DeleteStream(ctx, s)
	}
}
