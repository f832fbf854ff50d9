package metrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/metrics"
	"github.com/seamguard/seamguard/metrics/metricstest"
)

func scrape(t *testing.T, r *metrics.Recorder) metricstest.Scrape {
	t.Helper()
	w := httptest.NewRecorder()
	r.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, w.Code)
	require.True(t, strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain"), w.Header().Get("Content-Type"))
	s, err := metricstest.Parse(w.Body)
	require.NoError(t, err)
	return s
}

func value(t *testing.T, s metricstest.Scrape, name string, labels ...string) float64 {
	t.Helper()
	ls := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		ls[labels[i]] = labels[i+1]
	}
	v, ok := s.Value(name, ls)
	require.True(t, ok, "no sample %s%v", name, ls)
	return v
}

func refusal(codes ...events.ReasonCode) events.Output {
	d := &events.CompactionRefused{RequestID: "r"}
	for _, c := range codes {
		d.Reasons = append(d.Reasons, events.Reason{Code: c})
	}
	return events.Output{Type: events.TypeCompactionRefused, Session: "s1", Data: d}
}

// TestRecorder feeds a Recorder what the runtime reports and reads the
// scrape back through the Prometheus parser.
func TestRecorder(t *testing.T) {
	r := metrics.New()

	// Before anything happens, the fixed series are there at 0.
	s := scrape(t, r)
	assert.Equal(t, 0.0, value(t, s, "seamguard_events_total", "type", "turn.appended"))
	assert.Equal(t, 0.0, value(t, s, "seamguard_rejections_total", "code", "offset_conflict"))
	assert.Equal(t, 0.0, value(t, s, "seamguard_verdicts_total", "kind", "refused", "reason", "coverage_hole"))
	assert.Equal(t, 0.0, value(t, s, "seamguard_spills_total"))
	require.Equal(t, dto.MetricType_HISTOGRAM, s["seamguard_decision_latency_seconds"].GetType())

	for _, typ := range []string{events.TypeSessionOpened, events.TypeTurnAppended, events.TypeTurnAppended, "", "io.seamguard.made.up"} {
		r.Input(typ)
	}
	now := time.Now()
	r.Published(events.Output{Type: events.TypeTranscriptSpilled, Data: &events.SpillHandle{Size: 10}}, now.Add(-3*time.Millisecond))
	r.Published(refusal(events.ReasonCoverageHole), now.Add(-3*time.Millisecond))
	r.Published(refusal(events.ReasonCoverageHole, events.ReasonSeamGap), now.Add(-40*time.Millisecond))
	r.Published(refusal(events.ReasonSessionHalted), time.Time{}) // unknown receipt: not timed
	r.Published(events.Output{Type: events.TypeCompactionAllowed, Data: &events.CompactionAllowed{Cured: []events.ReasonCode{events.ReasonCoverageHole}}}, now.Add(-2*time.Second))
	r.Published(events.Output{Type: events.TypeEventRejected, Data: &events.EventRejected{Code: events.CodeBadData}}, now)
	r.Published(events.Output{Type: events.TypeEventRejected, Data: &events.EventRejected{Code: "no_such_code"}}, now)
	r.Published(refusal("no_such_reason"), time.Time{})
	r.Spilled(events.SpillHandle{Size: 23007}, 30*time.Millisecond)
	r.Spilled(events.SpillHandle{Size: 1000}, 2*time.Second)
	r.SpillFailed()
	r.Stored(time.Millisecond)
	r.CASConflict()

	s = scrape(t, r)
	assert.Equal(t, 1.0, value(t, s, "seamguard_events_total", "type", "session.opened"))
	assert.Equal(t, 2.0, value(t, s, "seamguard_events_total", "type", "turn.appended"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_events_total", "type", metrics.TypeInvalid))
	assert.Equal(t, 1.0, value(t, s, "seamguard_events_total", "type", metrics.Other))

	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "refused", "reason", "coverage_hole"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "refused", "reason", metrics.ReasonMultiple))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "refused", "reason", "session_halted"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "refused", "reason", metrics.Other))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "allowed", "reason", "coverage_hole"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "spilled", "reason", metrics.ReasonNone))
	assert.Equal(t, 2.0, value(t, s, "seamguard_verdicts_total", "kind", "rejected", "reason", metrics.ReasonNone))
	assert.Equal(t, 2.0, value(t, s, "seamguard_verdict_reasons_total", "kind", "refused", "reason", "coverage_hole"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdict_reasons_total", "kind", "refused", "reason", "seam_gap"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_rejections_total", "code", "bad_data"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_rejections_total", "code", metrics.Other))

	assert.Equal(t, 2.0, value(t, s, "seamguard_spills_total"))
	assert.Equal(t, 24007.0, value(t, s, "seamguard_spill_bytes_total"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_spill_failures_total"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_cas_conflicts_total"))

	// Decision latency: the three timed answers to requests (3ms, 40ms,
	// 2s); the spill, the rejections and the untimed refusals are not.
	h, ok := s.Metric("seamguard_decision_latency_seconds", map[string]string{})
	require.True(t, ok)
	hist := h.GetHistogram()
	require.Equal(t, uint64(3), hist.GetSampleCount())
	assert.InDelta(t, 2.043, hist.GetSampleSum(), 0.5)
	cum := map[float64]uint64{}
	for _, b := range hist.GetBucket() {
		cum[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	assert.Equal(t, uint64(0), cum[0.001])
	assert.Equal(t, uint64(1), cum[0.025], "the 3ms decision")
	assert.Equal(t, uint64(2), cum[0.05], "and the 40ms one")
	assert.Equal(t, uint64(2), cum[1])
	assert.Equal(t, uint64(3), cum[2.5], "and the 2s one")
	sp, ok := s.Metric("seamguard_spill_write_seconds", map[string]string{})
	require.True(t, ok)
	assert.Equal(t, uint64(2), sp.GetHistogram().GetSampleCount())
	sn, ok := s.Metric("seamguard_snapshot_write_seconds", map[string]string{})
	require.True(t, ok)
	assert.Equal(t, uint64(1), sn.GetHistogram().GetSampleCount())

	// Every label of every seamguard family takes a value from its set.
	allowed := map[string]map[string]bool{"type": {}, "code": {}, "kind": {}, "reason": {}}
	for _, v := range metrics.InputTypes {
		allowed["type"][v] = true
	}
	for _, v := range metrics.RejectionCodes {
		allowed["code"][string(v)] = true
	}
	for _, v := range metrics.Kinds {
		allowed["kind"][v] = true
	}
	for _, v := range metrics.ReasonCodes {
		allowed["reason"][string(v)] = true
	}
	for _, l := range []string{"type", "code", "kind", "reason"} {
		allowed[l][metrics.Other] = true
	}
	allowed["reason"][metrics.ReasonNone] = true
	for _, v := range metrics.ServiceDeniedReasons {
		allowed["reason"][v] = true
	}
	allowed["reason"][metrics.ReasonMultiple] = true
	for name, f := range s {
		if !strings.HasPrefix(name, "seamguard_") {
			continue
		}
		assert.NotEmpty(t, f.GetHelp(), "%s has no HELP", name)
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				set, ok := allowed[lp.GetName()]
				require.True(t, ok, "%s has a label %s of no fixed set", name, lp.GetName())
				assert.True(t, set[lp.GetValue()], "%s{%s=%q} is outside the label's set", name, lp.GetName(), lp.GetValue())
			}
		}
	}
	// The Go runtime's and the process's standard metrics are there too.
	assert.NotNil(t, s["go_goroutines"])
}

// TestWatchConsumers polls a real consumer's lag from an embedded server.
func TestWatchConsumers(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LAG", Subjects: []string{"lag.>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	cons, err := srv.JS.CreateOrUpdateConsumer(ctx, "LAG", jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	for i := range 7 {
		_, err := srv.JS.Publish(ctx, fmt.Sprintf("lag.%d", i), nil)
		require.NoError(t, err)
	}
	// Two delivered and not acked: lag 5, ack pending 2.
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	for range batch.Messages() {
	}

	r := metrics.New()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.WatchConsumers(wctx, srv.JS, "LAG", []string{"reader", "missing"}, 50*time.Millisecond, slog.New(slog.DiscardHandler))
	}()
	var s metricstest.Scrape
	require.Eventually(t, func() bool {
		s = scrape(t, r)
		v, ok := s.Value("seamguard_consumer_lag", map[string]string{"consumer": "reader"})
		return ok && v == 5
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 2.0, value(t, s, "seamguard_consumer_ack_pending", "consumer", "reader"))
	_, ok := s.Value("seamguard_consumer_lag", map[string]string{"consumer": "missing"})
	assert.False(t, ok, "a consumer that cannot be read has no value")
	assert.GreaterOrEqual(t, value(t, s, "seamguard_consumer_poll_errors_total"), 1.0)
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchConsumers did not return after its context ended")
	}
}

// TestRecorderPins: pin_dropped is a reason of its own and the pin events
// are input types of their own, not "other".
func TestRecorderPins(t *testing.T) {
	r := metrics.New()
	s := scrape(t, r)
	assert.Equal(t, 0.0, value(t, s, "seamguard_verdict_reasons_total", "kind", "refused", "reason", "pin_dropped"))
	r.Published(refusal(events.ReasonPinDropped), time.Time{})
	r.Published(refusal(events.ReasonCoverageHole, events.ReasonPinDropped), time.Time{})
	r.Input(events.TypeContextPinned)
	r.Input(events.TypeContextUnpinned)
	r.Input(events.TypeContextUnpinned)
	s = scrape(t, r)
	assert.Equal(t, 2.0, value(t, s, "seamguard_verdict_reasons_total", "kind", "refused", "reason", "pin_dropped"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_verdicts_total", "kind", "refused", "reason", "pin_dropped"))
	assert.Equal(t, 1.0, value(t, s, "seamguard_events_total", "type", "context.pinned"))
	assert.Equal(t, 2.0, value(t, s, "seamguard_events_total", "type", "context.unpinned"))
	assert.Equal(t, 0.0, value(t, s, "seamguard_events_total", "type", metrics.Other))
}

func TestRecorderParked(t *testing.T) {
	r := metrics.New()
	assert.Equal(t, 0.0, value(t, scrape(t, r), "seamguard_sessions_parked"))
	r.Parked("a", true)
	r.Parked("a", true) // told twice (its own park, then its record read): once
	r.Parked("b", true)
	assert.Equal(t, 2.0, value(t, scrape(t, r), "seamguard_sessions_parked"))
	r.Parked("a", false)
	r.Parked("c", false) // never parked here
	assert.Equal(t, 1.0, value(t, scrape(t, r), "seamguard_sessions_parked"))
}

// TestHandlerFormats: /metrics answers in the format the scraper's Accept
// header asks for: Prometheus text by default, OpenMetrics text or protobuf
// when asked.
func TestHandlerFormats(t *testing.T) {
	r := metrics.New()
	r.Input(events.TypeTurnAppended)
	get := func(accept string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		w := httptest.NewRecorder()
		r.Handler().ServeHTTP(w, req)
		require.Equal(t, 200, w.Code)
		return w
	}

	w := get("")
	assert.True(t, strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain"), w.Header().Get("Content-Type"))
	assert.NotContains(t, w.Body.String(), "# EOF")

	// What Prometheus sends when it prefers OpenMetrics.
	w = get("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
	ct := w.Header().Get("Content-Type")
	assert.True(t, strings.HasPrefix(ct, "application/openmetrics-text"), ct)
	body := w.Body.String()
	assert.True(t, strings.HasSuffix(body, "# EOF\n"), "an OpenMetrics exposition ends with # EOF")
	assert.Contains(t, body, "# TYPE seamguard_events counter\n")
	assert.Contains(t, body, `seamguard_events_total{type="turn.appended"} 1.0`+"\n")
	assert.NotContains(t, body, "_created")

	w = get("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	ct = w.Header().Get("Content-Type")
	assert.True(t, strings.HasPrefix(ct, "application/vnd.google.protobuf"), ct)
}
