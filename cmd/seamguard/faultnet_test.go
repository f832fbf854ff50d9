package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/internal/workload"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

var faultsLogs = flag.String("faults-logs", "", "keep the logs of TestFaultPartition's servers and serve instances in this directory")

// faultNetPlan sizes TestFaultPartition.
type faultNetPlan struct {
	Sessions int
	Publish  time.Duration // publishing the fleet is spread over at least this
	Lead     time.Duration // from the first publish to the fault
	Hold     time.Duration // how long a node stays cut off, or a nats-server stopped
	Pause    time.Duration // how long a serve instance stays stopped (more than the lease TTL)
	// Parallel is how many faults run at once, each on its own cluster
	// and network: two in the short size, to fit CI's time (their recovery
	// times then include the other's load); the full size runs one at a
	// time.
	Parallel int
}

var faultNetPlans = map[string]faultNetPlan{
	"short": {Sessions: 6, Publish: 5 * time.Second, Lead: 2 * time.Second, Hold: 7 * time.Second, Pause: 6 * time.Second, Parallel: 2},
	"full":  {Sessions: 60, Publish: 40 * time.Second, Lead: 8 * time.Second, Hold: 25 * time.Second, Pause: 20 * time.Second, Parallel: 1},
}

// The serve instances' timing: a partition whose holder stops renewing is
// free after netLeaseTTL, an input delivered and not acknowledged comes
// again after netAckWait.
const (
	netLeaseTTL  = 3 * time.Second
	netAckWait   = 2 * time.Second
	netNodes     = 3
	eventsStream = "SEAMGUARD_EVENTS"
)

// netFault is one fault of TestFaultPartition: inject breaks something,
// waits, mends it, and returns what it did in words.
type netFault struct {
	name   string
	row    string
	inject func(r *faultRun) string
}

// TestFaultPartition runs three nats-servers in three network namespaces
// (a JetStream cluster, R3, sync_interval: always) and a `seamguard serve`
// in each, publishes a fleet of sessions (healthy chains, stories that
// spill, gaps that halt, broken events, agent retries), and meanwhile
// injects one fault per subtest, each on a fresh cluster:
//
//   - leader: the events stream's leader node is cut off the network (its
//     serve with it);
//   - holder: the node of the serve instance holding the most partitions is
//     cut off;
//   - nats-stop: the events stream leader's nats-server is stopped
//     (SIGSTOP) and continued;
//   - zombie: the serve instance holding the most partitions is stopped
//     while it has inputs delivered and unacknowledged, for longer than
//     its lease TTL, and continued: it wakes believing it owns them.
//
// After the fault heals, the books must balance against an undisturbed
// run of the same events: every event acknowledged to the agent is in the
// events stream once, every compaction request decided exactly once,
// every verdict equal to the reference's and stored once, every spill
// readable with its digest, every session's stored snapshot equal to a
// rebuild from the events stream. Recovery is the time from the heal to
// every input decided (consumers quiet for good).
//
// The test process reaches the namespaced network through sockets it
// makes inside a client namespace (netnsDialer); the servers are this
// test binary run again in the node namespaces (TestMain), and serve is
// the built binary, both under `ip netns exec`. It needs root and ip.
func TestFaultPartition(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds the binary and runs a cluster in network namespaces")
	}
	needRoot(t, false, "ip")
	plan, ok := faultNetPlans[*faultsSize]
	require.True(t, ok, "-faults is %q; use short or full", *faultsSize)
	t.Cleanup(removeNetnsDir)
	began := time.Now()
	bin := buildBinary(t)
	w := chaosFleet(plan.Sessions)
	requests := map[string]bool{}
	for _, it := range w.Items {
		var a struct{ ID, Type string }
		if it.Raw == nil && json.Unmarshal(it.Line, &a) == nil && a.Type == events.TypeCompactionRequested {
			requests[a.ID] = true
		}
	}
	ref := netReference(t, bin, w)
	t.Logf("reference: %d events, %d requests, %d verdicts (%s)", len(w.Items), len(requests), len(ref), time.Since(began).Round(time.Millisecond))

	faults := []netFault{
		{name: "leader", row: "partition: events stream leader cut off", inject: injectLeaderCut},
		{name: "holder", row: "partition: partition holder's node cut off", inject: injectHolderCut},
		{name: "nats-stop", row: "SIGSTOP of the events stream leader's nats-server", inject: injectServerStop},
		{name: "zombie", row: "SIGSTOP of a serve holding partitions > lease TTL", inject: injectZombie},
	}
	slots := make(chan struct{}, max(plan.Parallel, 1))
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			if plan.Parallel > 1 {
				t.Parallel()
			}
			slots <- struct{}{}
			defer func() { <-slots }()
			runNetFault(t, plan, bin, w, ref, requests, f)
		})
	}
}

