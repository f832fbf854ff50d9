package forward_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/forward"
	"github.com/seamguard/seamguard/internal/longtest"
)

const waitFor, tick = 20 * time.Second, 10 * time.Millisecond

// TestDeliversInOrder: verdicts decided after the forwarder was created
// arrive in stream order, each a binary-mode CloudEvent whose attributes
// and data are the stored verdict's (decoded with sdk-go on both sides),
// with the signature a receiver can verify.
func TestDeliversInOrder(t *testing.T) {
	e := newEnv(t)
	before, _ := e.verdict(t, "s0", events.KindRefused) // before the forwarder: not forwarded (from new)
	r := newReceiver(t, nil)
	f := e.forwarder(t, fast(r.URL))
	stop := run(t, f)
	var ids []string
	var seqs []uint64
	for i, kind := range []string{events.KindRefused, events.KindAllowed, events.KindHalted, events.KindViolation, events.KindRefused} {
		id, seq := e.verdict(t, []string{"s1", "s2"}[i%2], kind)
		ids, seqs = append(ids, id), append(seqs, seq)
	}
	require.Eventually(t, func() bool { return len(r.delivered()) == len(ids) }, waitFor, tick)
	require.Eventually(t, func() bool { return e.consumerIdle(t, f.Name()) }, waitFor, tick)
	require.NoError(t, stop())
	assert.Equal(t, ids, r.delivered(), "in stream order, each once")
	assert.NotContains(t, r.delivered(), before)

	for i, g := range r.all() {
		m := e.stored(t, seqs[i])
		var want event.Event
		require.NoError(t, json.Unmarshal(m.Data, &want))
		assert.Equal(t, want.Context.AsV1(), g.event.Context.AsV1(), "attributes of %s", ids[i])
		assert.Equal(t, "application/json", g.header.Get("Content-Type"))
		assert.Equal(t, "1.0", g.header.Get("Ce-Specversion"), "binary mode")
		assert.JSONEq(t, string(mustRaw(t, m.Data)), string(g.body), "the data, as stored")
		assert.Equal(t, m.Header.Get(attest.HeaderSignature), g.header.Get(forward.HeaderSignature))
		a, err := forward.VerifyRequest(e.ver, g.header, g.body)
		require.NoError(t, err)
		assert.True(t, a.Trusted)
		assert.Equal(t, ids[i], a.Verdict.ID)
		// A changed body, or a ce-id swapped, fails.
		_, err = forward.VerifyRequest(e.ver, g.header, append([]byte(" "), g.body...))
		assert.ErrorIs(t, err, forward.ErrUnverifiable)
		h := g.header.Clone()
		h.Set("Ce-Id", "someone-else")
		_, err = forward.VerifyRequest(e.ver, h, g.body)
		assert.ErrorIs(t, err, forward.ErrUnverifiable)
	}
	assert.Equal(t, uint64(len(ids)), f.Stats().Delivered)
}

func mustRaw(t *testing.T, body []byte) json.RawMessage {
	var m struct {
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(body, &m))
	return m.Data
}

// TestFailsThenRecovers: a receiver that answers 500 for a while, then
// recovers: every verdict arrives, in order, answered 2xx exactly once.
func TestFailsThenRecovers(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	failing := true
	r := newReceiver(t, func(n int, ev event.Event) (int, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return http.StatusInternalServerError, 0
		}
		return http.StatusOK, 0
	})
	cfg := fast(r.URL)
	cfg.MaxAttempts = 1000
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	var ids []string
	for range 5 {
		id, _ := e.verdict(t, "s1", events.KindRefused)
		ids = append(ids, id)
	}
	require.Eventually(t, func() bool { return len(r.all()) >= 5 }, waitFor, tick, "retried while failing")
	assert.Empty(t, r.delivered())
	mu.Lock()
	failing = false
	mu.Unlock()
	require.Eventually(t, func() bool { return len(r.delivered()) == 5 }, waitFor, tick)
	require.Eventually(t, func() bool { return e.consumerIdle(t, f.Name()) }, waitFor, tick)
	time.Sleep(200 * time.Millisecond) // anything delivered twice would show by now
	require.NoError(t, stop())
	assert.Equal(t, ids, r.delivered(), "nothing lost, nothing twice, in order")
	assert.Zero(t, f.Stats().Kept)
}

