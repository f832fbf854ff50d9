package processor

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
)

// leaseRig is a server with the leases bucket of a deployment of parts
// partitions, lease keepers running on it, and a watch that fails the test
// if two keepers could ever fetch one partition at the same moment.
type leaseRig struct {
	t     *testing.T
	ctx   context.Context
	js    jetstream.JetStream
	res   *Resources
	cfg   Config
	mu    sync.Mutex
	all   []*leases
	clash string // the first moment two could fetch one partition
}

func newLeaseRig(t *testing.T, parts int, ttl time.Duration) *leaseRig {
	env := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cfg := Config{Partitions: parts, LeaseTTL: ttl}
	res, err := Provision(ctx, env.JS, cfg)
	require.NoError(t, err)
	r := &leaseRig{t: t, ctx: ctx, js: env.JS, res: res, cfg: cfg.withDefaults()}
	watch, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for watch.Err() == nil {
			r.check()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
		require.Empty(t, r.clash, "two keepers could fetch one partition at once")
	})
	return r
}

// check records a partition that more than one keeper may fetch now.
func (r *leaseRig) check() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := 0; p < r.cfg.Partitions; p++ {
		var who []string
		for _, l := range r.all {
			l.mu.Lock()
			if l.left(p) > 0 {
				who = append(who, l.id)
			}
			l.mu.Unlock()
		}
		if len(who) > 1 && r.clash == "" {
			r.clash = time.Now().Format(time.StampMilli) + ": partition " + partKey(p) + " by " + who[0] + " and " + who[1]
		}
	}
}

