package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/internal/workload"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

var (
	chaosSize   = flag.String("chaos", "short", "size of TestChaos: short (runs in CI) or full (>= 20,000 events over >= 200 sessions, >= 10 SIGKILLs)")
	chaosReport = flag.String("chaos-report", "", "write TestChaos's report as JSON to this file")
)

// chaosPlan sizes one chaos run.
type chaosPlan struct {
	Sessions int
	Kills    int
	Publish  time.Duration // how long publishing the fleet is spread over
	MinGap   time.Duration // between a (re)start of the processor and its next kill
	MaxGap   time.Duration
}

var chaosPlans = map[string]chaosPlan{
	"short": {Sessions: 40, Kills: 3, Publish: 5 * time.Second, MinGap: 700 * time.Millisecond, MaxGap: 1500 * time.Millisecond},
	"full":  {Sessions: 240, Kills: 12, Publish: 40 * time.Second, MinGap: 1200 * time.Millisecond, MaxGap: 3 * time.Second},
}

// chaosReportT is what a chaos run prints: the books.
type chaosReportT struct {
	Size              string         `json:"size"`
	Sessions          int            `json:"sessions"`
	Events            int            `json:"events"`   // messages published, agent retries included
	Stored            uint64         `json:"stored"`   // messages in the events stream
	Requests          int            `json:"requests"` // distinct compaction.requested events
	Decided           int            `json:"decided"`  // requests with exactly one decision
	Verdicts          int            `json:"verdicts"` // distinct verdict ids in the chaos run
	ReferenceVerdicts int            `json:"reference_verdicts"`
	ByKind            map[string]int `json:"by_kind"`
	Lost              int            `json:"lost"`       // in the reference, not in the chaos run
	Extra             int            `json:"extra"`      // in the chaos run, not in the reference
	Different         int            `json:"different"`  // same id, other content
	Duplicated        int            `json:"duplicated"` // ids stored more than once
	Kills             int            `json:"kills"`
	KillsMidWork      int            `json:"kills_mid_work"` // kills while verdicts were still owed
	NATSRestarts      int            `json:"nats_restarts"`
	PublishRetries    int            `json:"publish_retries"`
	Spills            int            `json:"spills"`
	SpillsVerified    int            `json:"spills_verified"`
	SpillBytes        uint64         `json:"spill_bytes"`
	RebuiltSessions   int            `json:"rebuilt_sessions"`
	SnapshotsDiffer   int            `json:"snapshots_differ"`
	Seconds           float64        `json:"seconds"`
}

// chaosFleet builds the chaos workload: healthy chains of many lengths,
// seed-like stories that spill, gaps that halt and are resumed, sessions with
// broken events, unit mismatches, and agent retries (an event published
// again under its Nats-Msg-Id) sprinkled through all of them.
func chaosFleet(sessions int) *workload.Workload {
	r := rand.New(rand.NewPCG(2026, 11))
	scripts := make([]*workload.Script, sessions)
	for i := range scripts {
		s := &workload.Script{ID: fmt.Sprintf("chaos-%03d", i)}
		switch i % 6 {
		case 0, 5:
			workload.HealthyChain(s, uint64(3+i%5), 8+i%9)
		case 1:
			workload.SeedLike(s)
			workload.Rounds(s, "x", 4, 3+i%4, s.Head-4, false)
		case 2:
			workload.GapThenResume(s)
		case 3:
			workload.Rejections(s)
		case 4:
			workload.UnitMismatch(s)
		}
		// Agent retries: about one event in 40 is published twice.
		var items []workload.Item
		for _, it := range s.Items {
			items = append(items, it)
			if r.IntN(40) == 0 {
				items = append(items, it)
			}
		}
		s.Items = items
		scripts[i] = s
	}
	return workload.Interleave(scripts, r)
}

// readSpill reads the spill called name back from the object store and
// returns the digest and size of what it read.
func readSpill(ctx context.Context, store *spill.Store, name string) (digest string, size uint64, err error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := store.Get(ctx, name, pw)
		pw.CloseWithError(err)
	}()
	digest, size, err = spill.Digest(pr)
	_ = pr.Close()
	return digest, size, err
}

