package spill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor/ledger"
)

const testStream = "SEAMGUARD_EVENTS"

// harness is an in-process server with the events stream and the spills
// bucket, and a publisher that keeps a live ledger per session, as the
// processor would, to know which spill a compaction asks for.
type harness struct {
	t      testing.TB
	js     jetstream.JetStream
	stream jetstream.Stream
	subj   events.Subjects
	store  *Store

	live  map[string]*ledger.Ledger
	req   map[string]ledger.SpillRequest // the newest spill asked for, by session
	keep  bool                           // keep the expected spill lines
	lines map[string][][]byte            // accepted events, structured, by session
	ids   map[string][]string            // accepted event ids, by session
	n     int
	ctx   context.Context
}

func newHarness(t testing.TB, cfg func(*jetstream.StreamConfig)) *harness {
	t.Helper()
	env := embedded.StartTest(t)
	return setupHarness(t, env.JS, cfg)
}

// setupHarness creates the stream and the bucket through js.
func setupHarness(t testing.TB, js jetstream.JetStream, cfg func(*jetstream.StreamConfig)) *harness {
	t.Helper()
	ctx := testCtx(t)
	sc := jetstream.StreamConfig{
		Name:     testStream,
		Subjects: []string{"seamguard.events.*"},
		Storage:  jetstream.FileStorage,
	}
	if cfg != nil {
		cfg(&sc)
	}
	str, err := js.CreateStream(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: Bucket, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, js: js, stream: str,
		live: map[string]*ledger.Ledger{}, req: map[string]ledger.SpillRequest{},
		lines: map[string][][]byte{}, ids: map[string][]string{}, keep: true,
		ctx: ctx,
	}
	h.store = &Store{JS: js, Stream: testStream, Subjects: h.subj, Bucket: Bucket, Verify: true, Backoff: 10 * time.Millisecond}
	// The JetStream context starts its asynchronous publisher (a reply
	// subscription, a goroutine watching the connection) on first use and
	// keeps it: start it now, so that tests counting goroutines around a
	// Write see only what the Write leaves.
	f, err := js.PublishMsgAsync(nats.NewMsg("seamguard.warmup.nobody"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Ok():
	case <-f.Err():
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the warm-up publish")
	}
	return h
}

// testCtx is a context that ends with the test, and after two minutes
// (ten for the big spill).
func testCtx(t testing.TB) context.Context {
	d := 2 * time.Minute
	if os.Getenv("SEAMGUARD_BIG_SPILL") == "1" {
		d = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ce is one event to publish.
type ce struct {
	session string
	typ     string // without the io.seamguard. prefix
	data    any    // marshalled to JSON unless it is json.RawMessage
	id      string // generated when empty
	binary  bool
	body    []byte            // when set, published as is (structured mode)
	header  map[string]string // extra headers
	msgID   string            // Nats-Msg-Id; the CloudEvent id when empty
}

// publish publishes e, steps the live ledger with it if it decodes, and
// returns its stream sequence and whether the processor accepted it.
func (h *harness) publish(e ce) (uint64, bool) {
	h.t.Helper()
	m := h.msg(e)
	ack, err := h.js.PublishMsg(h.ctx, m)
	if err != nil {
		h.t.Fatal(err)
	}
	if ack.Duplicate {
		h.t.Fatalf("event %s was dropped as a duplicate by the stream", m.Header.Get(jetstream.MsgIDHeader))
	}
	return ack.Sequence, h.step(m, ack.Sequence)
}

// publishAll publishes many events asynchronously, at most 512 awaiting
// their acks, and steps the live ledger in order as the acks come back.
func (h *harness) publishAll(n int, next func(i int) ce) {
	h.t.Helper()
	type sent struct {
		m *nats.Msg
		f jetstream.PubAckFuture
	}
	var q []sent
	settle := func(s sent) {
		select {
		case ack := <-s.f.Ok():
			h.step(s.m, ack.Sequence)
		case err := <-s.f.Err():
			h.t.Fatal(err)
		case <-h.ctx.Done():
			h.t.Fatal(h.ctx.Err())
		}
	}
	for i := range n {
		m := h.msg(next(i))
		f, err := h.js.PublishMsgAsync(m)
		if err != nil {
			h.t.Fatal(err)
		}
		q = append(q, sent{m, f})
		if len(q) == 512 {
			settle(q[0])
			q = q[1:]
		}
	}
	for _, s := range q {
		settle(s)
	}
}

// msg builds the message of e.
func (h *harness) msg(e ce) *nats.Msg {
	h.t.Helper()
	h.n++
	if e.id == "" {
		e.id = fmt.Sprintf("ev-%d", h.n)
	}
	subject := h.subj.Events(e.session)
	m := nats.NewMsg(subject)
	var data []byte
	switch d := e.data.(type) {
	case nil:
		data = []byte(`{}`)
	case json.RawMessage:
		data = d
	default:
		var err error
		if data, err = json.Marshal(d); err != nil {
			h.t.Fatal(err)
		}
	}
	typ := events.TypePrefix + e.typ
	ts := time.Date(2026, 3, 1, 12, 0, 0, h.n, time.UTC).Format(time.RFC3339Nano)
	switch {
	case e.body != nil:
		m.Data = e.body
		m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	case e.binary:
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", e.id)
		m.Header.Set("ce-source", "urn:agent:test")
		m.Header.Set("ce-type", typ)
		m.Header.Set("ce-subject", e.session)
		m.Header.Set("ce-time", ts)
		m.Header.Set("Content-Type", events.ContentTypeJSON)
		m.Data = data
	default:
		body, err := json.Marshal(map[string]any{
			"specversion": "1.0", "id": e.id, "source": "urn:agent:test", "type": typ,
			"subject": e.session, "time": ts, "datacontenttype": events.ContentTypeJSON,
			"data": json.RawMessage(data),
		})
		if err != nil {
			h.t.Fatal(err)
		}
		m.Data = body
		m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	}
	for k, v := range e.header {
		m.Header.Set(k, v)
	}
	if e.msgID == "" {
		e.msgID = e.id
	}
	m.Header.Set(jetstream.MsgIDHeader, e.msgID)
	return m
}

func (h *harness) step(m *nats.Msg, seq uint64) bool {
	h.t.Helper()
	ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, h.subj)
	if err != nil {
		return false
	}
	ev.Meta.Seq = seq
	l := h.live[ev.Subject]
	if l == nil {
		l = &ledger.Ledger{}
		h.live[ev.Subject] = l
	}
	res, err := ledger.Step(l, ledger.Input{Event: ev}, ledger.Config{})
	if err != nil {
		h.t.Fatal(err)
	}
	if res.Accepted {
		h.ids[ev.Subject] = append(h.ids[ev.Subject], ev.ID)
		if h.keep {
			line, err := events.MarshalStructured(ev)
			if err != nil {
				h.t.Fatal(err)
			}
			h.lines[ev.Subject] = append(h.lines[ev.Subject], line)
		}
	}
	if res.Spill != nil {
		h.req[ev.Subject] = *res.Spill
		// The live processor would write it now; a handle is enough here.
		hd := events.SpillHandle{Bucket: Bucket, Name: res.Spill.Name, Range: res.Spill.Range, Events: res.Spill.Events, FirstSeq: res.Spill.FirstSeq, LastSeq: res.Spill.LastSeq}
		if _, err := ledger.Step(l, ledger.Input{Spill: &ledger.SpillResult{Handle: hd}}, ledger.Config{}); err != nil {
			h.t.Fatal(err)
		}
	}
	return res.Accepted
}

// expected is the spill a session's request must produce, for sessions
// published with keep set: its lines up to the request's event count.
func (h *harness) expected(session string) []byte {
	var b bytes.Buffer
	for _, l := range h.lines[session][:h.req[session].Events] {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func opened(session string, span uint64) ce {
	return ce{session: session, typ: "session.opened", data: map[string]any{
		"unit": "turns", "recovery_floor": map[string]any{"span": span, "unit": "turns"},
	}}
}

func turn(session string, offset uint64, content any) ce {
	return ce{session: session, typ: "turn.appended", data: map[string]any{
		"offset": offset, "size": 1, "role": "user", "content": content,
	}}
}

func truncated(session string, start, end uint64) ce {
	return ce{session: session, typ: "context.truncated", data: map[string]any{
		"range": map[string]any{"start": start, "end": end}, "stage": "budget",
	}}
}

// unsafeCompaction summarizes [0, end) and keeps nothing after it but the
// last two offsets, with the summary ending one offset early: a seam gap,
// which makes the ledger ask for a spill.
func unsafeCompaction(session, requestID string, head uint64) ce {
	return ce{session: session, typ: "compaction.requested", data: map[string]any{
		"request_id":       requestID,
		"summarizer_input": map[string]any{"start": 0, "end": head - 2},
		"summary_range":    map[string]any{"start": 0, "end": head - 3},
		"tail_start":       head - 2,
	}}
}

// settles fails unless the number of goroutines drops back to at most base
// within ten seconds.
func settles(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines ten seconds after Write returned, %d before it: a leak?\n%s", n, base, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eventually polls cond every 10ms until it holds, or fails after d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