// TestTimeout: a receiver that does not answer within the timeout is tried
// again; the verdict is delivered once it answers in time.
func TestTimeout(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, func(n int, ev event.Event) (int, time.Duration) {
		if n < 2 {
			return http.StatusOK, 2 * time.Second // too late: the forwarder gave up on it
		}
		return http.StatusOK, 0
	})
	cfg := fast(r.URL)
	cfg.Timeout = 300 * time.Millisecond
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	id, _ := e.verdict(t, "s1", events.KindHalted)
	require.Eventually(t, func() bool { return e.consumerIdle(t, f.Name()) && f.Stats().Delivered == 1 }, waitFor, tick)
	require.NoError(t, stop())
	got := r.all()
	require.Len(t, got, 3, "two timed out, the third answered")
	for _, g := range got {
		assert.Equal(t, id, g.event.ID())
	}
	assert.Equal(t, uint64(3), f.Stats().Attempts)
}

// TestPermanentKeptThenRetried: a 400 is not retried: the verdict is kept
// as undeliverable with its reason, listed, and Redeliver delivers it once
// the receiver is fixed, removing it only then.
func TestPermanentKeptThenRetried(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	broken := true
	r := newReceiver(t, func(n int, ev event.Event) (int, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if broken && ev.Subject() == "bad" {
			return http.StatusBadRequest, 0
		}
		return http.StatusNoContent, 0
	})
	f := e.forwarder(t, fast(r.URL))
	stop := run(t, f)
	badID, badSeq := e.verdict(t, "bad", events.KindRefused)
	goodID, _ := e.verdict(t, "good", events.KindRefused)
	require.Eventually(t, func() bool { return e.consumerIdle(t, f.Name()) && len(r.delivered()) == 1 }, waitFor, tick)
	require.NoError(t, stop())
	assert.Equal(t, []string{goodID}, r.delivered())
	assert.Len(t, r.all(), 2, "the 400 was not retried")

	ctx := context.Background()
	u, err := forward.OpenUndeliverable(ctx, e.JS, "", false, 0)
	require.NoError(t, err)
	recs, err := u.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, recs, 1)
	rec := recs[0]
	assert.Equal(t, forward.ReasonRejected, rec.Reason)
	assert.Equal(t, 400, rec.Status)
	assert.Equal(t, 1, rec.Attempts)
	assert.Equal(t, badSeq, rec.VerdictSeq)
	assert.Equal(t, "bad", rec.Session)
	assert.Equal(t, events.KindRefused, rec.Kind)
	assert.Equal(t, f.Name(), rec.Name)
	assert.Equal(t, r.URL, rec.To)

	// Still broken: it stays.
	err = u.Redeliver(ctx, nil, e.ver, rec, "", nil)
	require.Error(t, err)
	recs, _ = u.List(ctx, f.Name())
	require.Len(t, recs, 1)

	mu.Lock()
	broken = false
	mu.Unlock()
	require.NoError(t, u.Redeliver(ctx, nil, e.ver, rec, "", nil))
	assert.Equal(t, []string{goodID, badID}, r.delivered())
	recs, err = u.List(ctx, "")
	require.NoError(t, err)
	assert.Empty(t, recs, "removed after the 2xx")
	_, err = u.Get(ctx, rec.Seq)
	assert.ErrorIs(t, err, forward.ErrNotKept)
}

// TestExhaustedRespectsRetryAfter: a receiver that answers 503 with
// Retry-After: 1 gets attempts at least a second apart, and after
// MaxAttempts the verdict is kept as exhausted.
func TestExhaustedRespectsRetryAfter(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, func(int, event.Event) (int, time.Duration) { return http.StatusServiceUnavailable, 0 })
	cfg := fast(r.URL)
	cfg.MaxAttempts = 2
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	e.verdict(t, "s1", events.KindRefused)
	require.Eventually(t, func() bool { return f.Stats().Kept == 1 && e.consumerIdle(t, f.Name()) }, waitFor, tick)
	require.NoError(t, stop())
	got := r.all()
	require.Len(t, got, 2)
	assert.GreaterOrEqual(t, got[1].at.Sub(got[0].at), 900*time.Millisecond, "Retry-After: 1 respected")
	u, err := forward.OpenUndeliverable(context.Background(), e.JS, "", false, 0)
	require.NoError(t, err)
	recs, err := u.List(context.Background(), "")
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, forward.ReasonExhausted, recs[0].Reason)
	assert.Equal(t, 503, recs[0].Status)
	assert.Equal(t, 2, recs[0].Attempts)
}