// chaosServer is a NATS server the harness can restart on the same port and
// storage.
type chaosServer struct {
	sync time.Duration
	mu   sync.Mutex
	srv  *server.Server
	dir  string
	port int
}

// startChaosServer starts the embedded server; a sync interval (at most
// one) makes it acknowledge before it syncs.
func startChaosServer(t *testing.T, sync ...time.Duration) *chaosServer {
	t.Helper()
	c := &chaosServer{dir: t.TempDir()}
	if len(sync) > 0 {
		c.sync = sync[0]
	}
	s, err := embedded.Start(embedded.Config{StoreDir: c.dir, SyncInterval: c.sync})
	require.NoError(t, err)
	c.srv, c.port = s, s.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.srv.Shutdown()
		c.srv.WaitForShutdown()
	})
	return c
}

func (c *chaosServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", c.port) }

func (c *chaosServer) restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.srv.Shutdown()
	c.srv.WaitForShutdown()
	s, err := embedded.Start(embedded.Config{StoreDir: c.dir, Port: c.port, SyncInterval: c.sync})
	if err != nil {
		return err
	}
	c.srv = s
	return nil
}

// procRunner starts and kills `seamguard serve` processes.
type procRunner struct {
	t    *testing.T
	bin  string
	url  string
	args []string // not nil: serve's flags instead of those for url
	mu   sync.Mutex
	cmd  *exec.Cmd
	logs bytes.Buffer
	n    int
	from int // where the running process's output starts in logs
}

func (p *procRunner) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	args := p.args
	if args == nil {
		args = []string{"--nats-url", p.url, "--source", "urn:seamguard:test",
			"--shards", "4", "--ack-wait", "2s", "--lease-ttl", "1s", "--log-level", "warn"}
	}
	cmd := exec.Command(p.bin, append([]string{"serve"}, args...)...)
	fmt.Fprintf(&p.logs, "--- process %d\n", p.n)
	p.from = p.logs.Len()
	cmd.Stdout, cmd.Stderr = &syncWriter{mu: &p.mu, w: &p.logs}, &syncWriter{mu: &p.mu, w: &p.logs}
	require.NoError(p.t, cmd.Start())
	p.cmd = cmd
}

// kill sends SIGKILL to the running process and reaps it.
func (p *procRunner) kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// stop sends SIGTERM and waits for the drain; serve must exit 0.
func (p *procRunner) stop() error {
	_, err := p.term(time.Minute)
	return err
}

// term sends SIGTERM and waits up to limit for serve to exit, then kills
// it. It returns how long serve took to exit (limit when it was killed) and
// an error unless it exited 0 within limit.
func (p *procRunner) term(limit time.Duration) (time.Duration, error) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd.ProcessState != nil {
		return 0, nil
	}
	began := time.Now()
	// A SIGTERM that lands before serve has installed its handler (a
	// process started a moment ago) ends it by the signal, not a drain:
	// the drain under test starts once serve says it is serving.
	for !p.serving() && time.Since(began) < limit && !exited(cmd) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return time.Since(began), err
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		return limit, fmt.Errorf("serve did not exit within %s of SIGTERM; killed", limit)
	}
}

// serving reports whether the running process has said it is serving.
func (p *procRunner) serving() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.logs.Bytes()[p.from:], []byte("seamguard serving on"))
}

// exited reports whether cmd's process has ended: reaped, or a zombie
// waiting to be (which still takes signals without an error).
func exited(cmd *exec.Cmd) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return true
	}
	_, rest, _ := bytes.Cut(stat, []byte(") "))
	return len(rest) == 0 || rest[0] == 'Z'
}