// start runs a new keeper until the returned stop; stop hands nothing over
// (as a crash) unless release is set (as a drain).
func (r *leaseRig) start() (*leases, func(release bool)) {
	str, err := r.js.Stream(r.ctx, "KV_"+r.cfg.Names().Leases)
	require.NoError(r.t, err)
	l := newLeases(r.res.Leases, str, r.cfg.Names().Leases, r.cfg.Partitions, r.cfg.LeaseTTL, slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	r.mu.Lock()
	r.all = append(r.all, l)
	r.mu.Unlock()
	var once sync.Once
	stop := func(release bool) {
		once.Do(func() {
			cancel()
			<-done
			if release {
				l.releaseAll(r.ctx)
			}
		})
	}
	r.t.Cleanup(func() { stop(false) })
	return l, stop
}

// waitHeld waits until each keeper holds as many partitions as want says.
func (r *leaseRig) waitHeld(within time.Duration, what string, ls []*leases, want ...int) time.Duration {
	r.t.Helper()
	start := time.Now()
	for {
		ok := true
		got := make([]int, len(ls))
		for i, l := range ls {
			got[i] = len(l.held())
			ok = ok && got[i] == want[i]
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > within {
			r.t.Fatalf("%s: after %s the keepers hold %v partitions, want %v", what, within, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holders checks the bucket: each partition's key names the keeper that
// believes it holds it, and no other.
func (r *leaseRig) holders(ls ...*leases) {
	r.t.Helper()
	for p := 0; p < r.cfg.Partitions; p++ {
		owner := ""
		for _, l := range ls {
			for _, q := range l.held() {
				if q == p {
					require.Empty(r.t, owner, "partition %d held by two", p)
					owner = l.id
				}
			}
		}
		e, err := r.res.Leases.Get(r.ctx, partKey(p))
		if owner == "" {
			require.ErrorIs(r.t, err, jetstream.ErrKeyNotFound, "partition %d is held by nobody here", p)
			continue
		}
		require.NoError(r.t, err)
		require.Equal(r.t, owner, string(e.Value()), "the key of partition %d", p)
	}
}

// TestLeasesShareHandOverAndExpire: a lone keeper takes every partition;
// a second and a third get their fair shares handed over; a crashed
// keeper's partitions go to the others once its leases expire, and a
// drained keeper's at once. At no moment may two keepers fetch one
// partition.
func TestLeasesShareHandOverAndExpire(t *testing.T) {
	const ttl = time.Second
	r := newLeaseRig(t, 8, ttl)
	a, stopA := r.start()
	r.waitHeld(5*time.Second, "alone", []*leases{a}, 8)
	r.holders(a)

	b, stopB := r.start()
	took := r.waitHeld(10*time.Second, "two", []*leases{a, b}, 4, 4)
	t.Logf("a second keeper got its half in %s", took.Round(time.Millisecond))
	r.holders(a, b)

	c, _ := r.start()
	r.waitHeld(10*time.Second, "three", []*leases{a, b, c}, 3, 3, 2)
	r.holders(a, b, c)
	_ = a // (the order of shares follows the order of starting)

	// a crashes: its leases and its membership expire after the TTL.
	stopA(false)
	killed := time.Now()
	r.waitHeld(ttl+5*time.Second, "after a crash", []*leases{b, c}, 4, 4)
	t.Logf("a crashed keeper's partitions were taken over after %s (TTL %s)", time.Since(killed).Round(time.Millisecond), ttl)
	require.Greater(t, time.Since(killed), ttl*9/10, "nothing may be taken before the lease can have expired")
	r.holders(b, c)

	// b drains: it hands over at once.
	drained := time.Now()
	stopB(true)
	require.Empty(t, b.held())
	r.waitHeld(ttl, "after a drain", []*leases{c}, 8)
	t.Logf("a drained keeper's partitions were taken over after %s", time.Since(drained).Round(time.Millisecond))
	r.holders(c)
}

// TestLeasesWaitForTheFetchUnderWay: a partition to be handed over while
// its fetch is under way stays with its holder (renewed, and no new fetch
// begins) until the fetch ends; the other, still under way, is not handed
// over at all.
func TestLeasesWaitForTheFetchUnderWay(t *testing.T) {
	const ttl = time.Second
	r := newLeaseRig(t, 2, ttl)
	a, _ := r.start()
	r.waitHeld(5*time.Second, "alone", []*leases{a}, 2)
	for p := range 2 {
		wait, _, ok := a.begin(p, fetchWait)
		require.True(t, ok)
		require.Greater(t, wait, time.Duration(0))
		require.LessOrEqual(t, wait, fetchWait)
	}

	b, _ := r.start()
	time.Sleep(2 * ttl) // longer than the lease: it must be renewed meanwhile
	require.Empty(t, b.held(), "a partition under way stays with its holder")
	require.Equal(t, []int{0, 1}, a.held())
	_, _, ok := a.begin(1, fetchWait)
	require.False(t, ok, "no new fetch begins on a partition being handed over")
	e, err := r.res.Leases.Get(r.ctx, partKey(1))
	require.NoError(t, err)
	require.Equal(t, a.id, string(e.Value()))

	a.end(1)
	r.waitHeld(5*time.Second, "after the fetch ended", []*leases{a, b}, 1, 1)
	r.holders(a, b)
}

// TestLeasesHandOverCalledOff: a partition marked for hand-over while its
// fetch was under way is kept, and fetched again, when the instance it was
// meant for leaves before the fetch ends (the share grew back).
func TestLeasesHandOverCalledOff(t *testing.T) {
	const ttl = time.Second
	r := newLeaseRig(t, 2, ttl)
	a, _ := r.start()
	r.waitHeld(5*time.Second, "alone", []*leases{a}, 2)
	for p := range 2 {
		_, _, ok := a.begin(p, fetchWait)
		require.True(t, ok)
	}
	_, stopB := r.start()
	marked := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.parts[0].releasing || a.parts[1].releasing
	}
	deadline := time.Now().Add(5 * time.Second)
	for !marked() {
		require.True(t, time.Now().Before(deadline), "a never began to hand a partition over to b")
		time.Sleep(5 * time.Millisecond)
	}
	stopB(false)        // b crashes
	time.Sleep(3 * ttl) // and its membership expires while a's fetches go on
	a.end(0)
	a.end(1)
	deadline = time.Now().Add(5 * time.Second)
	for p := range 2 {
		for {
			if _, _, ok := a.begin(p, fetchWait); ok {
				a.end(p)
				break
			}
			require.True(t, time.Now().Before(deadline), "partition %d is never fetched again", p)
			time.Sleep(10 * time.Millisecond)
		}
	}
	r.holders(a)
}

// testWriter writes a keeper's warnings into the test's output.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}
