package processor_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// clusterEnv connects to a cluster through server first, failing over to
// the others.
func clusterEnv(t *testing.T, c *embedded.Cluster, first int) *env {
	t.Helper()
	nc, err := nats.Connect(c.URLs(first), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return &env{Test: &embedded.Test{NC: nc, JS: js}, ctx: ctx}
}

// TestClusterScaleOutAndFailover runs three processor instances against a
// three-server JetStream cluster with every stream, bucket and object store
// replicated three times. Mid-run one instance is killed and one server is
// stopped and started again. Afterwards every verdict and every session
// state equals those of a single instance on a single server, no verdict is
// there twice, and every compare-and-swap conflict (a session fenced from a
// writer that had lost it) is counted.
func TestClusterScaleOutAndFailover(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("a three-server cluster run")
	}
	w := genWorkload(200)
	require.GreaterOrEqual(t, len(w.Items), 5000)
	cfg := baseConfig()
	cfg.Partitions = 8
	cfg.AckWait = 2 * time.Second
	cfg.LeaseTTL = 2 * time.Second

	// The reference: one instance on one server.
	ref := func() outcome {
		e := newEnv(t)
		r := e.start(t, cfg)
		e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
		e.waitIdle(t, cfg, 2*time.Minute)
		require.NoError(t, r.stop(t))
		return e.outcome(t, cfg)
	}()

	cl := embedded.StartCluster(t, 3)
	ccfg := cfg // Replicas 0: three on a cluster of three
	envs := []*env{clusterEnv(t, cl, 0), clusterEnv(t, cl, 1), clusterEnv(t, cl, 2)}
	res, err := processor.Provision(envs[0].ctx, envs[0].JS, ccfg)
	require.NoError(t, err)
	for _, s := range []jetstream.Stream{res.Events, res.Verdicts} {
		require.Equal(t, 3, s.CachedInfo().Config.Replicas, "replicated three times on a three-server cluster")
	}
	st, err := res.Sessions.Status(envs[0].ctx)
	require.NoError(t, err)
	require.Equal(t, 3, st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas)
	runs := []*running{envs[0].start(t, ccfg), envs[1].start(t, ccfg), envs[2].start(t, ccfg)}

	pub := clusterEnv(t, cl, 1)
	msgs := msgsOf(t, w, ccfg.Subjects())
	half := len(msgs) / 2
	pub.publishAll(t, msgs[:half])
	waitFor(t, time.Minute, "the instances to be busy", func() bool {
		return pub.streamInfo(t, ccfg.Names().Verdicts).State.Msgs >= uint64(len(ref.verdicts)/5)
	})
	// Kill the instance that decided most so far, holding partitions and
	// unacknowledged deliveries.
	victim := 0
	for i, r := range runs {
		if r.p.Stats().Handled > runs[victim].p.Stats().Handled {
			victim = i
		}
	}
	killedAt := runs[victim].p.Stats().Handled
	runs[victim].abort(t)
	t.Logf("killed instance %d after it decided %d inputs", victim, killedAt)

	// Stop a server other than the publisher's first one, publish the rest
	// meanwhile, and start it again.
	cl.Stop(2)
	pub.publishOrdered(t, msgs[half:])
	time.Sleep(time.Second)
	cl.Start(t, 2)
	cl.WaitReady(t)

	pub.waitIdle(t, ccfg, 3*time.Minute)
	var fenced, caught, reloaded, batches uint64
	for i, r := range runs {
		st := r.p.Stats()
		t.Logf("instance %d: %d decided, %d fenced, %d reloaded, %d caught up, %d writes in %d atomic batches (%d fell back)", i, st.Handled, st.Fenced, st.Reloaded, st.CaughtUp, st.BatchedWrites, st.AtomicBatches, st.BatchFallbacks)
		batches += st.AtomicBatches
		fenced += st.Fenced
		caught += st.CaughtUp
		reloaded += st.Reloaded
		if i != victim {
			require.NoError(t, r.stop(t))
		}
	}
	require.Positive(t, batches, "replicated streams took atomic batches")
	got := pub.outcome(t, ccfg)
	defer dumpSessions(t, pub, ccfg, ref, got)
	requireSameOutcome(t, ref, got)
	t.Logf("%d events over %d sessions, %d verdicts, each once and as decided by a single instance; CAS conflicts %d (each left the session to its owner, none lost a state), %d caught up, %d reloaded",
		len(msgs), w.Sessions, len(got.verdicts), fenced, caught, reloaded)
}

