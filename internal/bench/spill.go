package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/heapwatch"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// SpillResult compares writing a spill (reading the transcript from the
// events stream, replaying it, streaming it into the object store) with a
// raw object store put of the very bytes the spill stored, read from a
// local file. The biggest transcript is spilled and put Rounds times,
// interleaved; the figures are the medians (a raw put's speed varied from
// 280 to 700 MB/s between single runs on the shared 2-core machine).
type SpillResult struct {
	Server     string  `json:"server"` // "in process": the heap includes the server's
	Bytes      uint64  `json:"bytes"`
	Events     uint64  `json:"events"`
	Rounds     int     `json:"rounds"`
	SpillSecs  float64 `json:"spill_seconds"` // Store.Write without read-back, median
	SpillMBps  float64 `json:"spill_mb_per_sec"`
	VerifySecs float64 `json:"verify_seconds"` // reading it back and checking the digest (serve's default adds this), first round
	PutSecs    float64 `json:"put_seconds"`    // median
	PutMBps    float64 `json:"put_mb_per_sec"`
	Ratio      float64 `json:"ratio"` // spill MB/s over put MB/s, of the medians
	// Pipe moves the same events through the broker as a spill does, with
	// nothing of seamguard: an ordered consumer reads the transcript's
	// messages and an object store put stores their bodies. What the
	// broker costs for reading and writing the bytes once each.
	PipeSecs    float64      `json:"pipe_seconds"` // median
	PipeMBps    float64      `json:"pipe_mb_per_sec"`
	PipeRatio   float64      `json:"pipe_ratio"`   // pipe MB/s over put MB/s
	RatioVerify float64      `json:"ratio_verify"` // the same with the read-back counted
	Peaks       []Peak       `json:"peaks"`
	Each        []SpillRound `json:"rounds_detail"`
	SpillUsage  Usage        `json:"spill_usage"` // of the first round
	PutUsage    Usage        `json:"put_usage"`   // of the first round
	// Amplification compares what a long-lived session's spills write
	// with incremental spills and with a whole transcript each time.
	Amplification *Amplification `json:"amplification"`
}

// Amplification is a session spilled Rounds times: each round one turn of
// about TurnBytes, its truncation and a compaction that puts it at risk,
// so that each round asks for a spill. Incremental is what the spills
// wrote (each the events after the previous spill); Full is what the same
// rounds write when every spill holds the whole transcript [0, head) (the
// size of the chain up to each round, summed: computed, not written).
type Amplification struct {
	Rounds           int     `json:"rounds"`
	TurnBytes        int     `json:"turn_bytes"`
	InitialBytes     uint64  `json:"initial_bytes"`     // the first spill: the session before the rounds
	IncrementalBytes uint64  `json:"incremental_bytes"` // every spill's size, the first one's included
	FullBytes        uint64  `json:"full_bytes"`
	Ratio            float64 `json:"ratio"`         // FullBytes over IncrementalBytes
	SpillSecs        float64 `json:"spill_seconds"` // mean Store.Write of one incremental spill
	FullSecs         float64 `json:"full_seconds"`  // Store.Write of the whole transcript once, at the last round
}

// SpillRound is one spill, one raw put and one raw pipe of the biggest
// transcript.
type SpillRound struct {
	SpillSecs  float64 `json:"spill_seconds"`
	PutSecs    float64 `json:"put_seconds"`
	PipeSecs   float64 `json:"pipe_seconds"`
	SpillUsage Usage   `json:"spill_usage"`
	PutUsage   Usage   `json:"put_usage"`
	PipeUsage  Usage   `json:"pipe_usage"`
}

// Peak is the heap growth while writing a spill of Bytes.
type Peak struct {
	Bytes      uint64 `json:"bytes"`
	PeakGrowth uint64 `json:"peak_heap_growth_bytes"`
}

