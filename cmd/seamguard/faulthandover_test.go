package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/inspect"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// handOverPlan sizes TestFaultHandOver.
type handOverPlan struct {
	Sessions int
	Publish  time.Duration // the fleet's events are spread over this long
	Rounds   int           // each round drains and restarts, pauses, and kills
}

var handOverPlans = map[string]handOverPlan{
	"short": {Sessions: 48, Publish: 24 * time.Second, Rounds: 1},
	"full":  {Sessions: 240, Publish: 90 * time.Second, Rounds: 3},
}

// TestFaultHandOver runs two `seamguard serve` instances on one server
// under a steady fleet load and moves partitions between them every way
// they move: a drain and restart (handed over and taken back), a pause
// of the instance holding most partitions for longer than its lease
// (SIGSTOP, then SIGCONT: it wakes with deliveries in hand that the other
// instance has taken over), and a SIGKILL (the lease expires). Afterwards
// every verdict id is in the verdict stream once, and `seamguard replay`
// derives every verdict and every stored state again from the events
// stream and finds nothing missing, extra or different.
func TestFaultHandOver(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	plan, ok := handOverPlans[*faultsSize]
	require.True(t, ok, "-faults is %q; use short or full", *faultsSize)
	bin := buildBinary(t)
	// No power is lost here, so the sync setting should not matter: the
	// full size shows that it does not.
	settings := map[string]time.Duration{"durable": 0}
	if *faultsSize == "full" {
		settings["lazy"] = 2 * time.Minute
	}
	for name, sync := range settings {
		t.Run(name, func(t *testing.T) { faultHandOver(t, plan, bin, name, sync) })
	}
}

func faultHandOver(t *testing.T, plan handOverPlan, bin, setting string, sync time.Duration) {
	srv := startChaosServer(t, sync)
	_, js := connectChaos(t, srv.url())
	const ttl = 2 * time.Second
	args := []string{"--nats-url", srv.url(), "--source", "urn:seamguard:test", "--shards", "4",
		"--ack-wait", "2s", "--lease-ttl", ttl.String(), "--log-level", "info", "--signing-key-file", sharedSigningKey(t)}
	procs := []*procRunner{{t: t, bin: bin, url: srv.url(), args: args}, {t: t, bin: bin, url: srv.url(), args: args}}
	for _, p := range procs {
		defer p.cleanup()
		p.start()
	}
	defer func() {
		if t.Failed() {
			for i, p := range procs {
				t.Logf("instance %d:\n%s", i, tail(p.String(), 80))
			}
		}
	}()

	w := chaosFleet(plan.Sessions)
	msgs, err := w.Msgs(events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), plan.Publish+5*time.Minute)
	defer cancel()
	published := make(chan error, 1)
	go func() {
		_, err := publishPaced(ctx, js, msgs, plan.Publish)
		published <- err
	}()

	// holder returns the instance holding the most partitions now.
	holder := func() int {
		kv, err := js.KeyValue(ctx, "seamguard-leases")
		require.NoError(t, err)
		counts := make([]int, len(procs))
		for p := range processor.DefaultPartitions {
			e, err := kv.Get(ctx, "p"+strconv.Itoa(p))
			if err != nil {
				continue
			}
			for i, pr := range procs {
				pr.mu.Lock()
				pid := pr.cmd.Process.Pid
				pr.mu.Unlock()
				if strings.Contains(string(e.Value()), "-"+strconv.Itoa(pid)+"-") {
					counts[i]++
				}
			}
		}
		best := 0
		for i := range counts {
			if counts[i] > counts[best] {
				best = i
			}
		}
		return best
	}
	gap := plan.Publish / time.Duration(3*plan.Rounds+1)
	faults := 0
	for round := range plan.Rounds {
		time.Sleep(gap)
		i := round % 2
		_, err := procs[i].term(time.Minute)
		require.NoError(t, err, "instance %d did not drain", i)
		procs[i].start()
		faults++

		time.Sleep(gap)
		i = holder()
		procs[i].mu.Lock()
		pid := procs[i].cmd.Process.Pid
		procs[i].mu.Unlock()
		require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
		time.Sleep(2*ttl + time.Second)
		require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
		faults++

		time.Sleep(gap)
		i = holder()
		procs[i].kill()
		procs[i].start()
		faults++
	}
	require.NoError(t, <-published)
	healed := time.Now()
	waitQuiet(t, js, 3*time.Minute)
	recovery := time.Since(healed)
	for i, p := range procs {
		_, err := p.term(time.Minute)
		require.NoError(t, err, "instance %d did not drain at the end", i)
	}

	_, counts := verdictBodies(t, js)
	dups := 0
	for id, n := range counts {
		if n > 1 {
			dups++
			t.Errorf("verdict %s is in the stream %d times", id, n)
		}
	}
	rep := replayReport(t, srv.url())
	kinds := map[string]int{}
	for _, d := range rep.Differences {
		kinds[d.Kind]++
	}
	for i, d := range rep.Differences {
		if i < 10 {
			b, _ := json.Marshal(d)
			t.Errorf("replay: %s", b)
		}
	}
	// Agents publish some events twice under one Nats-Msg-Id (a retry):
	// the stream keeps one of each.
	distinct := map[string]bool{}
	for _, m := range msgs {
		distinct[m.Header.Get("Nats-Msg-Id")] = true
	}
	acked, _ := js.Stream(ctx, "SEAMGUARD_EVENTS")
	info, err := acked.Info(ctx)
	require.NoError(t, err)
	reportFault(t, faultRow{Fault: fmt.Sprintf("hand-overs: %d drains, pauses past the lease, kills; 2 instances", faults),
		Setting: setting, Acked: len(distinct), Lost: len(distinct) - int(info.State.Msgs),
		VerdictsLost: kinds["missing"], Different: kinds["different"] + kinds["state"], Duplicated: max(dups, kinds["duplicate"]) + kinds["extra"],
		Recovery: recovery, Note: fmt.Sprintf("replay compared %d verdicts, %d states", rep.Derived, rep.States)})
	require.Empty(t, rep.Differences, "replay found differences")
	require.Greater(t, rep.Derived, 100)
	require.Equal(t, len(distinct), int(info.State.Msgs), "every acknowledged event is in the events stream")
}

// replayReport runs `seamguard replay --json` against url.
func replayReport(t *testing.T, url string) inspect.ReplayReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"replay", "--nats-url", url, "--json", "--progress", "never"}, nil, &stdout, &stderr)
	var rep inspect.ReplayReport
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "replay exit %d: %s %s", code, stdout.String(), stderr.String())
	if code != 0 && len(rep.Differences) == 0 {
		t.Fatalf("replay exit %d: %s", code, stderr.String())
	}
	return rep
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