// TestFailoverTime kills the instance that owns a partition and measures how
// long until the other instance decides a new request of that partition:
// LeaseTTL plus the time to notice.
func TestFailoverTime(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.LeaseTTL = 2 * time.Second
	// The owner has a connection of its own, which dies with it.
	anc, err := nats.Connect(e.Server.ClientURL())
	require.NoError(t, err)
	ajs, err := jetstream.New(anc)
	require.NoError(t, err)
	ea := &env{Test: &embedded.Test{Server: e.Server, NC: anc, JS: ajs}, ctx: e.ctx}
	a := ea.start(t, cfg)
	open := func(id string) *nats.Msg {
		m := nats.NewMsg("seamguard.events.fo")
		m.Header.Set("Content-Type", "application/cloudevents+json")
		m.Data = fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.session.opened","subject":"fo","data":{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}}`, id)
		return m
	}
	e.publishAll(t, []*nats.Msg{open("o1")})
	e.waitIdle(t, cfg, 10*time.Second)
	require.Equal(t, uint64(1), a.p.Stats().Handled, "the first instance owns the partition")
	b := e.start(t, cfg)
	time.Sleep(300 * time.Millisecond) // b pulls, unpinned

	a.abort(t)
	anc.Close()
	killed := time.Now()
	req := nats.NewMsg("seamguard.events.fo")
	req.Header.Set("Content-Type", "application/cloudevents+json")
	req.Data = []byte(`{"specversion":"1.0","id":"r1","source":"urn:t","type":"io.seamguard.compaction.requested","subject":"fo","data":{"request_id":"r","summarizer_input":{"start":0,"end":0},"summary_range":{"start":0,"end":0},"tail_start":0}}`)
	e.publishAll(t, []*nats.Msg{req})
	waitFor(t, cfg.LeaseTTL+15*time.Second, "the verdict after failover", func() bool {
		return e.streamInfo(t, cfg.Names().Verdicts).State.Msgs >= 1
	})
	took := time.Since(killed)
	t.Logf("failover: the surviving instance decided the first new request %s after the owner was killed (LeaseTTL %s)", took.Round(10*time.Millisecond), cfg.LeaseTTL)
	require.Less(t, took, cfg.LeaseTTL+5*time.Second)
	// The survivor decided it: on its delivery, or ahead of it when the
	// server had handed the request to the dead owner's last pull (then
	// the survivor finds it pending on taking the partition over and
	// applies it from the stream; the redelivery is skipped).
	st := b.p.Stats()
	require.Equal(t, uint64(1), st.Handled+st.CaughtUp, "the survivor decided the request once: %+v", st)
	require.Equal(t, uint64(1), a.p.Stats().Handled, "the killed owner decided nothing more")
	require.NoError(t, b.stop(t))
}

// dumpSessions writes, when SEAMGUARD_TEST_DUMP names a file, every session
// whose verdicts differ from the reference's: its inputs in stream order
// and the verdicts of both runs, for a failure to be read later.
func dumpSessions(t *testing.T, e *env, cfg processor.Config, want, got outcome) {
	path := os.Getenv("SEAMGUARD_TEST_DUMP")
	if path == "" || !t.Failed() {
		return
	}
	bySession := func(vs map[string]string) map[string][]string {
		out := map[string][]string{}
		for _, body := range vs {
			v, err := events.DecodeVerdict([]byte(body))
			if err != nil {
				continue
			}
			out[v.Session] = append(out[v.Session], body)
		}
		return out
	}
	w, g := bySession(want.verdicts), bySession(got.verdicts)
	bad := map[string]bool{}
	for id, body := range want.verdicts {
		if got.verdicts[id] != body {
			v, _ := events.DecodeVerdict([]byte(body))
			bad[v.Session] = true
		}
	}
	for id, body := range got.verdicts {
		if _, ok := want.verdicts[id]; !ok {
			v, _ := events.DecodeVerdict([]byte(body))
			bad[v.Session] = true
		}
	}
	var b strings.Builder
	raw := e.readStream(t, cfg.Names().Events)
	for s := range bad {
		fmt.Fprintf(&b, "== session %s\n-- inputs\n", s)
		for _, m := range raw {
			if strings.HasSuffix(m.Subject, "."+s) {
				fmt.Fprintf(&b, "%d %s %s %s\n", m.Sequence, m.Subject, m.Header.Get("ce-id"), m.Header.Get("ce-type"))
			}
		}
		b.WriteString("-- want\n")
		for _, v := range w[s] {
			b.WriteString(v + "\n")
		}
		b.WriteString("-- got\n")
		for _, v := range g[s] {
			b.WriteString(v + "\n")
		}
	}
	_ = os.WriteFile(path, []byte(b.String()), 0o644)
}