func runSpill(ctx context.Context, s *server, scratch string, sizes []int64, rounds int, progress func(string, ...any)) (*SpillResult, error) {
	cfg := benchProcessorConfig("benchp")
	_, err := processor.Provision(ctx, s.js, cfg)
	if err != nil {
		return nil, err
	}
	rawObs := rawStore{js: s.js, bucket: cfg.Names().Spills}
	defer dropResources(context.WithoutCancel(ctx), s.js, cfg)
	store := &spill.Store{JS: s.js, Stream: cfg.Names().Events, Subjects: cfg.Subjects(), Bucket: cfg.Names().Spills}
	out := &SpillResult{Server: s.mode, Rounds: rounds}
	g := newGen(cfg.Subjects(), Seed+3)
	for k, size := range sizes {
		session := fmt.Sprintf("spill-%d", k)
		progress("spill: publishing a %d MiB transcript", size>>20)
		req, err := publishTranscript(ctx, s.js, g, cfg.Subjects(), session, size)
		if err != nil {
			return nil, err
		}
		progress("spill: writing it (%d events)", req.Events)
		m := s.meter()
		h, took, peak, err := sampled(func() (events.SpillHandle, error) { return store.Write(ctx, req) })
		if err != nil {
			return nil, err
		}
		first := SpillRound{SpillSecs: took.Seconds(), SpillUsage: m.stop()}
		out.Peaks = append(out.Peaks, Peak{Bytes: h.Size, PeakGrowth: peak})
		if k != len(sizes)-1 {
			continue
		}
		out.Bytes, out.Events = h.Size, h.Events

		// Read it back (the verification serve does by default), into a
		// file that the raw put then reads.
		if err := os.MkdirAll(scratch, 0o755); err != nil {
			return nil, err
		}
		path := filepath.Join(scratch, "transcript.jsonl")
		f, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		_, err = store.Get(ctx, h.Name, f)
		out.VerifySecs = time.Since(start).Seconds()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		defer os.Remove(path)
		for r := 0; r < rounds; r++ {
			round := first
			if r > 0 {
				progress("spill: round %d of %d: writing it again", r+1, rounds)
				m := s.meter()
				start := time.Now()
				if _, err := store.Write(ctx, req); err != nil {
					return nil, err
				}
				round = SpillRound{SpillSecs: time.Since(start).Seconds(), SpillUsage: m.stop()}
			}
			progress("spill: round %d of %d: raw object store put of the same %d MiB", r+1, rounds, h.Size>>20)
			m := s.meter()
			put, err := rawPut(ctx, rawObs, path)
			if err != nil {
				return nil, err
			}
			round.PutSecs, round.PutUsage = put.Seconds(), m.stop()
			progress("spill: round %d of %d: the same events read and put with no processing", r+1, rounds)
			m = s.meter()
			pipe, err := rawPipe(ctx, s.js, rawObs, cfg, req)
			if err != nil {
				return nil, err
			}
			round.PipeSecs, round.PipeUsage = pipe.Seconds(), m.stop()
			out.Each = append(out.Each, round)
		}
	}
	progress("spill: amplification, %d rounds of one turn each", 16*rounds)
	amp, err := runAmplification(ctx, s.js, store, cfg.Subjects(), g, 16*rounds)
	if err != nil {
		return nil, err
	}
	out.Amplification = amp
	spills, puts, pipes := make([]float64, len(out.Each)), make([]float64, len(out.Each)), make([]float64, len(out.Each))
	for i, r := range out.Each {
		spills[i], puts[i], pipes[i] = r.SpillSecs, r.PutSecs, r.PipeSecs
	}
	if len(out.Each) > 0 {
		out.SpillUsage, out.PutUsage = out.Each[0].SpillUsage, out.Each[0].PutUsage
	}
	out.SpillSecs, out.PutSecs, out.PipeSecs = medianOf(spills), medianOf(puts), medianOf(pipes)
	mb := float64(out.Bytes) / (1 << 20)
	out.SpillMBps, out.PutMBps, out.PipeMBps = mb/out.SpillSecs, mb/out.PutSecs, mb/out.PipeSecs
	out.Ratio, out.PipeRatio = out.SpillMBps/out.PutMBps, out.PipeMBps/out.PutMBps
	out.RatioVerify = out.PutSecs / (out.SpillSecs + out.VerifySecs)
	return out, nil
}