// String returns everything the processes wrote so far.
func (p *procRunner) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *procRunner) cleanup() {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.ProcessState == nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// connectChaos connects for the harness itself, reconnecting forever.
func connectChaos(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// publishPaced publishes msgs in order, each only after the one before it
// was acknowledged, so that the stream's order is the list's whatever fails
// on the way. A publish that fails (the server restarting, an ack lost) is
// sent again under the same Nats-Msg-Id until it is acknowledged, which the
// duplicate window makes exactly-once. With spread > 0 message i is not sent
// before start + i*spread/len(msgs). It returns the number of retries.
func publishPaced(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, spread time.Duration) (int, error) {
	retries := 0
	began := time.Now()
	for i, m := range msgs {
		if spread > 0 {
			if d := time.Until(began.Add(spread * time.Duration(i) / time.Duration(len(msgs)))); d > 0 {
				time.Sleep(d)
			}
		}
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.PublishMsg(pctx, m)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return retries, fmt.Errorf("publish %d of %d: %w", i, len(msgs), err)
			}
			retries++
			time.Sleep(100 * time.Millisecond)
		}
	}
	return retries, nil
}

// undisturbed runs msgs through one serve on one embedded server, nothing
// disturbed, and returns the verdicts (normalised bodies by id), each of
// which must be stored once.
func undisturbed(t *testing.T, bin string, msgs []*nats.Msg, wait time.Duration) map[string]string {
	t.Helper()
	srv := startChaosServer(t)
	_, js := connectChaos(t, srv.url())
	p := &procRunner{t: t, bin: bin, url: srv.url()}
	defer p.cleanup()
	p.start()
	_, err := publishPaced(context.Background(), js, msgs, 0)
	require.NoError(t, err)
	waitQuiet(t, js, wait)
	require.NoError(t, p.stop())
	bodies, counts := verdictBodies(t, js)
	for id, n := range counts {
		require.Equal(t, 1, n, "reference: verdict %s stored %d times", id, n)
	}
	return bodies
}

// quiet reports whether every consumer of the processor (seamguard-p0 ...
// and seamguard-invalid; not a reader's own) has nothing pending and
// nothing awaiting an ack.
func quiet(ctx context.Context, js jetstream.JetStream) bool {
	s, err := js.Stream(ctx, "SEAMGUARD_EVENTS")
	if err != nil {
		return false
	}
	lister := s.ListConsumers(ctx)
	n, idle := 0, true
	for ci := range lister.Info() {
		if ci.Name != "seamguard-invalid" && !strings.HasPrefix(ci.Name, "seamguard-p") {
			continue
		}
		n++
		if ci.NumPending > 0 || ci.NumAckPending > 0 {
			idle = false
		}
	}
	// Every consumer of the processor must exist: it creates them one at
	// a time, the one of events that name no session first, and that one
	// alone is idle before anything is consumed.
	return lister.Err() == nil && n == processor.DefaultPartitions+1 && idle
}

func streamMsgs(ctx context.Context, js jetstream.JetStream, name string) uint64 {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// countMsgs is how many messages stream name holds, asked until the server
// answers (a busy machine can time a request out): a count read where a
// figure is asserted never stands in a failed request for zero, as
// streamMsgs, meant for polling, does.
func countMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := js.Stream(ctx, name)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = s.Info(ctx)
		}
		cancel()
		if err == nil {
			return info.State.Msgs
		}
		if time.Now().After(deadline) {
			t.Fatalf("reading stream %s: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitQuiet waits until the processor has consumed and acknowledged every
// input.
func waitQuiet(t *testing.T, js jetstream.JetStream, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return quiet(context.Background(), js) }, timeout, 100*time.Millisecond,
		"the processor did not consume every input")
}