// TestUnverifiableKept: an unsigned verdict, and one signed by a key not
// trusted, are not forwarded: they are kept with the reason.
func TestUnverifiableKept(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, nil)
	f := e.forwarder(t, fast(r.URL))
	stop := run(t, f)
	other, err := attest.Generate()
	require.NoError(t, err)
	e.publish(t, nil, "s1", events.KindRefused)
	e.publish(t, other, "s1", events.KindRefused)
	good, _ := e.verdict(t, "s1", events.KindRefused)
	require.Eventually(t, func() bool { return e.consumerIdle(t, f.Name()) && f.Stats().Kept == 2 }, waitFor, tick)
	require.NoError(t, stop())
	assert.Equal(t, []string{good}, r.delivered())
	u, err := forward.OpenUndeliverable(context.Background(), e.JS, "", false, 0)
	require.NoError(t, err)
	recs, err := u.List(context.Background(), "")
	require.NoError(t, err)
	require.Len(t, recs, 2)
	for _, rec := range recs {
		assert.Equal(t, forward.ReasonUnverifiable, rec.Reason)
		assert.Zero(t, rec.Attempts)
	}
	assert.Contains(t, recs[0].Error, "unsigned")
	assert.Contains(t, recs[1].Error, "trusted")
	// Redeliver verifies too.
	assert.ErrorIs(t, u.Redeliver(context.Background(), nil, e.ver, recs[0], "", nil), forward.ErrUnverifiable)
}

// TestSharedName: two forwarders with the same name share the work: each
// verdict is delivered once, and both deliver some.
func TestSharedName(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	by := map[string]string{}
	r := newReceiver(t, func(n int, ev event.Event) (int, time.Duration) { return http.StatusOK, 20 * time.Millisecond })
	_ = by
	_ = &mu
	cfg := fast(r.URL)
	a, b := e.forwarder(t, cfg), e.forwarder(t, cfg)
	require.Equal(t, a.Name(), b.Name())
	stopA, stopB := run(t, a), run(t, b)
	var ids []string
	for i := range 30 {
		id, _ := e.verdict(t, "s"+string(rune('a'+i%3)), events.KindRefused)
		ids = append(ids, id)
	}
	require.Eventually(t, func() bool { return len(r.delivered()) >= 30 && e.consumerIdle(t, a.Name()) }, waitFor, tick)
	require.NoError(t, stopA())
	require.NoError(t, stopB())
	assert.ElementsMatch(t, ids, r.delivered(), "each verdict once")
	assert.NotZero(t, a.Stats().Delivered)
	assert.NotZero(t, b.Stats().Delivered)
	assert.Equal(t, uint64(30), a.Stats().Delivered+b.Stats().Delivered)
}

// TestRestartResumes: a forwarder started again under its name resumes
// after the last verdict it acknowledged, whatever --from says.
func TestRestartResumes(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, nil)
	cfg := fast(r.URL)
	cfg.Name = "pager"
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	var ids []string
	for range 3 {
		id, _ := e.verdict(t, "s1", events.KindRefused)
		ids = append(ids, id)
	}
	require.Eventually(t, func() bool { return len(r.delivered()) == 3 && e.consumerIdle(t, "pager") }, waitFor, tick)
	require.NoError(t, stop())
	for range 3 { // decided while no forwarder runs
		id, _ := e.verdict(t, "s1", events.KindRefused)
		ids = append(ids, id)
	}
	cfg.From = "start"
	f2 := e.forwarder(t, cfg)
	stop2 := run(t, f2)
	require.Eventually(t, func() bool { return len(r.delivered()) == 6 && e.consumerIdle(t, "pager") }, waitFor, tick)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, stop2())
	assert.Equal(t, ids, r.delivered())
}