// rawPipe reads the messages of req's transcript with an ordered consumer
// pulling as the spill does, and puts their bodies, a line each, into the
// object store with its own Put through a pipe, in chunks of the spill's
// size: the broker's read-then-put as the spill uses the broker, with
// nothing of seamguard in it (no decoding, replay or encoding).
func rawPipe(ctx context.Context, js jetstream.JetStream, obs rawStore, cfg processor.Config, req ledger.SpillRequest) (time.Duration, error) {
	start := time.Now()
	cons, err := js.OrderedConsumer(ctx, cfg.Names().Events, jetstream.OrderedConsumerConfig{
		FilterSubjects: cfg.Subjects().SessionFilters(req.Session),
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    req.FirstSeq,
	})
	if err != nil {
		return 0, fmt.Errorf("bench: pipe: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(256, max(1<<20, int(js.Conn().MaxPayload()))))
	if err != nil {
		return 0, fmt.Errorf("bench: pipe: %w", err)
	}
	pr, pw := io.Pipe()
	go func() {
		defer it.Stop()
		bw := bufio.NewWriterSize(pw, 64<<10)
		for {
			msg, err := it.Next()
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			md, err := msg.Metadata()
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			bw.Write(msg.Data())
			bw.WriteByte('\n')
			if md.Sequence.Stream >= req.LastSeq {
				break
			}
		}
		pw.CloseWithError(bw.Flush())
	}()
	err = obs.put(ctx, pr, pipeChunk(js))
	pr.Close()
	if err != nil {
		return 0, fmt.Errorf("bench: pipe: %w", err)
	}
	return time.Since(start), nil
}

// pipeChunk is the chunk size spill.Store uses by default on js's
// connection.
func pipeChunk(js jetstream.JetStream) int {
	return min(spill.DefaultChunkSize, int(js.Conn().MaxPayload())/2)
}

func rawPut(ctx context.Context, obs rawStore, path string) (time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	start := time.Now()
	if err := obs.put(ctx, f, rawChunk); err != nil {
		return 0, fmt.Errorf("bench: raw put: %w", err)
	}
	return time.Since(start), nil
}

// rawChunk is the object store's default chunk size (nats.go's).
const rawChunk = 128 << 10

// rawInFlight is the bytes the raw puts keep in flight: the spill
// writer's (8 chunks of 512 KiB).
const rawInFlight = 4 << 20

// rawStore writes bytes into an object store bucket's stream as its chunks,
// the way an object store put does, with nothing of seamguard in it.
// nats.go's ObjectStore.Put is not used: it sends every chunk at once
// (its own publisher allows 4,000 pending), and a server that syncs every
// write before acknowledging falls behind and refuses the overflow of its
// stream's ingest queue with 429 (too many requests), failing the put. This
// one keeps rawInFlight bytes in flight, as the spill writer does. It
// writes no object info (one small message) and purges the chunks after.
type rawStore struct {
	js     jetstream.JetStream
	bucket string
}

func (o rawStore) put(ctx context.Context, r io.Reader, chunk int) error {
	subject := "$O." + o.bucket + ".C." + nuid.Next()
	window := max(1, rawInFlight/chunk)
	var flight []jetstream.PubAckFuture
	settle := func() error {
		f := flight[0]
		flight = flight[1:]
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-time.After(30 * time.Second):
			return errors.New("no publish ack within 30s")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		buf := make([]byte, chunk)
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			for len(flight) >= window {
				if err := settle(); err != nil {
					return err
				}
			}
			f, perr := o.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: buf[:n]}, jetstream.WithExpectStream(spill.StreamName(o.bucket)))
			if perr != nil {
				return perr
			}
			flight = append(flight, f)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return err
		}
	}
	for len(flight) > 0 {
		if err := settle(); err != nil {
			return err
		}
	}
	str, err := o.js.Stream(ctx, spill.StreamName(o.bucket))
	if err == nil {
		err = str.Purge(ctx, jetstream.WithPurgeSubject(subject))
	}
	return err
}

// sampled runs f while sampling the heap in use every 2ms, and returns its
// result, how long it took and the peak growth over the heap before it.
func sampled(f func() (events.SpillHandle, error)) (events.SpillHandle, time.Duration, uint64, error) {
	settledMemory()
	var h events.SpillHandle
	var err error
	base, peak, took := heapwatch.Peak(func() { h, err = f() })
	return h, took, peak - base, err
}

// publishTranscript publishes a session of 8 KiB turns until size bytes
// of them are in the stream, then a compaction request that puts turns at
// risk. It steps a ledger alongside with what it published, as the
// processor would, and returns the spill that ledger asks for.
func publishTranscript(ctx context.Context, js jetstream.JetStream, g *gen, subj events.Subjects, session string, size int64) (ledger.SpillRequest, error) {
	var l ledger.Ledger
	var head uint64
	var sent int64
	var req *ledger.SpillRequest
	apply := func(msgs []*nats.Msg) error {
		return publishStepped(ctx, js, subj, &l, msgs, func(r ledger.SpillRequest) error {
			req = &r
			return nil
		})
	}
	batch := []*nats.Msg{g.open(session, 12)}
	for sent < size {
		m := g.turn(session, head, 8<<10)
		head++
		sent += int64(len(m.Data))
		batch = append(batch, m)
		if len(batch) == 512 {
			if err := apply(batch); err != nil {
				return ledger.SpillRequest{}, err
			}
			batch = batch[:0]
		}
	}
	// The summary covers nothing: everything before the tail is at risk.
	batch = append(batch, g.msg(session, events.TypeCompactionRequested,
		fmt.Appendf(nil, `{"request_id":"big","summarizer_input":{"start":0,"end":%d},"summary_range":{"start":0,"end":0},"tail_start":%d}`, head, head-12)))
	if err := apply(batch); err != nil {
		return ledger.SpillRequest{}, err
	}
	if req == nil {
		return ledger.SpillRequest{}, fmt.Errorf("bench: the spill workload's compaction asked for no spill")
	}
	return *req, nil
}

