package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/internal/workload"
	"github.com/seamguard/seamguard/processor"
)

var (
	burstSize   = flag.String("burst", "short", "size of TestBurst: short (runs in CI) or full (a backlog of 100,000 events)")
	burstReport = flag.String("burst-report", "", "write TestBurst's report as JSON to this file")
)

// burstRun is one backlog drained by a processor started late.
type burstRun struct {
	Events        int     `json:"events"`
	Sessions      int     `json:"sessions"`
	PublishSecs   float64 `json:"publish_seconds"`
	DrainSecs     float64 `json:"drain_seconds"` // processor start to every input acknowledged
	EventsPerSec  float64 `json:"events_per_second"`
	PeakRSSMiB    float64 `json:"peak_rss_mib"` // VmHWM of the processor process
	EndRSSMiB     float64 `json:"end_rss_mib"`
	MaxAckPending int     `json:"max_ack_pending"` // most inputs seen delivered and unacknowledged at once
	Verdicts      uint64  `json:"verdicts"`
}

// burstFleet is sessions healthy chains of about perSession events each:
// every event a turn, a compaction or a commit, none rejected.
func burstFleet(sessions, perSession int) *workload.Workload {
	scripts := make([]*workload.Script, sessions)
	for i := range scripts {
		s := &workload.Script{ID: fmt.Sprintf("burst-%05d", i)}
		// A round of span 4 is 10 turns, a compaction (two every third
		// round) and a commit: about 12.3 events.
		workload.HealthyChain(s, 4, max(1, int(math.Round(float64(perSession)*3/37))))
		scripts[i] = s
	}
	return workload.Interleave(scripts, rand.New(rand.NewPCG(5, 5)))
}

// procStatus reads a field of /proc/<pid>/status in KiB.
func procStatus(pid int, field string) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// publishFast publishes msgs in order with asynchronous publishes in
// windows, and waits for every ack.
func publishFast(t *testing.T, js jetstream.JetStream, msgs []*nats.Msg) {
	t.Helper()
	require.NoError(t, publishAsync(js, msgs))
}

// publishAsync is publishFast, returning the first failure instead.
func publishAsync(js jetstream.JetStream, msgs []*nats.Msg) error {
	const window = 2000
	for lo := 0; lo < len(msgs); lo += window {
		hi := min(lo+window, len(msgs))
		futs := make([]jetstream.PubAckFuture, 0, hi-lo)
		for _, m := range msgs[lo:hi] {
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return fmt.Errorf("publish: %w", err)
			case <-time.After(time.Minute):
				return errors.New("publish: no ack within a minute")
			}
		}
	}
	return nil
}

// burstAckPending is serve's --max-ack-pending in TestBurst: both backlogs
// are several times what the consumers may have in flight.
const burstAckPending = 256

// burst publishes the fleet to a fresh server with no processor running,
// then starts one and measures it until the backlog is drained.
func burst(t *testing.T, bin string, w *workload.Workload) burstRun {
	t.Helper()
	srv := startChaosServer(t)
	_, js := connectChaos(t, srv.url())
	ctx := context.Background()
	// Provision first, as a deployment would, so that the events stream
	// exists while the agents publish and the processor is down.
	cfg := processor.Config{Source: "urn:seamguard:test"}
	_, err := processor.Provision(ctx, js, cfg)
	require.NoError(t, err)
	msgs, err := w.Msgs(events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions})
	require.NoError(t, err)
	run := burstRun{Events: len(msgs), Sessions: w.Sessions}
	t0 := time.Now()
	publishFast(t, js, msgs)
	run.PublishSecs = time.Since(t0).Seconds()
	require.Equal(t, uint64(len(msgs)), countMsgs(t, js, "SEAMGUARD_EVENTS"))

	p := &procRunner{t: t, bin: bin, url: srv.url(), args: []string{"--nats-url", srv.url(), "--source", "urn:seamguard:test",
		"--shards", "4", "--ack-wait", "2s", "--lease-ttl", "1s", "--log-level", "warn", "--max-ack-pending", strconv.Itoa(burstAckPending)}}
	defer p.cleanup()
	t1 := time.Now()
	p.start()
	pid := p.cmd.Process.Pid
	var mu sync.Mutex
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			s, err := js.Stream(ctx, "SEAMGUARD_EVENTS")
			if err != nil {
				continue
			}
			pending := 0
			lister := s.ListConsumers(ctx)
			for ci := range lister.Info() {
				pending += ci.NumAckPending
			}
			mu.Lock()
			run.MaxAckPending = max(run.MaxAckPending, pending)
			mu.Unlock()
		}
	}()
	waitQuiet(t, js, 10*time.Minute)
	run.DrainSecs = time.Since(t1).Seconds()
	close(stop)
	<-sampled
	hwm, err := procStatus(pid, "VmHWM")
	require.NoError(t, err)
	rss, err := procStatus(pid, "VmRSS")
	require.NoError(t, err)
	run.PeakRSSMiB, run.EndRSSMiB = float64(hwm)/1024, float64(rss)/1024
	run.EventsPerSec = float64(run.Events) / run.DrainSecs
	run.Verdicts = countMsgs(t, js, "SEAMGUARD_VERDICTS")
	require.NoError(t, p.stop())
	return run
}

// TestBurst is the backpressure test: a backlog published while no
// processor runs, then drained by one started late. It drains two backlogs
// over the same sessions, one four times the other, and checks that the
// processor's peak RSS does not follow the backlog: fetches, shard queues
// and unacknowledged deliveries are bounded (serve --max-ack-pending, here
// well below the smaller backlog), so only the sessions' ledgers grow, and
// they are the same sessions.
//
// The default (short) size runs in CI; -burst=full drains 100,000 events:
//
//	SEAMGUARD_LONG=1 go test ./cmd/seamguard -run TestBurst -v -burst=full -timeout 30m
func TestBurst(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	sessions, big := 200, 20000
	if *burstSize == "full" {
		sessions, big = 1000, 100000
	} else {
		require.Equal(t, "short", *burstSize, "-burst is %q; use short or full", *burstSize)
	}
	bin := buildBinary(t)
	small := burst(t, bin, burstFleet(sessions, big/4/sessions))
	large := burst(t, bin, burstFleet(sessions, big/sessions))
	if *burstSize == "full" {
		require.GreaterOrEqual(t, large.Events, 100000)
	}
	report := map[string]any{"size": *burstSize, "small": small, "large": large,
		"backlog_ratio":  float64(large.Events) / float64(small.Events),
		"peak_rss_ratio": large.PeakRSSMiB / small.PeakRSSMiB}
	out, _ := json.MarshalIndent(report, "", "  ")
	t.Logf("burst report:\n%s", out)
	if *burstReport != "" {
		require.NoError(t, os.WriteFile(*burstReport, append(out, '\n'), 0o644))
	}
	for _, r := range []burstRun{small, large} {
		assert.NotZero(t, r.Verdicts)
		// MaxAckPending of the consumers (one a partition and the
		// control consumer) bounds what is in flight, well below either
		// backlog.
		bound := burstAckPending * (processor.DefaultPartitions + 1)
		assert.LessOrEqual(t, r.MaxAckPending, bound)
		assert.Greater(t, r.Events, 4*bound, "the backlog is several times what may be in flight")
	}
	// Four times the backlog must not mean anywhere near four times the
	// memory.
	assert.Less(t, large.PeakRSSMiB/small.PeakRSSMiB, 1.5, "peak RSS follows the backlog")
}
