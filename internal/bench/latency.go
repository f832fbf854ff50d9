package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// LatencyResult compares the time from publishing a compaction request to
// receiving its verdict with a raw round trip: publish into a stream, a
// durable pull consumer reads it, publishes a reply into a second stream
// and acknowledges; the client receives the reply. Requests alternate
// between the two, one at a time, with the same body.
type LatencyResult struct {
	Requests  int         `json:"requests"`
	Seamguard Percentiles `json:"seamguard"`
	Raw       Percentiles `json:"raw"`
}

// Percentiles of a latency sample, in seconds.
type Percentiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))].Seconds() }
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: s[len(s)-1].Seconds(), Mean: sum.Seconds() / float64(len(s))}
}

func runLatency(ctx context.Context, s *server, n int, progress func(string, ...any)) (*LatencyResult, error) {
	cfg := benchProcessorConfig("benchl")
	p, err := processor.New(ctx, s.js, cfg, procOpts()...)
	if err != nil {
		return nil, err
	}
	defer dropResources(context.WithoutCancel(ctx), s.js, cfg)
	g := newGen(cfg.Subjects(), Seed+1)
	// Requests go round-robin to 50 sessions: a session remembers every
	// request_id it decided, and one session asked thousands of times
	// would measure that instead.
	const sessions = 50
	name := func(i int) string { return fmt.Sprintf("latency-%02d", i%sessions) }
	var setup []*nats.Msg
	for s := range sessions {
		setup = append(setup, g.open(name(s), 12))
		for i := range 100 {
			setup = append(setup, g.turn(name(s), uint64(i), 1<<10))
		}
	}
	if _, err := publishAll(ctx, s.js, setup, 1024); err != nil {
		return nil, err
	}

	// The raw responder: a durable pull consumer on a stream of its own that
	// answers every message into a second stream, then acknowledges it.
	for _, st := range []jetstream.StreamConfig{
		{Name: "BENCHL_RAW_IN", Subjects: []string{"benchlraw.in.>"}, Storage: jetstream.FileStorage},
		{Name: "BENCHL_RAW_OUT", Subjects: []string{"benchlraw.out.>"}, Storage: jetstream.FileStorage},
	} {
		if _, err := s.js.CreateStream(ctx, st); err != nil {
			return nil, err
		}
		defer s.js.DeleteStream(context.WithoutCancel(ctx), st.Name)
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, "BENCHL_RAW_IN", jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
	})
	if err != nil {
		return nil, err
	}
	rctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	rawDone := make(chan error, 1)
	go func() { rawDone <- rawResponder(rctx, s.js, cons) }()
	procDone := make(chan error, 1)
	go func() { procDone <- p.Run(rctx) }()
	defer func() {
		stopAll()
		<-rawDone
		<-procDone
	}()

	verdicts, err := s.nc.SubscribeSync(cfg.Subjects().Prefix + ".verdicts.*.*")
	if err != nil {
		return nil, err
	}
	defer verdicts.Unsubscribe()
	replies, err := s.nc.SubscribeSync("benchlraw.out.>")
	if err != nil {
		return nil, err
	}
	defer replies.Unsubscribe()

	// Warm up both paths until each answers, then measure.
	head := uint64(100)
	ask := func(i int, raw bool) (time.Duration, error) {
		session := name(i)
		m := g.request(session, fmt.Sprintf("r%d", i), head, 20)
		sub := verdicts
		if raw {
			m.Subject = "benchlraw.in." + session
			sub = replies
		}
		start := time.Now()
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			return 0, err
		}
		reply, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			return 0, fmt.Errorf("bench: no answer to request %d (raw: %v) within 10s: %w", i, raw, err)
		}
		d := time.Since(start)
		if !raw && !strings.HasSuffix(reply.Subject, "."+events.KindAllowed) {
			return 0, fmt.Errorf("bench: request %d got %s, want an allowed verdict", i, reply.Subject)
		}
		return d, nil
	}
	progress("latency: %d requests each, alternating", n)
	var sg, rw []time.Duration
	for i := -20; i < n; i++ {
		for _, raw := range []bool{i%2 == 0, i%2 != 0} {
			d, err := ask(i+1000, raw)
			if err != nil {
				return nil, err
			}
			if i < 0 {
				continue
			}
			if raw {
				rw = append(rw, d)
			} else {
				sg = append(sg, d)
			}
		}
	}
	return &LatencyResult{Requests: n, Seamguard: percentiles(sg), Raw: percentiles(rw)}, nil
}

// rawResponder fetches like the processor does (batches, a one second
// wait), publishes each message's body as a reply into the second stream,
// waits for its ack, and acknowledges the input.
func rawResponder(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer) error {
	for ctx.Err() == nil {
		batch, err := cons.Fetch(processor.DefaultMaxBatch*2, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			continue
		}
		for m := range batch.Messages() {
			reply := nats.NewMsg("benchlraw.out." + strings.TrimPrefix(m.Subject(), "benchlraw.in."))
			reply.Data = m.Data()
			f, err := js.PublishMsgAsync(reply)
			if err != nil {
				return err
			}
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return nil
			}
			if err := m.Ack(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
				return err
			}
		}
	}
	return nil
}
