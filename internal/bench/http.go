package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/gateway"
	"github.com/seamguard/seamguard/processor"
)

// HTTPResult compares the HTTP gateway (serve --http-listen) with NATS,
// on one server and one running processor, in one run:
//
//   - ingest: events/s from the first publish until the processor has
//     decided every event, published by an agent on NATS (asynchronous
//     publishes, at most 4,096 acks outstanding) or posted to the gateway
//     (binary mode, one event a request; and batched mode), each HTTP
//     client sending its own sessions' events in order, as an agent would;
//   - latency: a compaction request to its verdict, on NATS (publish, the
//     verdict heard on its subject) and over HTTP (POST ?wait=, the
//     verdict in the answer), alternating.
type HTTPResult struct {
	Events      int `json:"events"`
	BodyBytes   int `json:"body_bytes"`
	Sessions    int `json:"sessions"`
	Rounds      int `json:"rounds"`
	Concurrency int `json:"concurrency"` // HTTP clients at once
	BatchEvents int `json:"batch_events"`

	NATSPerSec   float64 `json:"nats_per_sec"`
	BinaryPerSec float64 `json:"binary_per_sec"`
	BatchPerSec  float64 `json:"batch_per_sec"`
	BinaryRatio  float64 `json:"binary_ratio"` // binary / NATS
	BatchRatio   float64 `json:"batch_ratio"`  // batched / NATS
	NATSRounds   []Round `json:"nats_rounds"`
	BinaryRounds []Round `json:"binary_rounds"`
	BatchRounds  []Round `json:"batch_rounds"`

	Requests     int         `json:"requests"`
	NATSLatency  Percentiles `json:"nats_latency"`
	HTTPLatency  Percentiles `json:"http_latency"`
	LatencyRatio float64     `json:"latency_ratio"` // p50 HTTP / p50 NATS
}

// httpConcurrency is how many HTTP clients post at once; httpBatch how
// many events a batched request holds.
const (
	httpConcurrency = 16
	httpBatch       = 100
)

