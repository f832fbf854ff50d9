package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/inspect"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/lazyfs"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// powerPlan sizes one run of TestFaultPowerCut.
type powerPlan struct {
	Sessions int     // of the chaos fleet, on a single server
	Cluster  int     // of the chaos fleet, on the cluster
	Before   float64 // share of the fleet's events published before the cut; the rest after the restart
}

var powerPlans = map[string]powerPlan{
	"short": {Sessions: 12, Cluster: 7, Before: 0.7},
	"full":  {Sessions: 120, Cluster: 60, Before: 0.7},
}

// TestFaultPowerCut cuts the power under seamguard and its NATS servers,
// each server's storage on a lazy filesystem (internal/lazyfs) that keeps
// what was not fsynced in memory and drops it at the cut. For a single
// server (`serve` with its embedded server, --data-dir on the lazy mount)
// and a three-node cluster (three child nats-servers, each store on its
// own lazy mount, every node losing power together; serve on --nats-url),
// each with the server syncing lazily (every 2m) and durably (always):
//
//   - agents publish most of the chaos fleet (stories that spill among
//     them), each event acknowledged; a subscriber (an ordered consumer on
//     the verdict stream) records every verdict and spill handle;
//   - the power is cut: serve and the servers SIGKILLed, every mount's
//     unsynced writes dropped, unmounted and mounted again, all restarted;
//   - the rest of the fleet is published, and the books are kept: every
//     acknowledged event in the events stream, every verdict received in
//     the verdict stream as received, every spill handle readable with its
//     digest, every stored snapshot equal to a rebuild from the events
//     stream, every verdict equal to `replay`'s derivation from the events
//     stream (new requests included), no verdict stored twice.
//
// The durable runs must keep every book. The lazy runs must lose something
// (acknowledged events or received verdicts): if one lost nothing, the
// test could not tell durable from lazy, and it fails saying so.
func TestFaultPowerCut(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	needRoot(t, true)
	plan, ok := powerPlans[*faultsSize]
	require.True(t, ok, "-faults is %q; use short or full", *faultsSize)
	bin := buildBinary(t)
	for _, topo := range []string{"single server", "3-node cluster, all nodes"} {
		for _, setting := range []string{"lazy", "durable"} {
			t.Run(strings.ReplaceAll(topo, " ", "_")+"/"+setting, func(t *testing.T) {
				powerCutRun(t, bin, plan, topo, setting)
			})
		}
	}
}

// powerRig is one topology: the lazy mounts, the servers on them and serve.
type powerRig struct {
	t       *testing.T
	bin     string
	cluster bool
	sync    string // "always" or "2m"
	mounts  []*lazyfs.FS
	serve   *procRunner
	health  string   // serve's http://HOST:PORT
	url     string   // the NATS URL(s), comma-separated
	confs   []string // cluster: each node's nats-server configuration
	logs    []string // cluster: each node's log file
	mu      sync.Mutex
	nodes   []powerNode // cluster: the running child servers
	// serveRestarts counts the times serve was started again because it
	// was not ready in time.
	serveRestarts int
}

type powerNode struct {
	pid  int
	stop func()
}

