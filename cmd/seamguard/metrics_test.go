package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/metrics/metricstest"
	"github.com/seamguard/seamguard/processor"
)

var showScrape = flag.Bool("show-scrape", false, "TestServeMetrics: print the seamguard_ lines of the scrape and the verdict log lines")

// TestServeMetrics runs `serve` with --health-listen, plays the seed story
// and one malformed input into it, scrapes /metrics over HTTP and holds the
// scrape to what happened: the refusal with coverage_hole, the spill and its
// bytes, the cured retry, both decisions in the latency histogram, every
// input by type, the rejection by code, the consumers' lag. It then checks
// that every metric the Grafana dashboard queries is in the scrape, and that
// the JSON log names the session, the sequence and the kind of each verdict.
func TestServeMetrics(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--nats-url", srv.Server.ClientURL(), "--health-listen", "127.0.0.1:0",
			"--log-format", "json", "--lag-interval", "200ms"}, strings.NewReader(""), &out, &errb)
	}()
	base := healthBase(t, &errb)

	lines := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	publishLines(t, srv.JS, lines)
	bad := nats.NewMsg("seamguard.events.ops-agent-42")
	bad.Data = []byte("this is not a CloudEvent")
	_, err := srv.JS.PublishMsg(ctx, bad)
	require.NoError(t, err)

	// The verdict stream has the story's three verdicts and the rejection
	// before the processor has their publish acks: poll the scrape.
	var s metricstest.Scrape
	var body string
	decisions := func() uint64 {
		m, ok := s.Metric("seamguard_decision_latency_seconds", map[string]string{})
		if !ok {
			return 0
		}
		return m.GetHistogram().GetSampleCount()
	}
	defer func() {
		if t.Failed() {
			t.Logf("last scrape:\n%s", body)
		}
	}()
	require.Eventually(t, func() bool {
		s, body, err = metricstest.Get(base + "/metrics")
		if err != nil {
			return false
		}
		rej, _ := s.Value("seamguard_rejections_total", map[string]string{"code": "malformed"})
		// A poll sets the consumers one by one: wait for all of them.
		lag := len(s.LabelValues("seamguard_consumer_lag", "consumer")) == processor.DefaultPartitions+1
		return decisions() == 2 && rej == 1 && lag
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, err)

	v := func(name string, labels ...string) float64 {
		t.Helper()
		ls := map[string]string{}
		for i := 0; i+1 < len(labels); i += 2 {
			ls[labels[i]] = labels[i+1]
		}
		got, ok := s.Value(name, ls)
		require.True(t, ok, "no sample %s%v in the scrape", name, ls)
		return got
	}

	// The refusal, the spill, the cured retry.
	assert.Equal(t, 1.0, v("seamguard_verdicts_total", "kind", "refused", "reason", "coverage_hole"))
	assert.Equal(t, 1.0, v("seamguard_verdict_reasons_total", "kind", "refused", "reason", "coverage_hole"))
	assert.Equal(t, 1.0, v("seamguard_verdicts_total", "kind", "spilled", "reason", "none"))
	assert.Equal(t, 1.0, v("seamguard_verdicts_total", "kind", "allowed", "reason", "coverage_hole"))
	assert.Equal(t, 1.0, v("seamguard_verdicts_total", "kind", "rejected", "reason", "none"))
	assert.Equal(t, 0.0, v("seamguard_verdicts_total", "kind", "halted", "reason", "none"))
	assert.Equal(t, 0.0, v("seamguard_verdicts_total", "kind", "violation", "reason", "none"))
	var total float64
	for _, m := range s["seamguard_verdicts_total"].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	assert.Equal(t, 4.0, total, "three verdicts of the story and one rejection")

	assert.Equal(t, 1.0, v("seamguard_spills_total"))
	assert.Equal(t, 0.0, v("seamguard_spill_failures_total"))
	h := spillHandle(t, srv.JS)
	assert.Equal(t, float64(h.Size), v("seamguard_spill_bytes_total"), "the spill's size, as its handle says")
	sw, ok := s.Metric("seamguard_spill_write_seconds", map[string]string{})
	require.True(t, ok)
	assert.Equal(t, uint64(1), sw.GetHistogram().GetSampleCount())

	// Inputs by type, as the story has them, and the malformed one.
	want := map[string]float64{}
	for _, l := range lines {
		var e struct{ Type string }
		require.NoError(t, json.Unmarshal([]byte(l), &e))
		want[strings.TrimPrefix(e.Type, events.TypePrefix)]++
	}
	want["invalid"] = 1
	for typ, n := range want {
		assert.Equal(t, n, v("seamguard_events_total", "type", typ), "events of type %s", typ)
	}
	assert.Equal(t, 1.0, v("seamguard_rejections_total", "code", "malformed"))
	assert.Equal(t, 0.0, v("seamguard_rejections_total", "code", "bad_data"))
	assert.Equal(t, float64(len(lines)+1), v("seamguard_inputs_handled_total")+v("seamguard_caught_up_total"),
		"every input is decided once: as it is delivered, or caught up from the stream ahead of its delivery")

	// Decision latency: the refusal (with its spill) and the retry.
	hm, _ := s.Metric("seamguard_decision_latency_seconds", map[string]string{})
	hist := hm.GetHistogram()
	require.Equal(t, uint64(2), hist.GetSampleCount())
	assert.Greater(t, hist.GetSampleSum(), 0.0)
	var prev uint64
	for _, b := range hist.GetBucket() {
		assert.GreaterOrEqual(t, b.GetCumulativeCount(), prev, "buckets are cumulative")
		prev = b.GetCumulativeCount()
	}
	assert.Equal(t, uint64(2), prev, "every decision is within the largest bucket")
	assert.Contains(t, body, `seamguard_decision_latency_seconds_bucket{le="+Inf"} 2`)

	// Session state writes, no conflicts, all consumers caught up.
	sn, ok := s.Metric("seamguard_snapshot_write_seconds", map[string]string{})
	require.True(t, ok)
	assert.GreaterOrEqual(t, sn.GetHistogram().GetSampleCount(), uint64(1))
	assert.Equal(t, 0.0, v("seamguard_cas_conflicts_total"))
	assert.Equal(t, 1.0, v("seamguard_ready"))
	consumers := s.LabelValues("seamguard_consumer_lag", "consumer")
	assert.Len(t, consumers, processor.DefaultPartitions+1, "every partition and the consumer of subjects without a session: %v", consumers)
	require.Eventually(t, func() bool {
		s2, _, err := metricstest.Get(base + "/metrics")
		if err != nil {
			return false
		}
		for _, c := range consumers {
			if lag, _ := s2.Value("seamguard_consumer_lag", map[string]string{"consumer": c}); lag != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond, "every consumer has delivered everything")

	// Every series the dashboard queries is in this scrape.
	checkDashboard(t, s)

	if *showScrape {
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "seamguard_") || strings.HasPrefix(l, "# HELP seamguard_") || strings.HasPrefix(l, "# TYPE seamguard_") {
				fmt.Println(l)
			}
		}
	}

	// The log: one JSON line per verdict, with session, seq and kind.
	var refusal map[string]any
	for _, l := range strings.Split(errb.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "verdict" && m["kind"] == "refused" {
			refusal = m
		}
	}
	require.NotNil(t, refusal, "no refusal in the log:\n%s", errb.String())
	if *showScrape {
		for _, l := range strings.Split(errb.String(), "\n") {
			if strings.Contains(l, `"msg":"verdict"`) || strings.Contains(l, `"msg":"spilled"`) {
				fmt.Println(l)
			}
		}
	}
	assert.Equal(t, "INFO", refusal["level"])
	assert.Equal(t, "ops-agent-42", refusal["session"])
	assert.Equal(t, 55.0, refusal["seq"])
	assert.Equal(t, "compact-1", refusal["request_id"])
	assert.Equal(t, []any{"coverage_hole"}, refusal["reasons"])
	assert.Equal(t, "ops-agent-42/1.jsonl", refusal["spill"])

	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code, errb.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// spillHandle reads the seed story's spill handle from the verdict stream.
func spillHandle(t *testing.T, js jetstream.JetStream) *events.SpillHandle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := js.Stream(ctx, "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	raw, err := m.GetLastMsgForSubject(ctx, "seamguard.verdicts.ops-agent-42.spilled")
	require.NoError(t, err)
	vd, err := events.DecodeVerdict(raw.Data)
	require.NoError(t, err)
	return vd.Data.(*events.SpillHandle)
}

// dashboardMetric finds a metric name in a PromQL expression.
var dashboardMetric = regexp.MustCompile(`\bseamguard_[a-z_]+\b`)

// dashboardLabels finds label names in selectors and by/without clauses.
var (
	selectorLabel = regexp.MustCompile(`[{,]\s*([a-z_]+)\s*(?:=~|!~|!=|=)`)
	groupingLabel = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// checkDashboard holds every query of deploy/grafana/seamguard.json to a
// real scrape: each metric it names is there, and each label it selects or
// groups by is a label of a metric the query names (or le of a histogram).
func checkDashboard(t *testing.T, s metricstest.Scrape) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "seamguard.json"))
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &d))
	n := 0
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			n++
			names := dashboardMetric.FindAllString(q.Expr, -1)
			require.NotEmpty(t, names, "panel %q: %s", p.Title, q.Expr)
			labels := map[string]bool{}
			for _, name := range names {
				if !assert.True(t, s.Has(name), "panel %q queries %s, which the scrape does not have", p.Title, name) {
					continue
				}
				if strings.HasSuffix(name, "_bucket") {
					labels["le"] = true
				}
				base := name
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if s[base] == nil {
						base = strings.TrimSuffix(base, suf)
					}
				}
				for _, m := range s[base].GetMetric() {
					for _, lp := range m.GetLabel() {
						labels[lp.GetName()] = true
					}
				}
			}
			var used []string
			for _, m := range selectorLabel.FindAllStringSubmatch(q.Expr, -1) {
				used = append(used, m[1])
			}
			for _, m := range groupingLabel.FindAllStringSubmatch(q.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					used = append(used, strings.TrimSpace(l))
				}
			}
			for _, l := range used {
				assert.True(t, labels[l], "panel %q uses label %q, which %v do not have", p.Title, l, names)
			}
		}
	}
	assert.Greater(t, n, 10, "dashboard queries")
}

// TestServeLogAndMetricsFlags checks the logging and metrics flags' errors,
// given as flags and as environment variables.
func TestServeLogAndMetricsFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"serve", "--log-format", "xml"}, nil, `--log-format "xml": use text or json`},
		{[]string{"serve", "--log-level", "loud"}, nil, `--log-level "loud": use debug, info, warn or error`},
		{[]string{"serve"}, map[string]string{"SEAMGUARD_LOG_FORMAT": "yaml"}, `--log-format "yaml"`},
		{[]string{"serve"}, map[string]string{"SEAMGUARD_LOG_LEVEL": "chatty"}, `--log-level "chatty"`},
		{[]string{"serve", "--lag-interval", "1ms"}, nil, `invalid value "1ms" for flag -lag-interval: out of range; use 100ms to 1h`},
		{[]string{"serve"}, map[string]string{"SEAMGUARD_LAG_INTERVAL": "often"}, "SEAMGUARD_LAG_INTERVAL"},
	} {
		t.Run(strings.Join(append(tc.args[1:], fmt.Sprint(tc.env)), " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, _, stderr := runCLI(t, "", tc.args...)
			assert.Equal(t, 2, code, stderr)
			assert.Contains(t, stderr, tc.want)
		})
	}
}