// TestChaos is the chaos harness. It runs the fleet once undisturbed as the
// reference, then again while SIGKILLing the processor (a separate `seamguard
// serve` process) at random moments and restarting the NATS server once, and
// checks the books: every compaction request has exactly one decision, the
// verdict streams are identical (none lost, none extra, none duplicated),
// every spill reads back with its digest, and every session's stored
// snapshot equals a rebuild from the events stream.
//
// The default (short) size runs in CI; -chaos=full is the large run:
//
//	SEAMGUARD_LONG=1 go test ./cmd/seamguard -run TestChaos -v -chaos=full -timeout 30m
func TestChaos(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	plan, ok := chaosPlans[*chaosSize]
	require.True(t, ok, "-chaos is %q; use short or full", *chaosSize)
	began := time.Now()
	bin := buildBinary(t)
	w := chaosFleet(plan.Sessions)
	subj := events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions}
	rep := chaosReportT{Size: *chaosSize, Sessions: plan.Sessions, Events: len(w.Items), ByKind: map[string]int{}}
	if *chaosSize == "full" {
		require.GreaterOrEqual(t, len(w.Items), 20000)
		require.GreaterOrEqual(t, plan.Sessions, 200)
		require.GreaterOrEqual(t, plan.Kills, 10)
	}
	requests := map[string]bool{}
	for _, it := range w.Items {
		var a struct{ ID, Type string }
		if it.Raw == nil && json.Unmarshal(it.Line, &a) == nil && a.Type == events.TypeCompactionRequested {
			requests[a.ID] = true
		}
	}
	rep.Requests = len(requests)
	freshMsgs := func() []*nats.Msg {
		msgs, err := w.Msgs(subj)
		require.NoError(t, err)
		return msgs
	}

	// The reference: the same binary, the same events in the same order,
	// nothing disturbed.
	ref := undisturbed(t, bin, freshMsgs(), 5*time.Minute)
	rep.ReferenceVerdicts = len(ref)
	t.Logf("reference run: %d events, %d verdicts (%s)", len(w.Items), len(ref), time.Since(began).Round(time.Millisecond))

	// The chaos run.
	srv := startChaosServer(t)
	_, js := connectChaos(t, srv.url())
	p := &procRunner{t: t, bin: bin, url: srv.url()}
	defer p.cleanup()
	t.Cleanup(func() {
		if t.Failed() {
			p.mu.Lock()
			t.Logf("serve output:\n%s", p.logs.String())
			p.mu.Unlock()
		}
	})
	p.start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var published atomic.Bool
	pubErr := make(chan error, 1)
	go func() {
		n, err := publishPaced(ctx, js, freshMsgs(), plan.Publish)
		rep.PublishRetries = n
		published.Store(true)
		pubErr <- err
	}()
	r := rand.New(rand.NewPCG(7, uint64(plan.Sessions)))
	gap := func() time.Duration {
		return plan.MinGap + time.Duration(r.Int64N(int64(plan.MaxGap-plan.MinGap)))
	}
	want := uint64(len(ref))
	for k := range plan.Kills {
		time.Sleep(gap())
		if streamMsgs(ctx, js, "SEAMGUARD_VERDICTS") < want {
			rep.KillsMidWork++
		}
		p.kill()
		rep.Kills++
		// A restarted processor comes up at once or after a pause.
		if r.IntN(3) == 0 {
			time.Sleep(time.Duration(r.IntN(500)) * time.Millisecond)
		}
		p.start()
		if k == plan.Kills/2 {
			// The broker goes down under a live processor and a publishing
			// agent, and comes back on the same storage.
			time.Sleep(gap() / 2)
			require.NoError(t, srv.restart())
			rep.NATSRestarts++
		}
	}
	require.NoError(t, <-pubErr)
	require.True(t, published.Load())
	waitQuiet(t, js, 5*time.Minute)
	require.Eventually(t, func() bool { return streamMsgs(ctx, js, "SEAMGUARD_VERDICTS") >= want }, time.Minute, 100*time.Millisecond,
		"the chaos run should reach the reference's %d verdicts", want)
	require.NoError(t, p.stop(), "serve exits 0 on SIGTERM after draining")
	rep.Stored = countMsgs(t, js, "SEAMGUARD_EVENTS")

	// The books: verdicts against the reference.
	got, counts := verdictBodies(t, js)
	rep.Verdicts = len(got)
	var diffs []string
	for id, n := range counts {
		if n > 1 {
			rep.Duplicated++
			diffs = append(diffs, fmt.Sprintf("%s: stored %d times", id, n))
		}
	}
	for id, body := range ref {
		switch g, ok := got[id]; {
		case !ok:
			rep.Lost++
			diffs = append(diffs, fmt.Sprintf("%s: lost: %s", id, body))
		case g != body:
			rep.Different++
			diffs = append(diffs, fmt.Sprintf("%s:\n  reference: %s\n  chaos:     %s", id, body, g))
		}
	}
	for id, body := range got {
		if _, ok := ref[id]; !ok {
			rep.Extra++
			diffs = append(diffs, fmt.Sprintf("%s: extra: %s", id, body))
		}
	}
	// Exactly one decision per compaction request, and the spills.
	decisions := map[string]int{}
	store := &spill.Store{JS: js, Stream: "SEAMGUARD_EVENTS", Subjects: subj, Bucket: "seamguard-spills"}
	for _, body := range got {
		var v struct {
			Type        string          `json:"type"`
			CausationID string          `json:"causationid"`
			Data        json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		rep.ByKind[strings.TrimPrefix(v.Type, events.TypePrefix)]++
		switch v.Type {
		case events.TypeCompactionAllowed, events.TypeCompactionRefused, events.TypeSessionHalted, events.TypeEventRejected:
			if requests[v.CausationID] {
				decisions[v.CausationID]++
			}
		case events.TypeTranscriptSpilled:
			rep.Spills++
			var h events.SpillHandle
			require.NoError(t, json.Unmarshal(v.Data, &h), "transcript.spilled: %s", body)
			digest, size, err := readSpill(ctx, store, h.Name)
			if assert.NoError(t, err, "spill %s", h.Name) && assert.Equal(t, h.Digest, digest, "spill %s", h.Name) && assert.Equal(t, h.Size, size) {
				rep.SpillsVerified++
				rep.SpillBytes += size
			}
		}
	}
	for id := range requests {
		if decisions[id] == 1 {
			rep.Decided++
		} else {
			diffs = append(diffs, fmt.Sprintf("request %s has %d decisions", id, decisions[id]))
		}
	}
	// The snapshots against a rebuild from the events stream.
	cfg := processor.Config{Source: "urn:seamguard:test"}
	proc, err := processor.New(ctx, js, cfg)
	require.NoError(t, err)
	rb, err := proc.Rebuild(ctx, false)
	require.NoError(t, err)
	rep.RebuiltSessions, rep.SnapshotsDiffer = rb.Sessions, len(rb.Differ)
	rep.Seconds = time.Since(began).Seconds()

	out, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("chaos report:\n%s", out)
	if *chaosReport != "" {
		require.NoError(t, os.WriteFile(*chaosReport, append(out, '\n'), 0o644))
	}
	sort.Strings(diffs)
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("... and %d more", len(diffs)-5))
	}
	assert.Empty(t, diffs, "the chaos run's books differ from the reference")
	assert.Empty(t, rb.Differ, "stored snapshots that differ from a rebuild from the events stream")
	assert.Equal(t, len(requests), rep.Decided)
	assert.Equal(t, rep.Spills, rep.SpillsVerified)
	assert.NotZero(t, rep.Spills, "the fleet spills")
	assert.Equal(t, plan.Kills, rep.Kills)
	assert.Equal(t, 1, rep.NATSRestarts)
	assert.Equal(t, len(ref), len(got))
}

// TestQuietWaitsForEveryConsumer: with only the first consumer the
// processor creates (seamguard-invalid, which matches none of a fleet's
// events) in place, a backlog is not consumed, and quiet must not say so.
func TestQuietWaitsForEveryConsumer(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx := context.Background()
	cfg := processor.Config{Source: "urn:seamguard:test"}
	_, err := processor.Provision(ctx, srv.JS, cfg)
	require.NoError(t, err)
	_, err = srv.JS.Publish(ctx, cfg.Subjects().Events("s1"), []byte(`{}`))
	require.NoError(t, err)
	_, err = srv.JS.CreateOrUpdateConsumer(ctx, cfg.Names().Events, cfg.ConsumerConfig(-1))
	require.NoError(t, err)
	require.False(t, quiet(ctx, srv.JS), "one idle consumer of five, and the backlog untouched")
	for part := range processor.DefaultPartitions {
		_, err = srv.JS.CreateOrUpdateConsumer(ctx, cfg.Names().Events, cfg.ConsumerConfig(part))
		require.NoError(t, err)
	}
	require.False(t, quiet(ctx, srv.JS), "every consumer, one with the event pending")
}