// TestFilters: --kinds and --session select verdicts by subject.
func TestFilters(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, nil)
	cfg := fast(r.URL)
	cfg.Kinds = []string{events.KindHalted, events.KindRefused}
	cfg.Session = "s1"
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	var want []string
	for _, v := range []struct{ session, kind string }{
		{"s1", events.KindRefused}, {"s2", events.KindRefused}, {"s1", events.KindAllowed},
		{"s1", events.KindHalted}, {"s2", events.KindHalted}, {"s1", events.KindViolation},
	} {
		id, _ := e.verdict(t, v.session, v.kind)
		if v.session == "s1" && (v.kind == events.KindRefused || v.kind == events.KindHalted) {
			want = append(want, id)
		}
	}
	require.Eventually(t, func() bool { return e.consumerIdle(t, f.Name()) && len(r.delivered()) == len(want) }, waitFor, tick)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, stop())
	assert.Equal(t, want, r.delivered())

	// The same name with other filters is refused.
	cfg.Name = f.Name()
	cfg.Kinds = []string{events.KindRefused}
	_, err := forward.New(context.Background(), e.JS, cfg, forward.WithLogger(quiet()))
	assert.ErrorIs(t, err, forward.ErrConsumerMismatch)
}

// TestFrom: a new consumer starts where From says.
func TestFrom(t *testing.T) {
	e := newEnv(t)
	first, _ := e.verdict(t, "s1", events.KindRefused)
	second, seq := e.verdict(t, "s1", events.KindRefused)
	for _, tc := range []struct {
		from string
		want []string
	}{{"start", []string{first, second}}, {"2", []string{second}}, {"new", nil}} {
		t.Run(tc.from, func(t *testing.T) {
			r := newReceiver(t, nil)
			cfg := fast(r.URL)
			cfg.From, cfg.Name = tc.from, "from-"+tc.from
			f := e.forwarder(t, cfg)
			stop := run(t, f)
			require.Eventually(t, func() bool { return e.consumerIdle(t, cfg.Name) && len(r.delivered()) == len(tc.want) }, waitFor, tick)
			time.Sleep(100 * time.Millisecond)
			require.NoError(t, stop())
			assert.Equal(t, tc.want, r.delivered())
		})
	}
	_ = seq
}

// TestStopReleases: a forwarder stopped while it waits to retry releases
// the verdict at once, and another one delivers it.
func TestStopReleases(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	failing := true
	r := newReceiver(t, func(int, event.Event) (int, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return http.StatusBadGateway, 0
		}
		return http.StatusOK, 0
	})
	cfg := fast(r.URL)
	cfg.MinBackoff, cfg.MaxBackoff = time.Hour, time.Hour
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	id, _ := e.verdict(t, "s1", events.KindRefused)
	require.Eventually(t, func() bool { return len(r.all()) == 1 }, waitFor, tick)
	start := time.Now()
	require.NoError(t, stop())
	assert.Less(t, time.Since(start), 5*time.Second, "the stop did not wait out the backoff")
	mu.Lock()
	failing = false
	mu.Unlock()
	g := e.forwarder(t, cfg)
	stopG := run(t, g)
	require.Eventually(t, func() bool { return len(r.delivered()) == 1 }, 10*time.Second, tick, "released, not held for the ack wait")
	require.NoError(t, stopG())
	assert.Equal(t, []string{id}, r.delivered())
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, forward.Config{To: "http://127.0.0.1:9/x"}.Validate())
	err := forward.Config{To: "ftp://x", Name: "a.b", Kinds: []string{"allowed", "nope"}, Session: "a b", From: "yesterday", Concurrency: -1}.Validate()
	require.Error(t, err)
	assert.True(t, errors.Is(err, forward.ErrConfig))
	for _, want := range []string{"ftp://x", `name "a.b"`, `kind "nope"`, `session "a b"`, `from "yesterday"`, "concurrency is negative"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Error(t, forward.Config{}.Validate(), "a URL is required")
	assert.True(t, strings.HasPrefix(forward.DefaultName("http://x", []string{"refused", "halted"}, ""), "forward-"))
	assert.Equal(t, forward.DefaultName("http://x", []string{"refused", "halted"}, ""), forward.DefaultName("http://x", []string{"halted", "refused"}, ""))
	assert.NotEqual(t, forward.DefaultName("http://x", nil, ""), forward.DefaultName("http://y", nil, ""))
	assert.Equal(t, []string{"seamguard.verdicts.*.*"}, forward.Config{}.Filters())
	assert.Equal(t, []string{"p.verdicts.s.halted", "p.verdicts.s.refused"}, forward.Config{Prefix: "p", Session: "s", Kinds: []string{"refused", "halted"}}.Filters())
	assert.Equal(t, "SEAMGUARD_UNDELIVERABLE", forward.UndeliverableStream(""))
	assert.Equal(t, "SEAMGUARD_VERDICTS", forward.VerdictStream(""))
}