func runHTTP(ctx context.Context, s *server, n, sessions, rounds, requests int, progress func(string, ...any)) (*HTTPResult, error) {
	res := &HTTPResult{Events: n, BodyBytes: 1 << 10, Sessions: sessions, Rounds: rounds, Concurrency: httpConcurrency, BatchEvents: httpBatch, Requests: requests}
	cfg := benchProcessorConfig("benchh")
	defer dropResources(context.WithoutCancel(ctx), s.js, cfg)
	p, err := processor.New(ctx, s.js, cfg, procOpts()...)
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Config{
		Subjects: cfg.Subjects(), EventsStream: cfg.Names().Events, VerdictsStream: cfg.Names().Verdicts,
		Agent: s.nc, Operator: s.nc, Reader: s.js, Verdicts: s.js,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	hs := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * httpConcurrency}, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() { stop(); <-done }()
	decided := func() uint64 { st := p.Stats(); return st.Handled + st.CaughtUp }
	// timed sends one round's events by send and waits until the
	// processor has decided them all.
	timed := func(what string, out *[]Round, msgs []*nats.Msg, send func([]*nats.Msg) error) error {
		m := s.meter()
		before := decided()
		start := time.Now()
		if err := send(msgs); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		for decided()-before < uint64(len(msgs)) {
			select {
			case err := <-done:
				return fmt.Errorf("bench: processor stopped: %v", err)
			default:
			}
			if err := waitCtx(ctx, time.Millisecond); err != nil {
				return err
			}
		}
		*out = append(*out, Round{PerSec: float64(len(msgs)) / time.Since(start).Seconds(), Usage: m.stop()})
		return nil
	}
	for r := range rounds {
		progress("http: round %d of %d: %d events on NATS, over HTTP one a request and in batches of %d", r+1, rounds, n, httpBatch)
		viaNATS := ingestEvents(cfg.Subjects(), fmt.Sprintf("n%d", r), sessions, n, res.BodyBytes)
		viaBinary := ingestEvents(cfg.Subjects(), fmt.Sprintf("h%d", r), sessions, n, res.BodyBytes)
		viaBatch := ingestEvents(cfg.Subjects(), fmt.Sprintf("b%d", r), sessions, n, res.BodyBytes)
		if err := timed("NATS", &res.NATSRounds, viaNATS, func(msgs []*nats.Msg) error {
			_, err := publishAll(ctx, s.js, msgs, 4096)
			return err
		}); err != nil {
			return nil, err
		}
		if err := timed("HTTP binary mode", &res.BinaryRounds, viaBinary, func(msgs []*nats.Msg) error {
			return postAll(ctx, client, base, msgs, 1)
		}); err != nil {
			return nil, err
		}
		if err := timed("HTTP batched mode", &res.BatchRounds, viaBatch, func(msgs []*nats.Msg) error {
			return postAll(ctx, client, base, msgs, httpBatch)
		}); err != nil {
			return nil, err
		}
	}
	res.NATSPerSec, res.BinaryPerSec, res.BatchPerSec = median(res.NATSRounds), median(res.BinaryRounds), median(res.BatchRounds)
	res.BinaryRatio, res.BatchRatio = ratio(res.BinaryPerSec, res.NATSPerSec), ratio(res.BatchPerSec, res.NATSPerSec)

	if err := httpLatency(ctx, s, cfg, client, base, res); err != nil {
		return nil, err
	}
	// Every request of the workload was allowed, whichever way it came.
	vs, err := s.js.Stream(ctx, cfg.Names().Verdicts)
	if err != nil {
		return nil, err
	}
	info, err := vs.Info(ctx, jetstream.WithSubjectFilter(cfg.Subjects().VerdictsWildcard("allowed")))
	if err != nil {
		return nil, err
	}
	var allowed uint64
	for _, c := range info.State.Subjects {
		allowed += c
	}
	if allowed != info.State.Msgs {
		return nil, fmt.Errorf("bench: http: %d of %d verdicts are allowed; the workload's requests are all healthy", allowed, info.State.Msgs)
	}
	return res, nil
}

// postAll posts msgs to the gateway at base: httpConcurrency clients, each
// with the events of its sessions in order, per events in a request (1:
// binary mode, more: batched mode).
func postAll(ctx context.Context, client *http.Client, base string, msgs []*nats.Msg, per int) error {
	lanes := make([][]*nats.Msg, httpConcurrency)
	lane := map[string]int{}
	for _, m := range msgs {
		s := m.Header.Get("ce-subject")
		i, ok := lane[s]
		if !ok {
			i = len(lane) % httpConcurrency
			lane[s] = i
		}
		lanes[i] = append(lanes[i], m)
	}
	errs := make(chan error, httpConcurrency)
	var wg sync.WaitGroup
	for _, l := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(l) > 0 && ctx.Err() == nil {
				k := min(per, len(l))
				var err error
				if per == 1 {
					err = postBinary(ctx, client, base, l[0])
				} else {
					err = postBatch(ctx, client, base, l[:k])
				}
				if err != nil {
					errs <- err
					return
				}
				l = l[k:]
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(<-errs, ctx.Err())
}

// postBinary posts m as a binary-mode CloudEvent: its ce- headers and
// Content-Type as HTTP headers, its data as the body.
func postBinary(ctx context.Context, client *http.Client, base string, m *nats.Msg) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", bytes.NewReader(m.Data))
	if err != nil {
		return err
	}
	for k, v := range m.Header {
		if strings.HasPrefix(strings.ToLower(k), "ce-") || k == "Content-Type" {
			req.Header[http.CanonicalHeaderKey(k)] = v
		}
	}
	return send(client, req, http.StatusAccepted)
}

// postBatch posts msgs as one batched-mode request: each event in
// structured form, in an array.
func postBatch(ctx context.Context, client *http.Client, base string, msgs []*nats.Msg) error {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := appendStructured(&b, m); err != nil {
			return err
		}
	}
	b.WriteByte(']')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", &b)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	return send(client, req, http.StatusAccepted)
}

