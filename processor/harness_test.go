package processor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// testSource is the CloudEvents source of every verdict in these tests.
const testSource = "urn:seamguard:test"

// fixedNow stamps every verdict, so that runs compare byte for byte.
func fixedNow() time.Time { return time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC) }

// baseConfig is the configuration of most tests: file storage (the real
// thing), a fixed source, everything else at its default.
// baseConfig puts every session in one partition, so that one consumer
// (durable(cfg)) sees every valid event, with a short LeaseTTL.
func baseConfig() processor.Config {
	return processor.Config{Source: testSource, Partitions: 1, LeaseTTL: 2 * time.Second}
}

// env is one in-process nats-server with a client connection.
type env struct {
	*embedded.Test
	ctx context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &env{Test: embedded.StartTest(t), ctx: ctx}
}

// running is a Processor whose Run is in a goroutine.
type running struct {
	p      *processor.Processor
	cancel context.CancelFunc
	done   chan error
	err    error
	ended  bool
}

func (e *env) start(t *testing.T, cfg processor.Config) *running {
	t.Helper()
	// The processor's warnings go to the test's output, which is shown when
	// the test fails (or with -v); SEAMGUARD_TEST_LOG=debug (or info, error)
	// sets another level.
	level := slog.LevelWarn
	if lv := os.Getenv("SEAMGUARD_TEST_LOG"); lv != "" {
		require.NoError(t, level.UnmarshalText([]byte(lv)))
	}
	out := t.Output()
	opts := []processor.Option{processor.WithClock(fixedNow),
		processor.WithLogger(slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})))}
	p, err := processor.New(e.ctx, e.JS, cfg, opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(e.ctx)
	r := &running{p: p, cancel: cancel, done: make(chan error, 1)}
	liveRuns.Store(r, struct{}{})
	go func() {
		err := p.Run(ctx)
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			// Stopped on its own: say so now, since a test waiting for it
			// to finish its work would only time out.
			fmt.Fprintf(out, "processor instance stopped on its own: %v\n", err)
		}
		r.done <- err
	}()
	t.Cleanup(func() {
		if !r.ended {
			r.p.Abort()
			r.wait(t)
		}
	})
	return r
}

// liveRuns holds the instances running now, for diagnose.
var liveRuns sync.Map

// wait waits (with a deadline) for Run to return and returns its error.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	if r.ended {
		return r.err
	}
	select {
	case r.err = <-r.done:
		r.ended = true
		liveRuns.Delete(r)
		return r.err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s")
		return nil
	}
}

// stop cancels Run's context (a graceful drain) and waits for it.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// abort stops Run as a crash would and waits for it.
func (r *running) abort(t *testing.T) {
	t.Helper()
	r.p.Abort()
	_ = r.wait(t)
}

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consumerInfo adds up the state of every consumer of the processor: the
// partitions' and the one for subjects that name no session. Counts are
// summed, sequences are the highest.
func (e *env) consumerInfo(t *testing.T, cfg processor.Config) *jetstream.ConsumerInfo {
	t.Helper()
	info, err := e.allConsumers(cfg)
	require.NoError(t, err)
	return info
}

func (e *env) allConsumers(cfg processor.Config) (*jetstream.ConsumerInfo, error) {
	parts := cfg.Partitions
	if parts == 0 {
		parts = processor.DefaultPartitions
	}
	var sum jetstream.ConsumerInfo
	for p := -1; p < parts; p++ {
		c, err := e.JS.Consumer(e.ctx, cfg.Names().Events, cfg.ConsumerName(p))
		if err != nil {
			return nil, err
		}
		info, err := c.Info(e.ctx)
		if err != nil {
			return nil, err
		}
		sum.NumPending += info.NumPending
		sum.NumAckPending += info.NumAckPending
		sum.NumRedelivered += info.NumRedelivered
		sum.Delivered.Stream = max(sum.Delivered.Stream, info.Delivered.Stream)
		sum.AckFloor.Stream = max(sum.AckFloor.Stream, info.AckFloor.Stream)
	}
	return &sum, nil
}