// netReference runs the fleet through one serve on one embedded server,
// undisturbed, and returns the verdicts (normalised bodies by id).
func netReference(t *testing.T, bin string, w *workload.Workload) map[string]string {
	t.Helper()
	msgs, err := w.Msgs(events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions})
	require.NoError(t, err)
	return undisturbed(t, bin, msgs, 3*time.Minute)
}

// faultRun is one subtest's cluster and serve instances.
type faultRun struct {
	t       *testing.T
	plan    faultNetPlan
	lab     *netLab
	servers []*netServer
	serves  []*netServe
	js      jetstream.JetStream
	// signingKey is the key file every serve signs with (they run on one
	// host, and one data directory takes one serve).
	signingKey string
}

// netServer is a nats-server in a node namespace: this test binary run
// again as a child server (see TestMain).
type netServer struct {
	name string // its server_name: n1, n2, ...
	url  string
	proc *os.Process
	log  string
}

// netServe is a `seamguard serve` in a node namespace.
type netServe struct {
	node   int
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan struct{}
	err    error // its exit, once exited is closed
}

func (s *netServe) pid() int { return s.cmd.Process.Pid }

func (s *netServe) signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

// term continues s if it was stopped, sends SIGTERM and waits up to limit
// for it to exit; then it is killed.
func (s *netServe) term(limit time.Duration) error {
	select {
	case <-s.exited:
		return s.err
	default:
	}
	_ = s.signal(syscall.SIGCONT)
	if err := s.signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-s.exited:
		return s.err
	case <-time.After(limit):
		_ = s.signal(syscall.SIGKILL)
		<-s.exited
		return fmt.Errorf("serve on n%d did not exit within %s of SIGTERM; killed", s.node+1, limit)
	}
}