// appendStructured writes binary-mode m as a structured CloudEvent.
func appendStructured(b *bytes.Buffer, m *nats.Msg) error {
	b.WriteByte('{')
	for i, a := range []string{"specversion", "id", "source", "type", "subject", "time"} {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(a)
		v, err := json.Marshal(m.Header.Get("ce-" + a))
		if err != nil {
			return err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString(`,"datacontenttype":"application/json","data":`)
	b.Write(m.Data)
	b.WriteByte('}')
	return nil
}

// send sends req and reads the answer, an error unless its status is want.
func send(client *http.Client, req *http.Request, want int) error {
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("bench: %s %s: %w", req.Method, req.URL.Path, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("bench: %s %s: %w", req.Method, req.URL.Path, err)
	}
	if res.StatusCode != want {
		return fmt.Errorf("bench: %s %s: %d, want %d: %s", req.Method, req.URL.Path, res.StatusCode, want, events.Excerpt(string(body)))
	}
	return nil
}

// httpLatency measures res.Requests requests each way, alternating, on
// sessions of their own (50 each way: a session remembers the requests it
// decided).
func httpLatency(ctx context.Context, s *server, cfg processor.Config, client *http.Client, base string, res *HTTPResult) error {
	g := newGen(cfg.Subjects(), Seed+2)
	const sessions = 50
	const head = 100
	name := func(way string, i int) string { return fmt.Sprintf("l%s-%02d", way, i%sessions) }
	var setup []*nats.Msg
	for i := range sessions {
		for _, way := range []string{"n", "h"} {
			setup = append(setup, g.open(name(way, i), 12))
			for o := range head {
				setup = append(setup, g.turn(name(way, i), uint64(o), 1<<10))
			}
		}
	}
	if _, err := publishAll(ctx, s.js, setup, 1024); err != nil {
		return err
	}
	verdicts := make(chan *nats.Msg, 64)
	for i := range sessions {
		sub, err := s.nc.ChanSubscribe(cfg.Subjects().Verdict(name("n", i), "*"), verdicts)
		if err != nil {
			return err
		}
		defer sub.Unsubscribe()
	}
	ask := func(i int, viaHTTP bool) (time.Duration, error) {
		way := "n"
		if viaHTTP {
			way = "h"
		}
		m := g.request(name(way, i), fmt.Sprintf("r%d", i), head, 20)
		start := time.Now()
		if viaHTTP {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events?wait=10s", bytes.NewReader(m.Data))
			if err != nil {
				return 0, err
			}
			for k, v := range m.Header {
				if strings.HasPrefix(strings.ToLower(k), "ce-") || k == "Content-Type" {
					req.Header[http.CanonicalHeaderKey(k)] = v
				}
			}
			if err := send(client, req, http.StatusOK); err != nil {
				return 0, fmt.Errorf("bench: request %d over HTTP got no verdict in 10s: %w", i, err)
			}
			return time.Since(start), nil
		}
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			return 0, err
		}
		select {
		case v := <-verdicts:
			if !strings.HasSuffix(v.Subject, "."+events.KindAllowed) {
				return 0, fmt.Errorf("bench: request %d got %s, want an allowed verdict", i, v.Subject)
			}
		case <-time.After(10 * time.Second):
			return 0, fmt.Errorf("bench: no verdict for request %d on NATS within 10s", i)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return time.Since(start), nil
	}
	var viaNATS, viaHTTP []time.Duration
	for i := -20; i < res.Requests; i++ {
		for _, h := range []bool{i%2 == 0, i%2 != 0} {
			d, err := ask(i+1000, h)
			if err != nil {
				return err
			}
			if i < 0 {
				continue
			}
			if h {
				viaHTTP = append(viaHTTP, d)
			} else {
				viaNATS = append(viaNATS, d)
			}
		}
	}
	res.NATSLatency, res.HTTPLatency = percentiles(viaNATS), percentiles(viaHTTP)
	res.LatencyRatio = ratio(res.HTTPLatency.P50, res.NATSLatency.P50)
	return nil
}