// durable is the consumer of the only partition of baseConfig.
func durable(cfg processor.Config) string { return cfg.ConsumerName(0) }

func (e *env) streamInfo(t *testing.T, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := e.JS.Stream(e.ctx, name)
	require.NoError(t, err)
	info, err := s.Info(e.ctx)
	require.NoError(t, err)
	return info
}

// waitIdle waits until the processor has delivered and acknowledged every
// message of the events stream.
func (e *env) waitIdle(t *testing.T, cfg processor.Config, timeout time.Duration) {
	t.Helper()
	var last string // what the last look found, for the failure message
	deadline := time.Now().Add(timeout)
	for {
		s, err := e.JS.Stream(e.ctx, cfg.Names().Events)
		if err == nil {
			var si *jetstream.StreamInfo
			if si, err = s.Info(e.ctx); err == nil {
				var info *jetstream.ConsumerInfo
				if info, err = e.allConsumers(cfg); err == nil {
					if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= si.State.LastSeq {
						return
					}
					last = fmt.Sprintf("stream last seq %d; consumers: %d pending, %d ack pending, %d redelivered, delivered up to %d, ack floor %d",
						si.State.LastSeq, info.NumPending, info.NumAckPending, info.NumRedelivered, info.Delivered.Stream, info.AckFloor.Stream)
				}
			}
		}
		if err != nil {
			last = "error: " + err.Error()
		}
		if time.Now().After(deadline) {
			e.diagnose(t, cfg)
			t.Fatalf("timed out after %s waiting for the processor to handle every event; last seen: %s", timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// diagnose writes what a stalled run looks like: each consumer and stream
// with its cluster placement, and the processor's goroutines (the stacks
// under this package), so that a stall seen once in CI can be read.
func (e *env) diagnose(t *testing.T, cfg processor.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	placement := func(c *jetstream.ClusterInfo) string {
		if c == nil {
			return "single server"
		}
		s := "leader " + c.Leader
		for _, r := range c.Replicas {
			s += fmt.Sprintf(", %s current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
		}
		return s
	}
	n := cfg.Names()
	for _, name := range []string{n.Events, n.Verdicts, "KV_" + n.Sessions, "KV_" + n.Leases} {
		s, err := e.JS.Stream(ctx, name)
		if err != nil {
			t.Logf("diagnose: stream %s: %v", name, err)
			continue
		}
		si, err := s.Info(ctx)
		if err != nil {
			t.Logf("diagnose: stream %s: %v", name, err)
			continue
		}
		t.Logf("diagnose: stream %s: %d msgs, last seq %d; %s", name, si.State.Msgs, si.State.LastSeq, placement(si.Cluster))
	}
	if kv, err := e.JS.KeyValue(ctx, n.Leases); err == nil {
		if lister, err := kv.ListKeys(ctx); err == nil {
			for k := range lister.Keys() {
				en, err := kv.Get(ctx, k)
				if err != nil {
					t.Logf("diagnose: lease key %s: %v", k, err)
					continue
				}
				t.Logf("diagnose: lease key %s = %s, revision %d, written %s ago", k, en.Value(), en.Revision(), time.Since(en.Created()).Round(time.Millisecond))
			}
		}
	}
	parts := cfg.Partitions
	if parts == 0 {
		parts = processor.DefaultPartitions
	}
	// Twice, a few seconds apart: whether a stuck consumer's deliveries
	// still move (redeliveries raise its delivery count) shows.
	for look := range 2 {
		if look > 0 {
			time.Sleep(3 * time.Second)
		}
		e.diagnoseConsumers(t, ctx, cfg, parts, placement)
	}
	liveRuns.Range(func(k, _ any) bool {
		r := k.(*running)
		for name, w := range r.p.AckWindows() {
			t.Logf("diagnose: instance %p: ack window of %s: %s", r.p, name, w)
		}
		return true
	})
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "seamguard/processor.") {
			t.Logf("diagnose: goroutines\n%s", g)
		}
	}
}

// diagnoseConsumers writes the state of every consumer of cfg.
func (e *env) diagnoseConsumers(t *testing.T, ctx context.Context, cfg processor.Config, parts int, placement func(*jetstream.ClusterInfo) string) {
	t.Helper()
	n := cfg.Names()
	for p := -1; p < parts; p++ {
		c, err := e.JS.Consumer(ctx, n.Events, cfg.ConsumerName(p))
		if err != nil {
			t.Logf("diagnose: consumer %d: %v", p, err)
			continue
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Logf("diagnose: consumer %d: %v", p, err)
			continue
		}
		t.Logf("diagnose: consumer %s: pending %d, ack pending %d, redelivered %d, waiting %d, delivered %d (delivery %d), ack floor %d (delivery %d); %s",
			ci.Name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered.Stream, ci.Delivered.Consumer, ci.AckFloor.Stream, ci.AckFloor.Consumer, placement(ci.Cluster))
	}
}

// verdictMsg is one message of the verdict stream.
type verdictMsg struct {
	seq     uint64
	subject string
	header  nats.Header
	body    []byte
	v       *events.Verdict
}

// readStream returns every message of a stream, in order.
func (e *env) readStream(t *testing.T, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := e.JS.Stream(e.ctx, name)
	require.NoError(t, err)
	info, err := s.Info(e.ctx)
	require.NoError(t, err)
	if info.State.Msgs == 0 {
		return nil
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; {
		m, err := s.GetMsg(e.ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		require.NoError(t, err)
		out = append(out, m)
		seq = m.Sequence + 1
	}
	return out
}

func (e *env) verdicts(t *testing.T, cfg processor.Config) []verdictMsg {
	t.Helper()
	var out []verdictMsg
	for _, m := range e.readStream(t, cfg.Names().Verdicts) {
		v, err := events.DecodeVerdict(m.Data)
		require.NoError(t, err, "verdict at %d: %s", m.Sequence, m.Data)
		out = append(out, verdictMsg{seq: m.Sequence, subject: m.Subject, header: m.Header, body: m.Data, v: v})
	}
	return out
}

// verdictBodies maps every verdict id to its body and fails on an id that
// occurs twice in the stream.
func verdictBodies(t *testing.T, vs []verdictMsg) map[string]string {
	t.Helper()
	out := make(map[string]string, len(vs))
	for _, v := range vs {
		if prev, dup := out[v.v.ID]; dup {
			t.Errorf("verdict %s is in the stream twice (seq %d):\n%s\n%s", v.v.ID, v.seq, prev, v.body)
		}
		out[v.v.ID] = string(v.body)
		if h := v.header.Get(jetstream.MsgIDHeader); h != "" {
			require.Equal(t, v.v.ID, h, "Nats-Msg-Id of %s", v.v.ID)
		}
	}
	return out
}

// kvStates returns the raw value of every key of the session bucket.
func (e *env) kvStates(t *testing.T, cfg processor.Config) map[string][]byte {
	t.Helper()
	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)
	keys, err := kv.ListKeys(e.ctx)
	require.NoError(t, err)
	out := map[string][]byte{}
	for k := range keys.Keys() {
		if strings.HasPrefix(k, processor.FloorKeyPrefix) {
			continue // a partition's floor, not a session's state
		}
		ent, err := kv.Get(e.ctx, k)
		require.NoError(t, err)
		out[k] = ent.Value()
	}
	return out
}

// requireSameStates compares two bucket snapshots session by session.
func requireSameStates(t *testing.T, want, got map[string][]byte) {
	t.Helper()
	require.Equal(t, sortedKeys(want), sortedKeys(got), "sessions in the bucket")
	for k, w := range want {
		if !bytes.Equal(w, got[k]) {
			ws, werr := processor.UnmarshalState(w)
			gs, gerr := processor.UnmarshalState(got[k])
			t.Errorf("session %s: state differs: want seq %d (%v), got seq %d (%v)", k, ws.Seq, werr, gs.Seq, gerr)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// readLines reads a JSON Lines file of the repository's testdata.
func readLines(t *testing.T, rel string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", rel))
	require.NoError(t, err)
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(l)) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// publishAll publishes msgs in order, asynchronously, and waits for every
// ack. It returns the stream sequence of each.
func (e *env) publishAll(t *testing.T, msgs []*nats.Msg) []uint64 {
	t.Helper()
	return e.publishWindows(t, msgs, false)
}

// publishOrdered is publishAll for a server that may fail meanwhile: a
// window never holds two messages of one session. The client republishes
// a message the server answered "no responders" (a stream leader moving) a
// moment later, after the rest of its window, so two messages of one
// session in flight at once could be stored in the wrong order.
func (e *env) publishOrdered(t *testing.T, msgs []*nats.Msg) []uint64 {
	t.Helper()
	return e.publishWindows(t, msgs, true)
}

// publishWindows publishes in windows, so that the client's limit on
// outstanding asynchronous publishes never stalls a large workload; with
// perSession set, a window never holds two messages of one session. Either
// way it fails if the stream stored a session's messages out of order.
func (e *env) publishWindows(t *testing.T, msgs []*nats.Msg, perSession bool) []uint64 {
	t.Helper()
	const window = 1000
	seqs := make([]uint64, len(msgs))
	dup := make([]bool, len(msgs))
	inWindow := make(map[string]bool, window)
	for lo := 0; lo < len(msgs); {
		clear(inWindow)
		hi := lo
		for hi < len(msgs) && hi-lo < window {
			key := sessionToken(msgs[hi].Subject)
			if perSession && inWindow[key] {
				break
			}
			inWindow[key] = true
			hi++
		}
		futs := make([]jetstream.PubAckFuture, hi-lo)
		for i := lo; i < hi; i++ {
			f, err := e.JS.PublishMsgAsync(msgs[i])
			require.NoError(t, err)
			futs[i-lo] = f
		}
		for k, f := range futs {
			i := lo + k
			select {
			case ack := <-f.Ok():
				seqs[i], dup[i] = ack.Sequence, ack.Duplicate
			case err := <-f.Err():
				// A cluster electing a stream leader (a server stopped)
				// answers no one for a moment: sent again, under its
				// Nats-Msg-Id, it is stored once. The window holds no
				// other message of its session.
				ack, err := e.republish(msgs[i], err)
				if err != nil {
					t.Fatalf("publish %d (%s): %v", i, msgs[i].Subject, err)
				}
				seqs[i], dup[i] = ack.Sequence, ack.Duplicate
			case <-time.After(30 * time.Second):
				t.Fatalf("publish %d: no ack", i)
			}
		}
		lo = hi
	}
	requireStoredInOrder(t, msgs, seqs, dup)
	return seqs
}

// republish sends msg again, one at a time, while its publish fails as
// a cluster that cannot serve for a moment fails it (first), for at most
// 30 seconds.
func (e *env) republish(msg *nats.Msg, first error) (*jetstream.PubAck, error) {
	err := first
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if !processor.Unreachable(err) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		var ack *jetstream.PubAck
		ack, err = e.JS.PublishMsg(ctx, msg)
		cancel()
		if err == nil {
			return ack, nil
		}
	}
	return nil, err
}

// sessionToken is the last token of a subject: the session of an events or
// control subject.
func sessionToken(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// requireStoredInOrder fails when the stream holds two messages of one
// session in another order than they were published in (a duplicate, acked
// with the first copy's sequence, is not a reordering).
func requireStoredInOrder(t *testing.T, msgs []*nats.Msg, seqs []uint64, dup []bool) {
	t.Helper()
	last := make(map[string]uint64)
	for i, m := range msgs {
		if dup[i] {
			continue
		}
		key := sessionToken(m.Subject)
		if prev, ok := last[key]; ok && seqs[i] < prev {
			t.Fatalf("message %d of session %s stored at sequence %d, before one published earlier (at %d): the publisher reordered the session", i, key, seqs[i], prev)
		}
		last[key] = max(last[key], seqs[i])
	}
}

// describe prints a verdict short enough for a failure message.
func describe(v *events.Verdict) string {
	b, _ := json.Marshal(v.Data)
	return fmt.Sprintf("%s %s cause=%s %s", v.Type, v.Session, v.Cause.ID, strings.TrimSpace(string(b)))
}