func newPowerRig(t *testing.T, bin string, cluster bool, setting string) *powerRig {
	r := &powerRig{t: t, bin: bin, cluster: cluster, sync: "always"}
	if setting == "lazy" {
		r.sync = "2m"
	}
	n := 1
	if cluster {
		n = 3
	}
	base := t.TempDir()
	for i := range n {
		dir, backing := filepath.Join(base, fmt.Sprintf("mnt%d", i+1)), filepath.Join(base, fmt.Sprintf("disk%d", i+1))
		require.NoError(t, os.Mkdir(dir, 0o755))
		require.NoError(t, os.Mkdir(backing, 0o755))
		m, err := lazyfs.Mount(dir, backing, lazyfs.Options{NoBackingSync: true})
		require.NoError(t, err)
		r.mounts = append(r.mounts, m)
	}
	// Cleanups run last first: the processes are killed before the
	// mounts go, and the mounts go before the temporary directory.
	t.Cleanup(func() {
		for _, m := range r.mounts {
			if err := m.Unmount(); err != nil {
				t.Errorf("unmount: %v", err)
				_ = syscall.Unmount(m.Dir(), syscall.MNT_DETACH)
			}
		}
	})
	t.Cleanup(r.killAll)
	args := []string{"--source", "urn:seamguard:test", "--shards", "4", "--ack-wait", "2s", "--lease-ttl", "1s", "--log-level", "warn"}
	healthPort := freePort(t)
	r.health = fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	args = append(args, "--health-listen", fmt.Sprintf("127.0.0.1:%d", healthPort), "--lag-interval", "1s")
	if cluster {
		var urls []string
		client, route := make([]int, n), make([]int, n)
		var routes []string
		for i := range n {
			client[i], route[i] = freePort(t), freePort(t)
			urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", client[i]))
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", route[i]))
		}
		r.url = strings.Join(urls, ",")
		sync := "always"
		if r.sync != "always" {
			sync = fmt.Sprintf("%q", r.sync)
		}
		for i := range n {
			conf := fmt.Sprintf(`server_name: n%d
listen: 127.0.0.1:%d
log_file: %q
jetstream {
  store_dir: %q
  sync_interval: %s
}
cluster {
  name: powercut
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, i+1, client[i], filepath.Join(base, fmt.Sprintf("n%d.log", i+1)), r.mounts[i].Dir(), sync, route[i], strings.Join(routes, ", "))
			path := filepath.Join(base, fmt.Sprintf("n%d.conf", i+1))
			require.NoError(t, os.WriteFile(path, []byte(conf), 0o644))
			r.confs = append(r.confs, path)
			r.logs = append(r.logs, filepath.Join(base, fmt.Sprintf("n%d.log", i+1)))
		}
		args = append(args, "--nats-url", r.url)
	} else {
		port := freePort(t)
		r.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
		args = append(args, "--data-dir", r.mounts[0].Dir(), "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--sync-interval", r.sync)
	}
	r.serve = &procRunner{t: t, bin: bin, args: args}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serve's output:\n%s", tail(r.serve.String(), 40))
			for i, l := range r.logs {
				b, _ := os.ReadFile(l)
				t.Logf("node %d's log:\n%s", i+1, tail(string(b), 20))
			}
		}
	})
	return r
}

// start starts the servers (cluster) and serve, and waits until serve is
// ready. It returns an error rather than failing: after a lazy power cut a
// server may not come back.
func (r *powerRig) start() error {
	if r.cluster {
		type started struct {
			i   int
			n   powerNode
			err error
		}
		ch := make(chan started, len(r.confs))
		for i, conf := range r.confs {
			go func() {
				_, pid, stop, err := embedded.StartChild([]string{r.bin, "bench"}, r.mounts[i].Dir(), embedded.ChildConfigEnv+"="+conf)
				ch <- started{i, powerNode{pid, stop}, err}
			}()
		}
		var errs []string
		for range r.confs {
			s := <-ch
			if s.err != nil {
				errs = append(errs, fmt.Sprintf("node %d: %v", s.i+1, s.err))
				continue
			}
			r.mu.Lock()
			r.nodes = append(r.nodes, s.n)
			r.mu.Unlock()
		}
		if len(errs) > 0 {
			return fmt.Errorf("cluster: %s", strings.Join(errs, "; "))
		}
		if err := clusterReady(r.url, time.Minute); err != nil {
			return err
		}
	}
	// serve gives up when the streams it needs do not answer in time (a
	// cluster electing their leaders after a restart): a supervisor would
	// start it again, and so does this.
	for try := 1; ; try++ {
		r.serve.start()
		if waitStatus(r.health+"/readyz", http.StatusOK, 20*time.Second) {
			if try > 1 {
				r.serveRestarts += try - 1
				r.t.Logf("serve was ready at its try %d", try)
			}
			return nil
		}
		r.serve.cleanup()
		if try == 3 {
			return fmt.Errorf("serve not ready after %d tries of 20s", try)
		}
	}
}

// clusterReady waits until the JetStream API answers through every server,
// and every stream and consumer there is answers too (has a leader).
func clusterReady(urls string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for _, u := range strings.Split(urls, ",") {
		for {
			nc, err := nats.Connect(u)
			if err == nil {
				js, _ := jetstream.New(nc)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				err = streamsAnswer(ctx, js)
				cancel()
				nc.Close()
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster not ready through %s after %s: %w", u, limit, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// streamsAnswer asks JetStream for its account, and every stream and
// consumer for its state.
func streamsAnswer(ctx context.Context, js jetstream.JetStream) error {
	if _, err := js.AccountInfo(ctx); err != nil {
		return err
	}
	names := js.StreamNames(ctx)
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	if err := names.Err(); err != nil {
		return err
	}
	for _, n := range streams {
		s, err := js.Stream(ctx, n)
		if err != nil {
			return fmt.Errorf("stream %s: %w", n, err)
		}
		cl := s.ConsumerNames(ctx)
		var consumers []string
		for c := range cl.Name() {
			consumers = append(consumers, c)
		}
		if err := cl.Err(); err != nil {
			return fmt.Errorf("consumers of %s: %w", n, err)
		}
		for _, c := range consumers {
			if _, err := s.Consumer(ctx, c); err != nil {
				return fmt.Errorf("consumer %s of %s: %w", c, n, err)
			}
		}
	}
	return nil
}

// killAll SIGKILLs serve and every server, by PID, and reaps them.
func (r *powerRig) killAll() {
	r.serve.cleanup()
	r.mu.Lock()
	nodes := r.nodes
	r.nodes = nil
	r.mu.Unlock()
	for _, n := range nodes {
		_ = syscall.Kill(n.pid, syscall.SIGKILL)
	}
	for _, n := range nodes {
		n.stop() // reaps it
	}
}

// cut is the power cut: every process SIGKILLed, then every node's
// unsynced writes dropped together, every mount unmounted and mounted
// again on the same backing directory.
func (r *powerRig) cut() (files int, bytes int64) {
	t := r.t
	began := time.Now()
	r.killAll()
	t.Logf("cut: killed in %s", time.Since(began).Round(time.Millisecond))
	for _, m := range r.mounts {
		f, b, err := m.DropUnsynced()
		require.NoError(t, err)
		files, bytes = files+f, bytes+b
	}
	for i, m := range r.mounts {
		require.NoError(t, m.Unmount())
		t.Logf("cut: unmounted %s at %s", m.Dir(), time.Since(began).Round(time.Millisecond))
		again, err := lazyfs.Mount(m.Dir(), m.Backing(), m.Options())
		require.NoError(t, err)
		r.mounts[i] = again
	}
	return files, bytes
}

// syncs is every mount's count of fsyncs and of those that wrote data.
func (r *powerRig) syncs() (syncs, flushed int64) {
	for _, m := range r.mounts {
		s := m.Stats()
		syncs, flushed = syncs+s.Syncs, flushed+s.Flushed
	}
	return syncs, flushed
}

// msgKey names a published event as the events stream stores it: its
// Nats-Msg-Id, or a digest of its body for the few raw ones without.
func msgKey(h nats.Header, data []byte) string {
	if id := h.Get(jetstream.MsgIDHeader); id != "" {
		return "id:" + id
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(data))
}

// eachStored calls fn with every message stored in the stream name, in
// order, read one by one by sequence; a request that fails (a cluster
// still electing leaders) is asked again for up to 30s.
func eachStored(ctx context.Context, js jetstream.JetStream, name string, fn func(*jetstream.RawStreamMsg)) error {
	var s jetstream.Stream
	var info *jetstream.StreamInfo
	err := retrying(func() (err error) {
		if s, err = js.Stream(ctx, name); err == nil {
			info, err = s.Info(ctx)
		}
		return err
	})
	if err != nil || info.State.Msgs == 0 {
		return err
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		var m *jetstream.RawStreamMsg
		err := retrying(func() (err error) {
			m, err = s.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s message %d: %w", name, seq, err)
		}
		if m != nil {
			fn(m)
		}
	}
	return nil
}

func retrying(f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// storedEvents counts the events stream's messages by msgKey.
func storedEvents(ctx context.Context, js jetstream.JetStream) (map[string]int, error) {
	out := map[string]int{}
	err := eachStored(ctx, js, "SEAMGUARD_EVENTS", func(m *jetstream.RawStreamMsg) { out[msgKey(m.Header, m.Data)]++ })
	return out, err
}

// storedVerdicts reads the verdict stream as verdictBodies does: the
// normalised body of each verdict by key, and how many messages carried
// each key.
func storedVerdicts(t *testing.T, ctx context.Context, js jetstream.JetStream) (map[string]string, map[string]int) {
	t.Helper()
	bodies, counts := map[string]string{}, map[string]int{}
	err := eachStored(ctx, js, "SEAMGUARD_VERDICTS", func(m *jetstream.RawStreamMsg) {
		key, body := normalise(t, m.Data)
		bodies[key] = body
		counts[key]++
	})
	require.NoError(t, err)
	return bodies, counts
}

// requestIDs are the ids of the compaction requests among msgs.
func requestIDs(msgs []*nats.Msg) map[string]bool {
	out := map[string]bool{}
	for _, m := range msgs {
		var a struct{ ID, Type string }
		switch {
		case m.Header.Get("ce-type") == events.TypeCompactionRequested:
			out[m.Header.Get("ce-id")] = true
		case json.Unmarshal(m.Data, &a) == nil && a.Type == events.TypeCompactionRequested:
			out[a.ID] = true
		}
	}
	return out
}

func powerCutRun(t *testing.T, bin string, plan powerPlan, topo, setting string) {
	cluster := strings.Contains(topo, "cluster")
	began := time.Now()
	r := newPowerRig(t, bin, cluster, setting)
	require.NoError(t, r.start())
	phase := func(what string) { t.Logf("%8s %s", time.Since(began).Round(time.Millisecond), what) }
	phase("started")
	nc, err := nats.Connect(r.url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	subscriber := startVerdictLog(t, js)

	subj := events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions}
	sessions := plan.Sessions
	if cluster {
		sessions = plan.Cluster
	}
	msgs, err := chaosFleet(sessions).Msgs(subj)
	require.NoError(t, err)
	split := int(float64(len(msgs)) * plan.Before)
	before, after := msgs[:split], msgs[split:]
	newRequests := requestIDs(after)

	// The agents publish; every event acknowledged is expected in the
	// events stream whatever happens next (once: an agent's retry under
	// the same Nats-Msg-Id is acknowledged as a duplicate).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err = publishPaced(ctx, js, before, 0)
	require.NoError(t, err)
	phase("published before the cut")
	acked := map[string]int{}
	for _, m := range before {
		k := msgKey(m.Header, m.Data)
		if strings.HasPrefix(k, "id:") {
			acked[k] = 1
		} else {
			acked[k]++
		}
	}
	// The power goes as soon as the last event is acknowledged and the
	// subscriber holds a spill handle, with the processor still deciding
	// some of the events.
	require.Eventually(t, func() bool {
		for _, v := range subscriber.all() {
			if v.Handle.Name != "" || v.Data.Spill != nil {
				return true
			}
		}
		return false
	}, time.Minute, 20*time.Millisecond, "no spill handle reached the subscriber")
	syncsBefore, flushedBefore := r.syncs()
	cutFiles, cutBytes := r.cut()
	received := subscriber.all()
	t.Logf("%s, %s: %d events acknowledged, %d verdicts received; cut after %s: %d files lost %d bytes of unsynced pages (%d fsyncs through the lazy mounts, %d of them writing data)",
		topo, setting, len(before), len(received), time.Since(began).Round(time.Millisecond), cutFiles, cutBytes, syncsBefore, flushedBefore)

	// The restart: recovered once every input stored is decided.
	restarted := time.Now()
	row := faultRow{Fault: "power cut, " + topo, Setting: setting}
	for _, n := range acked {
		row.Acked += n
	}
	if err := r.start(); err != nil {
		row.Note = "did not restart: " + err.Error()
		row.Lost = row.Acked
		reportFault(t, row)
		if setting == "durable" {
			t.Fatalf("after the power cut: %v", err)
		}
		return
	}
	require.Eventually(t, func() bool { return quiet(ctx, js) }, 2*time.Minute, 50*time.Millisecond,
		"the processor did not decide every input after the restart")
	row.Recovery = time.Since(restarted)
	phase("restarted, every input stored decided")

	// The books. Events: every acknowledged one is stored.
	stored, err := storedEvents(ctx, js)
	require.NoError(t, err)
	var lostEvents []string
	for k, n := range acked {
		if d := n - stored[k]; d > 0 {
			row.Lost += d
			lostEvents = append(lostEvents, k)
		}
	}
	// Verdicts: every one received is stored, as received, once.
	got, counts := storedVerdicts(t, ctx, js)
	var lostVerdicts []string
	handles := map[string]events.SpillHandle{}
	for _, v := range received {
		key, body := normalise(t, v.Raw)
		switch g, ok := got[key]; {
		case !ok:
			row.VerdictsLost++
			lostVerdicts = append(lostVerdicts, key)
		case g != body:
			row.Different++
		}
		if v.Handle.Name != "" {
			handles[v.Handle.Name] = v.Handle
		}
		if v.Data.Spill != nil {
			handles[v.Data.Spill.Name] = *v.Data.Spill
		}
	}
	// Spills: every handle received reads back with its digest.
	store := &spill.Store{JS: js, Stream: "SEAMGUARD_EVENTS", Subjects: subj, Bucket: spillBucket}
	for name, h := range handles {
		digest, size, err := readSpill(ctx, store, name)
		if err != nil || digest != h.Digest || size != h.Size {
			row.SpillsUnreadable++
		}
	}
	phase("books of the cut kept")

	// New requests after the restart: the rest of the fleet.
	_, err = publishPaced(ctx, js, after, 0)
	require.NoError(t, err)
	if !assert.Eventually(t, func() bool { return quiet(ctx, js) }, 30*time.Second, 50*time.Millisecond,
		"the processor did not decide the inputs published after the restart") {
		t.Fatalf("consumers: %s", consumerStates(ctx, js))
	}
	phase("the rest of the fleet decided")
	got, counts = storedVerdicts(t, ctx, js)
	for _, n := range counts {
		if n > 1 {
			row.Duplicated++
		}
	}
	// The stored snapshots against a rebuild from the events stream, and
	// every verdict (the new requests' among them) against the derivation.
	proc, err := processor.New(ctx, js, processor.Config{Source: "urn:seamguard:test"})
	require.NoError(t, err)
	rb, err := proc.Rebuild(ctx, false)
	require.NoError(t, err)
	rep, err := inspect.Source{JS: js, Config: processor.Config{Prefix: "seamguard"}}.Replay(ctx,
		inspect.ReplayOptions{Config: ledger.Config{Policy: ledger.PolicySpill}})
	require.NoError(t, err)
	phase("rebuilt and replayed")
	decided := map[string]int{}
	for _, body := range got {
		var v struct{ Type, CausationID string }
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		switch v.Type {
		case events.TypeCompactionAllowed, events.TypeCompactionRefused, events.TypeSessionHalted, events.TypeEventRejected:
			if newRequests[v.CausationID] {
				decided[v.CausationID]++
			}
		}
	}
	undecided := 0
	for id := range newRequests {
		if decided[id] != 1 {
			undecided++
		}
	}
	var kinds []string
	for _, d := range rep.Differences {
		kinds = append(kinds, d.Kind)
	}
	sort.Strings(kinds)
	if r.serveRestarts > 0 {
		row.Note = fmt.Sprintf("serve started again %d times after the restart, not ready in 20s; ", r.serveRestarts)
	}
	row.Note += fmt.Sprintf("%d verdicts and %d spill handles received before the cut; %d/%d new requests decided; replay: %d differences %s; snapshots differing from a rebuild: %d; fsyncs through the mounts before the cut: %d",
		len(received), len(handles), len(newRequests)-undecided, len(newRequests), len(rep.Differences), compactKinds(kinds), len(rb.Differ), syncsBefore)
	reportFault(t, row)

	switch setting {
	case "lazy":
		assert.Positive(t, row.Lost+row.VerdictsLost,
			"the lazy run lost no acknowledged event and no received verdict: this test cannot tell a server that syncs before acknowledging from one that does not, so it proves nothing about the durable run")
	case "durable":
		sort.Strings(lostEvents)
		sort.Strings(lostVerdicts)
		assert.Zero(t, row.Lost, "acknowledged events lost: %v", first(lostEvents, 5))
		assert.Zero(t, row.VerdictsLost, "received verdicts lost: %v", first(lostVerdicts, 5))
		assert.Zero(t, row.Different, "received verdicts stored otherwise")
		assert.Zero(t, row.Duplicated, "verdicts stored twice")
		assert.Zero(t, row.SpillsUnreadable, "spill handles that do not read back with their digest")
		assert.Empty(t, rb.Differ, "stored snapshots that differ from a rebuild from the events stream")
		assert.Empty(t, rep.Differences, "verdicts that differ from the derivation from the events stream")
		assert.Zero(t, undecided, "new requests not decided after the restart")
		assert.NotEmpty(t, handles, "the fleet spills before the cut")
		assert.Positive(t, syncsBefore, "the durable server fsyncs through the lazy mounts")
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// compactKinds says "(3 missing, 1 state)" for a sorted list of kinds.
func compactKinds(kinds []string) string {
	if len(kinds) == 0 {
		return ""
	}
	var parts []string
	for i := 0; i < len(kinds); {
		j := i
		for j < len(kinds) && kinds[j] == kinds[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d %s", j-i, kinds[i]))
		i = j
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// consumerStates describes the events stream's consumers, for a failure.
func consumerStates(ctx context.Context, js jetstream.JetStream) string {
	s, err := js.Stream(ctx, "SEAMGUARD_EVENTS")
	if err != nil {
		return err.Error()
	}
	var out []string
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		out = append(out, fmt.Sprintf("%s: pending %d, ack pending %d, redelivered %d, delivered %d/%d, ack floor %d/%d",
			ci.Name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.Delivered.Consumer, ci.Delivered.Stream, ci.AckFloor.Consumer, ci.AckFloor.Stream))
	}
	if err := lister.Err(); err != nil {
		out = append(out, err.Error())
	}
	return strings.Join(out, "; ")
}