// startServers starts a nats-server in every node namespace, clustered,
// with JetStream syncing every write before acknowledging it.
func (r *faultRun) startServers() {
	t, lab := r.t, r.lab
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	var routes []string
	for _, a := range lab.addrs {
		routes = append(routes, fmt.Sprintf("%q", "nats-route://"+a+":6222"))
	}
	r.servers = make([]*netServer, len(lab.nodes))
	errs := make([]error, len(lab.nodes))
	var wg sync.WaitGroup
	for i, addr := range lab.addrs {
		name := fmt.Sprintf("n%d", i+1)
		s := &netServer{name: name, log: filepath.Join(lab.dir, name+".log")}
		r.servers[i] = s
		conf := filepath.Join(lab.dir, name+".conf")
		text := fmt.Sprintf(`server_name: %s
listen: "%s:4222"
http: "%s:8222"
logfile: %q
logtime: true
cluster {
  name: "sgfault"
  listen: "%s:6222"
  routes: [%s]
}
jetstream {
  store_dir: %q
  sync_interval: always
}
`, name, addr, addr, s.log, addr, strings.Join(routes, ", "), filepath.Join(lab.dir, name))
		require.NoError(t, os.WriteFile(conf, []byte(text), 0o644))
		wg.Add(1)
		go func() {
			defer wg.Done()
			url, pid, stop, err := embedded.StartChild(lab.inNode(i, exe), "", embedded.ChildConfigEnv+"="+conf)
			if err != nil {
				errs[i] = fmt.Errorf("server %s: %w", name, err)
				return
			}
			// FindProcess holds the child by a pidfd: signals never reach
			// another process, even after this one is gone.
			s.proc, _ = os.FindProcess(pid)
			s.url = url
			lab.track(s.proc, stop)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// urls lists every server's client URL, server first first.
func (r *faultRun) urls(first int) []string {
	var out []string
	for k := range r.servers {
		out = append(out, r.servers[(first+k)%len(r.servers)].url)
	}
	return out
}

// connect connects the test process to the cluster through the client
// namespace, reconnecting forever and noticing a dead server within
// about two seconds.
func (r *faultRun) connect(urls []string) (*nats.Conn, error) {
	return nats.Connect(strings.Join(urls, ","),
		nats.SetCustomDialer(netnsDialer{ns: r.lab.client, timeout: 2 * time.Second}),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.PingInterval(500*time.Millisecond), nats.MaxPingsOutstanding(3), nats.Timeout(2*time.Second))
}

// waitCluster waits until JetStream answers through every server.
func (r *faultRun) waitCluster() {
	t := r.t
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, s := range r.servers {
		for {
			if netReady(r, s.url) {
				break
			}
			require.True(t, time.Now().Before(deadline), "JetStream not ready through %s (%s)", s.name, s.url)
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func netReady(r *faultRun, url string) bool {
	nc, err := nats.Connect(url, nats.SetCustomDialer(netnsDialer{ns: r.lab.client, timeout: 2 * time.Second}), nats.NoReconnect())
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}

// startServe starts serve in node i's namespace, its own server first in
// the list of URLs.
func (r *faultRun) startServe(bin string, i int) *netServe {
	r.t.Helper()
	var monitors []string
	for _, a := range r.lab.addrs {
		monitors = append(monitors, "http://"+a+":8222")
	}
	args := []string{bin, "serve", "--nats-url", strings.Join(r.urls(i), ","), "--nats-monitor-url", strings.Join(monitors, ","),
		"--source", "urn:seamguard:test", "--shards", "4", "--ack-wait", netAckWait.String(), "--lease-ttl", netLeaseTTL.String(),
		"--retry-for", "10s", "--log-level", "info", "--signing-key-file", r.signingKey}
	argv := r.lab.inNode(i, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	s := &netServe{node: i, cmd: cmd, logs: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	// Should this process die, the kernel kills serve too (ip execs it,
	// and the setting survives the exec).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(r.t, cmd.Start())
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	r.lab.track(cmd.Process, func() { <-s.exited })
	r.serves = append(r.serves, s)
	return s
}

// serveOf returns the serve instance whose lease value (instance id
// "host-pid-random") is id, or nil.
func (r *faultRun) serveOf(id string) *netServe {
	f := strings.Split(id, "-")
	if len(f) < 3 {
		return nil
	}
	pid, err := strconv.Atoi(f[len(f)-2])
	if err != nil {
		return nil
	}
	for _, s := range r.serves {
		if s.pid() == pid {
			return s
		}
	}
	return nil
}

// holders reads the leases bucket: the node of each partition's holder
// (-1: nobody, or not one of ours).
func (r *faultRun) holders(ctx context.Context) ([]int, error) {
	kv, err := r.js.KeyValue(ctx, "seamguard-leases")
	if err != nil {
		return nil, err
	}
	out := make([]int, processor.DefaultPartitions)
	for p := range out {
		out[p] = -1
		e, err := kv.Get(ctx, "p"+strconv.Itoa(p))
		if err != nil {
			if err == jetstream.ErrKeyNotFound {
				continue
			}
			return nil, err
		}
		if s := r.serveOf(string(e.Value())); s != nil {
			out[p] = s.node
		}
	}
	return out, nil
}

func (r *faultRun) holdersNow() []int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	h, err := r.holders(ctx)
	if err != nil {
		return nil
	}
	return h
}

// partitionsOf lists the partitions node holds, as "p0,p2".
func partitionsOf(holders []int, node int) string {
	var ps []string
	for p, n := range holders {
		if n == node {
			ps = append(ps, "p"+strconv.Itoa(p))
		}
	}
	if ps == nil {
		return "none"
	}
	return strings.Join(ps, ",")
}

// busiest is the node whose serve holds the most partitions, a node other
// than avoid where that is a tie.
func busiest(holders []int, avoid int) int {
	count := make([]int, netNodes)
	for _, n := range holders {
		if n >= 0 {
			count[n]++
		}
	}
	best := -1
	for n := range count {
		if best < 0 || count[n] > count[best] || count[n] == count[best] && best == avoid {
			best = n
		}
	}
	return best
}

// waitLeases waits until every partition is held, no instance holds more
// than its share, and the holders have not changed for a second and a half.
func (r *faultRun) waitLeases() []int {
	r.t.Helper()
	share := (processor.DefaultPartitions + netNodes - 1) / netNodes
	var last []int
	var since time.Time
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		h := r.holdersNow()
		fair := h != nil && !slices.Contains(h, -1)
		for n := range netNodes {
			if fair && strings.Count(partitionsOf(h, n), "p") > share {
				fair = false
			}
		}
		switch {
		case !fair:
			last = nil
		case !slices.Equal(h, last):
			last, since = h, time.Now()
		case time.Since(since) > 1500*time.Millisecond:
			return h
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.FailNow(r.t, "the partitions' leases did not settle", "last seen: %v", last)
	return nil
}

// leader is the node of the events stream's leader, or -1.
func (r *faultRun) leader() int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, eventsStream)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return -1
	}
	for i, srv := range r.servers {
		if srv.name == info.Cluster.Leader {
			return i
		}
	}
	return -1
}

func nodeName(i int) string {
	if i < 0 {
		return "none"
	}
	return fmt.Sprintf("n%d", i+1)
}

// ackPending sums the inputs delivered and not yet acknowledged on the
// consumers of the partitions node holds.
func (r *faultRun) ackPending(holders []int, node int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n := 0
	for p, h := range holders {
		if h != node {
			continue
		}
		c, err := r.js.Consumer(ctx, eventsStream, processor.Config{}.ConsumerName(p))
		if err != nil {
			continue
		}
		if info, err := c.Info(ctx); err == nil {
			n += info.NumAckPending
		}
	}
	return n
}

func injectLeaderCut(r *faultRun) string {
	ldr := r.leader()
	require.GreaterOrEqual(r.t, ldr, 0, "no events stream leader")
	held := r.holdersNow()
	require.NoError(r.t, r.lab.isolate(ldr))
	time.Sleep(r.plan.Hold)
	during, heldDuring := r.leader(), r.holdersNow()
	require.NoError(r.t, r.lab.heal(ldr))
	return fmt.Sprintf("%s (leader; its serve held %s) cut off %s; leader then %s, its partitions then held by %s",
		nodeName(ldr), partitionsOf(held, ldr), r.plan.Hold, nodeName(during), describeHolders(heldDuring))
}

func injectHolderCut(r *faultRun) string {
	held := r.holdersNow()
	ldr := r.leader()
	n := busiest(held, ldr)
	require.NoError(r.t, r.lab.isolate(n))
	time.Sleep(r.plan.Hold)
	heldDuring := r.holdersNow()
	require.NoError(r.t, r.lab.heal(n))
	return fmt.Sprintf("%s (serve held %s; leader %s) cut off %s; partitions then %s",
		nodeName(n), partitionsOf(held, n), nodeName(ldr), r.plan.Hold, describeHolders(heldDuring))
}

func injectServerStop(r *faultRun) string {
	ldr := r.leader()
	require.GreaterOrEqual(r.t, ldr, 0, "no events stream leader")
	srv := r.servers[ldr]
	require.NoError(r.t, srv.proc.Signal(syscall.SIGSTOP))
	time.Sleep(r.plan.Hold)
	during, heldDuring := r.leader(), r.holdersNow()
	require.NoError(r.t, srv.proc.Signal(syscall.SIGCONT))
	return fmt.Sprintf("nats-server %s (leader) stopped %s; leader then %s, partitions then %s",
		srv.name, r.plan.Hold, nodeName(during), describeHolders(heldDuring))
}

// injectZombie stops the serve holding the most partitions at a moment it
// has inputs in hand (delivered, not acknowledged): it tries up to 20
// times, continuing it at once (200ms, far less than the lease TTL) when
// it had none.
func injectZombie(r *faultRun) string {
	held := r.holdersNow()
	n := busiest(held, -1)
	s := r.serves[n]
	inHand := 0
	tries := 0
	for tries < 20 {
		tries++
		require.NoError(r.t, s.signal(syscall.SIGSTOP))
		if inHand = r.ackPending(held, n); inHand > 0 {
			break
		}
		require.NoError(r.t, s.signal(syscall.SIGCONT))
		time.Sleep(200 * time.Millisecond)
		held = r.holdersNow()
	}
	if inHand == 0 {
		require.NoError(r.t, s.signal(syscall.SIGSTOP)) // stopped with nothing in hand, then
	}
	time.Sleep(r.plan.Pause)
	heldDuring := r.holdersNow()
	require.NoError(r.t, s.signal(syscall.SIGCONT))
	return fmt.Sprintf("serve on %s (held %s) stopped %s with %d inputs in hand (try %d); partitions then %s",
		nodeName(n), partitionsOf(held, n), r.plan.Pause, inHand, tries, describeHolders(heldDuring))
}

func describeHolders(h []int) string {
	if h == nil {
		return "unreadable"
	}
	var parts []string
	for p, n := range h {
		parts = append(parts, fmt.Sprintf("p%d:%s", p, nodeName(n)))
	}
	return strings.Join(parts, " ")
}

// runNetFault plays the fleet on a fresh cluster through one fault and
// checks the books.
func runNetFault(t *testing.T, plan faultNetPlan, bin string, w *workload.Workload, ref map[string]string, requests map[string]bool, f netFault) {
	began := time.Now()
	r := &faultRun{t: t, plan: plan, lab: newNetLab(t, netNodes), signingKey: sharedSigningKey(t)}
	r.startServers()
	r.waitCluster()
	nc, err := r.connect(r.urls(0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	r.js, err = jetstream.New(nc)
	require.NoError(t, err)
	t.Cleanup(func() { r.keepLogs(t) })

	// The first instance provisions the streams and buckets; then the
	// others join and the partitions are shared out.
	r.startServe(bin, 0)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := r.js.KeyValue(ctx, "seamguard-leases")
		return err == nil
	}, time.Minute, 200*time.Millisecond, "serve did not provision; its log:\n%s", r.serves[0].logs.String())
	for i := 1; i < netNodes; i++ {
		r.startServe(bin, i)
	}
	held := r.waitLeases()
	t.Logf("cluster up, partitions %s (%s)", describeHolders(held), time.Since(began).Round(time.Millisecond))

	msgs, err := w.Msgs(events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pubDone := make(chan error, 1)
	var pubEnd time.Time
	pubStart := time.Now()
	go func() {
		_, err := publishPaced(ctx, r.js, msgs, plan.Publish)
		pubEnd = time.Now()
		pubDone <- err
	}()
	time.Sleep(time.Until(pubStart.Add(plan.Lead)))
	t.Logf("fault at %s", time.Now().UTC().Format("15:04:05.000"))
	note := f.inject(r)
	healed := time.Now()
	t.Logf("healed at %s: %s", healed.UTC().Format("15:04:05.000"), note)

	// Recovery: from the heal to the start of a quiet stretch (every
	// input decided and acknowledged, the reference's count of verdicts
	// stored) that lasts a lease TTL and an ack wait, so that a zombie's
	// late work or a redelivery would have broken it.
	require.NoError(t, <-pubDone, "publishing")
	want := uint64(len(ref))
	settle := netLeaseTTL + netAckWait + 500*time.Millisecond
	var quietSince, lastWhy time.Time
	deadline := time.Now().Add(3 * time.Minute)
	for {
		qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
		why := r.busy(qctx, want)
		qcancel()
		ok := why == ""
		if !ok && time.Since(lastWhy) > 10*time.Second {
			t.Logf("%s after the heal, not yet: %s", time.Since(healed).Round(time.Second), why)
			lastWhy = time.Now()
		}
		switch {
		case !ok:
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		}
		if !quietSince.IsZero() && time.Since(quietSince) >= settle {
			break
		}
		if time.Now().After(deadline) {
			r.dumpLogs(t, nil)
			require.FailNow(t, "the cluster did not decide every input within 3 minutes of the heal",
				"verdicts %d of %d", streamMsgs(ctx, r.js, "SEAMGUARD_VERDICTS"), want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	recovery := quietSince.Sub(healed)
	if pubEnd.After(healed) {
		note += fmt.Sprintf("; publishing ended %s after the heal", pubEnd.Sub(healed).Round(10*time.Millisecond))
	}

	// Every instance drains and exits 0.
	var stopErrs []string
	for _, s := range r.serves {
		if err := s.term(40 * time.Second); err != nil {
			stopErrs = append(stopErrs, fmt.Sprintf("serve on n%d: %v", s.node+1, err))
		}
	}

	row, problems, sessions := r.books(ctx, msgs, ref, requests)
	row.Fault, row.Setting, row.Recovery, row.Note = f.row, "durable", recovery, row.Note+note
	if f.name == "zombie" {
		n := busiest(held, -1)
		if strings.Contains(r.serves[n].logs.String(), "lost a partition's lease") {
			row.Note += "; the zombie logged a lost lease"
		}
	}
	reportFault(t, row)
	problems = append(problems, stopErrs...)
	if len(problems) > 0 {
		r.dumpLogs(t, sessions)
		shown := problems
		if len(shown) > 12 {
			shown = append(shown[:12:12], fmt.Sprintf("... and %d more", len(problems)-12))
		}
		t.Errorf("the books do not balance after %q:\n%s", f.row, strings.Join(shown, "\n"))
	}
	t.Logf("%s: %s in all", f.name, time.Since(began).Round(time.Millisecond))
}

// books checks the streams against what was published and the reference:
// the row's counts, a description of each problem, and the sessions the
// problems concern.
func (r *faultRun) books(ctx context.Context, msgs []*nats.Msg, ref map[string]string, requests map[string]bool) (faultRow, []string, map[string]bool) {
	t := r.t
	t.Helper()
	row := faultRow{Acked: len(msgs)}
	var problems []string
	sessions := map[string]bool{}

	// Events: every id acknowledged is stored, once.
	published := map[string]bool{}
	for _, m := range msgs {
		published[m.Header.Get(jetstream.MsgIDHeader)] = true
	}
	stored := r.eventIDs(ctx)
	for id := range published {
		if stored[id] == 0 {
			row.Lost++
			problems = append(problems, fmt.Sprintf("event %s acknowledged and not in the events stream", id))
		}
	}
	for id, n := range stored {
		if n > 1 {
			problems = append(problems, fmt.Sprintf("event %s stored %d times", id, n))
		}
	}

	// Verdicts against the reference.
	got, counts := r.verdictBodies(ctx)
	session := func(body string) string {
		var v struct{ Subject string }
		_ = json.Unmarshal([]byte(body), &v)
		return v.Subject
	}
	for id, n := range counts {
		if n > 1 {
			row.Duplicated++
			sessions[session(got[id])] = true
			problems = append(problems, fmt.Sprintf("verdict %s stored %d times: %s", id, n, got[id]))
		}
	}
	for id, body := range ref {
		switch g, ok := got[id]; {
		case !ok:
			row.VerdictsLost++
			sessions[session(body)] = true
			problems = append(problems, fmt.Sprintf("verdict %s lost (session %s):\n  reference: %s", id, session(body), body))
		case g != body:
			row.Different++
			sessions[session(body)] = true
			problems = append(problems, fmt.Sprintf("verdict %s differs (session %s):\n  reference: %s\n  this run:  %s", id, session(body), body, g))
		}
	}
	extra := 0
	for id, body := range got {
		if _, ok := ref[id]; !ok {
			extra++
			sessions[session(body)] = true
			problems = append(problems, fmt.Sprintf("verdict %s not in the reference (session %s): %s", id, session(body), body))
		}
	}
	if extra > 0 {
		row.Note = fmt.Sprintf("%d verdicts not in the reference; ", extra)
	}

	// Exactly one decision per request; every spill reads back.
	decisions := map[string][]string{}
	rereads := 0
	subj := events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions}
	store := &spill.Store{JS: r.js, Stream: eventsStream, Subjects: subj, Bucket: "seamguard-spills"}
	for id, body := range got {
		var v struct {
			Type        string          `json:"type"`
			CausationID string          `json:"causationid"`
			Data        json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &v))
		switch v.Type {
		case events.TypeCompactionAllowed, events.TypeCompactionRefused, events.TypeSessionHalted, events.TypeEventRejected:
			if requests[v.CausationID] {
				decisions[v.CausationID] = append(decisions[v.CausationID], id+" "+body)
			}
		case events.TypeTranscriptSpilled:
			var h events.SpillHandle
			require.NoError(t, json.Unmarshal(v.Data, &h), "transcript.spilled: %s", body)
			switch why, retried := r.checkSpill(ctx, store, h); {
			case why != "":
				row.SpillsUnreadable++
				sessions[session(body)] = true
				problems = append(problems, why)
			case retried:
				rereads++
			}
		}
	}
	for id := range requests {
		switch d := decisions[id]; {
		case len(d) > 1:
			row.Duplicated++
			problems = append(problems, fmt.Sprintf("request %s decided %d times:\n  %s", id, len(d), strings.Join(d, "\n  ")))
			for _, x := range d {
				_, body, _ := strings.Cut(x, " ")
				sessions[session(body)] = true
			}
		case len(d) == 0:
			problems = append(problems, fmt.Sprintf("request %s never decided", id))
		}
	}

	if rereads > 0 {
		row.Note += fmt.Sprintf("%d spill reads failed once and read back on the next try; ", rereads)
	}

	// Stored snapshots against a rebuild from the events stream.
	proc, err := processor.New(ctx, r.js, processor.Config{Source: "urn:seamguard:test"})
	require.NoError(t, err)
	rb, err := proc.Rebuild(ctx, false)
	require.NoError(t, err)
	for _, s := range rb.Differ {
		sessions[s] = true
		problems = append(problems, fmt.Sprintf("session %s: stored snapshot differs from a rebuild from the events stream", s))
	}
	sort.Strings(problems)
	delete(sessions, "")
	return row, problems, sessions
}

// busy says what is not yet done, or "" when every input is decided: no
// events consumer (each partition's and the one of events naming no
// session) has messages pending or awaiting an ack, and the verdict
// stream holds want verdicts. It asks for each consumer by name (a
// listing right after a partition may come back incomplete).
func (r *faultRun) busy(ctx context.Context, want uint64) string {
	var why []string
	cfg := processor.Config{}
	for p := -1; p < processor.DefaultPartitions; p++ {
		name := cfg.ConsumerName(p)
		c, err := r.js.Consumer(ctx, eventsStream, name)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		info, err := c.Info(ctx)
		switch {
		case err != nil:
			why = append(why, fmt.Sprintf("%s: %v", name, err))
		case info.NumPending > 0 || info.NumAckPending > 0:
			why = append(why, fmt.Sprintf("%s: %d pending, %d awaiting an ack", name, info.NumPending, info.NumAckPending))
		}
	}
	if n := streamMsgs(ctx, r.js, "SEAMGUARD_VERDICTS"); n < want {
		why = append(why, fmt.Sprintf("%d of %d verdicts", n, want))
	}
	return strings.Join(why, "; ")
}

// checkSpill reads the spill h names back, three times at most (a read
// right after a fault may fail once: "nothing arrived"), and says what is
// wrong, or "" when it reads back with its digest and size; retried says
// it did only after a failed try. What it says names what the bucket
// holds: the info and its chunks.
func (r *faultRun) checkSpill(ctx context.Context, store *spill.Store, h events.SpillHandle) (why string, retried bool) {
	for try := range 3 {
		if try > 0 {
			time.Sleep(2 * time.Second)
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		digest, size, err := readSpill(rctx, store, h.Name)
		cancel()
		if err == nil && digest == h.Digest && size == h.Size {
			if try > 0 {
				r.t.Logf("spill %s read back at try %d, after: %s", h.Name, try+1, why)
			}
			return "", try > 0
		}
		why = fmt.Sprintf("read %s, %d bytes, err %v", digest, size, err)
	}
	return r.spillContents(ctx, h, why), false
}

// spillContents describes what the bucket holds under h's name.
func (r *faultRun) spillContents(ctx context.Context, h events.SpillHandle, why string) string {
	out := fmt.Sprintf("spill %s (handle: %s, %d bytes): %s", h.Name, h.Digest, h.Size, why)
	obs, err := r.js.ObjectStore(ctx, h.Bucket)
	if err != nil {
		return out + fmt.Sprintf("; the bucket: %v", err)
	}
	info, err := obs.GetInfo(ctx, h.Name)
	if err != nil {
		return out + fmt.Sprintf("; its info: %v", err)
	}
	out += fmt.Sprintf("; its info: nuid %s, %d chunks, %d bytes, digest %s, modified %s", info.NUID, info.Chunks, info.Size, info.Digest, info.ModTime.Format(time.RFC3339Nano))
	str, err := r.js.Stream(ctx, "OBJ_"+h.Bucket)
	if err != nil {
		return out + fmt.Sprintf("; its stream: %v", err)
	}
	si, err := str.Info(ctx, jetstream.WithSubjectFilter("$O."+h.Bucket+".C.>"))
	if err != nil {
		return out + fmt.Sprintf("; its chunks: %v", err)
	}
	out += fmt.Sprintf("; chunk messages on its nuid: %d; stream: %d messages, first %d, last %d; chunk subjects:", si.State.Subjects["$O."+h.Bucket+".C."+info.NUID], si.State.Msgs, si.State.FirstSeq, si.State.LastSeq)
	for subj, n := range si.State.Subjects {
		out += fmt.Sprintf(" %s=%d", strings.TrimPrefix(subj, "$O."+h.Bucket+".C."), n)
	}
	return out
}

// eventIDs counts the events stream's messages by Nats-Msg-Id.
func (r *faultRun) eventIDs(ctx context.Context) map[string]int {
	out := map[string]int{}
	r.readStream(ctx, eventsStream, func(m *jetstream.RawStreamMsg) {
		out[m.Header.Get(jetstream.MsgIDHeader)]++
	})
	return out
}

// verdictBodies reads the verdict stream as verdictBodies does: the
// normalised body of each verdict by id, and how many messages carried
// each id.
func (r *faultRun) verdictBodies(ctx context.Context) (map[string]string, map[string]int) {
	bodies, counts := map[string]string{}, map[string]int{}
	r.readStream(ctx, "SEAMGUARD_VERDICTS", func(m *jetstream.RawStreamMsg) {
		id, body := normalise(r.t, m.Data)
		bodies[id] = body
		counts[id]++
	})
	return bodies, counts
}

// readStream calls fn with every message of the stream, in order. It
// reads them one by one from the stream's leader (an ordered consumer,
// made just after a fault, can ask a server that does not know it yet and
// get "no responders").
func (r *faultRun) readStream(ctx context.Context, name string, fn func(*jetstream.RawStreamMsg)) {
	t := r.t
	t.Helper()
	s, err := r.js.Stream(ctx, name)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	if info.State.Msgs == 0 {
		return
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		var m *jetstream.RawStreamMsg
		for try := 0; ; try++ {
			gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			m, err = s.GetMsg(gctx, seq)
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || try == 4 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err, "reading %s message %d", name, seq)
		fn(m)
	}
}

// dumpLogs logs, for each serve, its lines about partitions and leases and
// about the sessions named, and its last lines; and each server's last
// lines.
func (r *faultRun) dumpLogs(t *testing.T, sessions map[string]bool) {
	for _, s := range r.serves {
		lines := strings.Split(strings.TrimSpace(s.logs.String()), "\n")
		var keep []string
		for _, l := range lines {
			if strings.Contains(l, "partition") || strings.Contains(l, "lease") || strings.Contains(l, "level=ERROR") || mentions(l, sessions) {
				keep = append(keep, l)
			}
		}
		if len(keep) > 200 {
			keep = append(keep[:100:100], append([]string{"..."}, keep[len(keep)-100:]...)...)
		}
		t.Logf("serve on n%d (pid %d): %d log lines; about partitions, leases, errors and the sessions concerned:\n%s\nlast lines:\n%s",
			s.node+1, s.pid(), len(lines), strings.Join(keep, "\n"), strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
	for _, srv := range r.servers {
		b, _ := os.ReadFile(srv.log)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		t.Logf("nats-server %s, last lines:\n%s", srv.name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
}

func mentions(line string, sessions map[string]bool) bool {
	for s := range sessions {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// keepLogs copies every log to -faults-logs, if set.
func (r *faultRun) keepLogs(t *testing.T) {
	if *faultsLogs == "" {
		return
	}
	dir := filepath.Join(*faultsLogs, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("keeping the logs: %v", err)
		return
	}
	for _, s := range r.serves {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("serve-n%d.log", s.node+1)), []byte(s.logs.String()), 0o644)
	}
	for _, srv := range r.servers {
		if b, err := os.ReadFile(srv.log); err == nil {
			_ = os.WriteFile(filepath.Join(dir, srv.name+".log"), b, 0o644)
		}
	}
}