// publishStepped publishes msgs and steps l with each, as the processor
// would, calling spill with every spill request l makes (which must Step
// its result before returning, if it is to go on).
func publishStepped(ctx context.Context, js jetstream.JetStream, subj events.Subjects, l *ledger.Ledger, msgs []*nats.Msg, spill func(ledger.SpillRequest) error) error {
	seqs, err := publishAll(ctx, js, msgs, 1024)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, subj)
		if err != nil {
			return err
		}
		ev.Meta.Seq = seqs[i]
		r, err := ledger.Step(l, ledger.Input{Event: ev}, ledger.Config{})
		if err != nil {
			return err
		}
		if r.Spill != nil {
			if err := spill(*r.Spill); err != nil {
				return err
			}
		}
	}
	return nil
}

// runAmplification opens a session with 64 turns of 8 KiB, spills it, then
// spills it again after each of rounds rounds of one 8 KiB turn, its
// truncation and a compaction that puts that turn at risk. A ledger is
// stepped alongside, as the processor would, and each spill request it
// makes (the stretch after the previous spill) is written.
func runAmplification(ctx context.Context, js jetstream.JetStream, store *spill.Store, subj events.Subjects, g *gen, rounds int) (*Amplification, error) {
	const session, turn, initial = "spill-amp", 8 << 10, 64
	a := &Amplification{Rounds: rounds, TurnBytes: turn}
	var (
		l      ledger.Ledger
		head   uint64
		prev   *ledger.SpillRequest // the ledger's previous request, as it made it
		chain  uint64               // the chain's bytes so far
		writes time.Duration
	)
	send := func(msgs ...*nats.Msg) error {
		return publishStepped(ctx, js, subj, &l, msgs, func(req ledger.SpillRequest) error {
			start := time.Now()
			h, err := store.Write(ctx, req)
			if err != nil {
				return err
			}
			if prev == nil {
				a.InitialBytes = h.Size
			} else {
				writes += time.Since(start)
			}
			chain += h.Size
			a.IncrementalBytes += h.Size
			a.FullBytes += chain
			prev = &req
			_, err = ledger.Step(&l, ledger.Input{Spill: &ledger.SpillResult{Handle: h}}, ledger.Config{})
			return err
		})
	}
	// Everything before the tail is at risk: the summary covers nothing.
	request := func(n int) *nats.Msg {
		return g.msg(session, events.TypeCompactionRequested,
			fmt.Appendf(nil, `{"request_id":"amp-%d","summarizer_input":{"start":0,"end":%d},"summary_range":{"start":0,"end":0},"tail_start":%d}`, n, head, head))
	}
	msgs := []*nats.Msg{g.open(session, 4)}
	for ; head < initial; head++ {
		msgs = append(msgs, g.turn(session, head, turn))
	}
	msgs = append(msgs, request(0))
	if err := send(msgs...); err != nil {
		return nil, err
	}
	for n := 1; n <= rounds; n++ {
		t := g.turn(session, head, turn)
		head++
		if err := send(t, g.truncate(session, events.Range{Start: head - 1, End: head}), request(n)); err != nil {
			return nil, err
		}
	}
	if prev == nil || prev.N != uint32(rounds+1) {
		return nil, fmt.Errorf("bench: the amplification workload asked for fewer spills than its %d rounds", rounds)
	}
	// The last round's transcript written whole once, for its time.
	whole := *prev
	whole.Name, whole.Previous, whole.MaxBytes = session+"/whole.jsonl", "", 0
	if info, err := store.Info(ctx, session+"/1.jsonl"); err == nil {
		if h, err := spill.HandleOf(info); err == nil {
			whole.FirstSeq = h.FirstSeq
		}
	}
	whole.Events = l.View().Accepted
	start := time.Now()
	if _, err := store.Write(ctx, whole); err != nil {
		return nil, err
	}
	a.FullSecs = time.Since(start).Seconds()
	a.SpillSecs = writes.Seconds() / float64(rounds)
	a.Ratio = ratio(float64(a.FullBytes), float64(a.IncrementalBytes))
	return a, nil
}