// TestInProgressHoldsTheVerdict: while a forwarder retries a verdict for
// longer than the consumer's ack wait, it keeps it in progress: the other
// forwarder sharing the consumer never gets it, and it is delivered once.
func TestInProgressHoldsTheVerdict(t *testing.T) {
	e := newEnv(t)
	_, err := e.JS.CreateConsumer(context.Background(), "SEAMGUARD_VERDICTS", jetstream.ConsumerConfig{
		Durable: "held", FilterSubjects: []string{"seamguard.verdicts.*.*"}, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, DeliverPolicy: jetstream.DeliverNewPolicy, MaxDeliver: -1})
	require.NoError(t, err)
	var mu sync.Mutex
	var first time.Time
	r := newReceiver(t, func(int, event.Event) (int, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) < 3*time.Second {
			return http.StatusInternalServerError, 0
		}
		return http.StatusOK, 0
	})
	cfg := fast(r.URL)
	cfg.Name, cfg.MaxAttempts = "held", 1000
	cfg.MinBackoff, cfg.MaxBackoff = 200*time.Millisecond, 400*time.Millisecond
	a, b := e.forwarder(t, cfg), e.forwarder(t, cfg)
	stopA, stopB := run(t, a), run(t, b)
	id, _ := e.verdict(t, "s1", events.KindRefused)
	require.Eventually(t, func() bool { return len(r.delivered()) == 1 && e.consumerIdle(t, "held") }, waitFor, tick)
	require.NoError(t, stopA())
	require.NoError(t, stopB())
	assert.Equal(t, []string{id}, r.delivered())
	sa, sb := a.Stats(), b.Stats()
	assert.True(t, sa.Attempts == 0 || sb.Attempts == 0, "one forwarder held the verdict throughout: attempts %d and %d", sa.Attempts, sb.Attempts)
	assert.Greater(t, sa.Attempts+sb.Attempts, uint64(5))
}

// TestIdleIsQuiet: a forwarder with nothing to forward logs nothing past
// its start (a fetch that waits in vain is not a failure).
func TestIdleIsQuiet(t *testing.T) {
	longtest.Skip(t)
	e := newEnv(t)
	var buf lockedBuffer
	f, err := forward.New(context.Background(), e.JS, forward.Config{To: "http://127.0.0.1:9/"}, forward.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	require.NoError(t, err)
	stop := run(t, f)
	time.Sleep(12 * time.Second)
	require.NoError(t, stop())
	assert.NotContains(t, buf.String(), "WARN")
	assert.NotContains(t, buf.String(), "ERROR")
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStopFinishesInFlight: a forwarder stopped during a request lets it
// finish and acknowledges the verdict: a forwarder started after it does
// not deliver it again.
func TestStopFinishesInFlight(t *testing.T) {
	e := newEnv(t)
	r := newReceiver(t, func(n int, _ event.Event) (int, time.Duration) {
		if n == 0 {
			return http.StatusOK, time.Second
		}
		return http.StatusOK, 0
	})
	cfg := fast(r.URL)
	f := e.forwarder(t, cfg)
	stop := run(t, f)
	id, _ := e.verdict(t, "s1", events.KindRefused)
	require.Eventually(t, func() bool { return len(r.all()) == 1 }, waitFor, tick)
	require.NoError(t, stop())
	assert.Equal(t, uint64(1), f.Stats().Delivered, "the request under way finished")
	require.True(t, e.consumerIdle(t, f.Name()), "and its verdict was acknowledged")
	g := e.forwarder(t, cfg)
	stopG := run(t, g)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, stopG())
	assert.Equal(t, []string{id}, r.delivered())
}
