package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

var hostileLogs = flag.String("hostile-logs", "", "write each case's serve log to this directory as <case>.log")

var hostileSize = flag.String("hostile", "short", "size of TestHostile: short (runs in CI) or full (the issue's sizes: a 20 MB amplification, a 100 MB spill killed, 21,000 requests, 524,300 truncations without --max-ranges)")

// hostilePlan sizes one run of TestHostile.
type hostilePlan struct {
	Clean int // clean sessions interleaved with every hostile case
	// Limits passed to serve when it has the flag; 0 passes none (serve's
	// default).
	MaxRequests      int
	MaxSnapshotBytes int
	MaxRanges        int
	Requests         int // route 1: requests when serve has no --max-requests (with it: 4 times the limit)
	Ranges           int // route 2: truncations when serve has no --max-ranges; 0 skips the route
	AmplifyTurns     int // spill amplification: turns of 64 kB before the 20 rounds
	KillTurns        int // kill during a spill: turns of 256 kB
	DiskTurns        int // full disk: turns of 256 kB, more than a 64 MiB tmpfs can spill
}

var hostilePlans = map[string]hostilePlan{
	"short": {Clean: 1000, MaxRequests: 256, MaxSnapshotBytes: 32 << 10, MaxRanges: 200,
		Requests: 21000, AmplifyTurns: 64, KillTurns: 200, DiskTurns: 112},
	"full": {Clean: 2000, MaxRanges: 100000,
		Requests: 21000, Ranges: 524300, AmplifyTurns: 320, KillTurns: 400, DiskTurns: 112},
}

const (
	// hostileStall: inputs pending and nothing moving (no delivery, ack,
	// verdict, state write or spill chunk) for this long means the processor
	// cannot consume; /readyz must not say 200 then.
	hostileStall = 10 * time.Second
	// hostileTerm bounds how long serve may take to exit after SIGTERM.
	hostileTerm = 30 * time.Second
	// hostileRetryBound bounds a run of log lines retrying the same thing.
	hostileRetryBound = 30 * time.Second
	// hostileOrphanWait bounds how long orphaned chunks may outlive a restart.
	hostileOrphanWait = 30 * time.Second
	spillBucket       = "seamguard-spills"
)

// TestHostile is the suite of hostile sessions of issue 14. Each case runs
// a real `seamguard serve` (its embedded NATS server, --health-listen, JSON
// logs) on a fleet of clean sessions with a hostile one interleaved, and
// checks: every clean session is decided exactly as `check` decides it
// offline; the hostile one ends as CONTRACT.md section 7 says; /readyz is
// never 200 while the processor cannot consume, and names what is stuck
// when it is 503; no retry runs past its bound; every output is under
// 64 KiB; SIGTERM returns within 30 s.
//
// Limits that serve takes as flags (--max-requests, --max-snapshot-bytes,
// --max-ranges, --spill-quota, --sweep-every, --sweep-min-age,
// --retry-for) must all be listed by `serve -h`, so that the suite never
// runs weaker than it says. -hostile=full runs the sizes throughout, and
// -hostile-logs=DIR keeps each case's serve log:
//
//	SEAMGUARD_LONG=1 go test ./cmd/seamguard -run TestHostile -v -hostile=full -timeout 60m
func TestHostile(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	plan, ok := hostilePlans[*hostileSize]
	require.True(t, ok, "-hostile is %q; use short or full", *hostileSize)
	began := time.Now()
	hs := &hostileSuite{plan: plan, bin: buildBinary(t)}
	hs.flags = serveFlags(t, hs.bin)
	hs.clean = cleanFleet(plan.Clean, "clean")
	t.Logf("%d clean sessions, %d events; serve's limit flags: %v", plan.Clean, len(hs.clean.Items), hs.limitFlags())

	type hostileCase struct {
		name string
		run  func(t *testing.T, hs *hostileSuite)
	}
	var summary []string
	for _, c := range []hostileCase{
		{"oversize-verdict", hostileOversizeVerdict},
		{"snapshot-requests", hostileManyRequests},
		{"snapshot-ranges", hostileManyRanges},
		{"snapshot-ids", hostileHugeIDs},
		{"full-disk", hostileFullDisk},
		{"spill-amplification", hostileAmplification},
		{"kill-mid-spill", hostileKillMidSpill},
		{"stuck-then-cleared", hostileStuck},
	} {
		t0 := time.Now()
		verdict := "not run"
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				switch {
				case t.Skipped():
					verdict = "skipped"
				case t.Failed():
					verdict = "FAIL"
				default:
					verdict = "ok"
				}
			}()
			c.run(t, hs)
		})
		summary = append(summary, fmt.Sprintf("%-20s %-7s %6.1fs", c.name, verdict, time.Since(t0).Seconds()))
	}
	t.Logf("hostile sessions (%s), %.1fs in all:\n  %s", *hostileSize, time.Since(began).Seconds(), strings.Join(summary, "\n  "))
}

// hostileSuite is what the cases share: the binary, its flags, the plan,
// and the clean fleet.
type hostileSuite struct {
	plan  hostilePlan
	bin   string
	flags map[string]bool
	clean *workload.Workload
}

// serveFlags lists the flags `seamguard serve -h` names.
func serveFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--?([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	require.True(t, flags["data-dir"] && flags["health-listen"], "serve -h lists no flags:\n%s", out)
	for _, f := range []string{"max-requests", "max-snapshot-bytes", "max-ranges", "spill-quota", "sweep-every", "sweep-min-age", "retry-for"} {
		require.True(t, flags[f], "serve -h does not list --%s, which the suite needs:\n%s", f, out)
	}
	return flags
}

// limitFlags lists the section 7 flags serve has, of those the suite uses.
func (hs *hostileSuite) limitFlags() []string {
	var have []string
	for _, f := range []string{"max-requests", "max-snapshot-bytes", "max-ranges", "spill-quota", "sweep-every", "sweep-min-age", "retry-for"} {
		if hs.flags[f] {
			have = append(have, "--"+f)
		}
	}
	if have == nil {
		return []string{"none"}
	}
	return have
}

// args are serve's flags for a case: the limits of the plan that serve
// takes, then extra (flag, value) pairs where serve has the flag.
func (hs *hostileSuite) args(extra ...string) []string {
	var args []string
	add := func(name, value string) {
		if hs.flags[name] {
			args = append(args, "--"+name, value)
		}
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"max-requests", hs.plan.MaxRequests}, {"max-snapshot-bytes", hs.plan.MaxSnapshotBytes}, {"max-ranges", hs.plan.MaxRanges}} {
		if l.v > 0 {
			add(l.name, strconv.Itoa(l.v))
		}
	}
	add("sweep-every", "2s")
	add("sweep-min-age", "3s")
	add("retry-for", "10s")
	for i := 0; i+1 < len(extra); i += 2 {
		add(extra[i], extra[i+1])
	}
	return args
}

// retryBound is how long one run of retries may last.
func (hs *hostileSuite) retryBound() time.Duration {
	if hs.flags["retry-for"] {
		return 15 * time.Second // --retry-for 10s, and a backoff's slack
	}
	return hostileRetryBound
}

// cleanFleet is n small clean sessions: healthy chains of one compaction,
// and every 25th a seed-like story with two spills.
func cleanFleet(n int, prefix string) *workload.Workload {
	scripts := make([]*workload.Script, n)
	for i := range scripts {
		s := &workload.Script{ID: fmt.Sprintf("%s-%04d", prefix, i)}
		if i%25 == 7 {
			workload.SeedLike(s)
		} else {
			workload.HealthyChain(s, 2, 1)
		}
		scripts[i] = s
	}
	return workload.Interleave(scripts, rand.New(rand.NewPCG(14, uint64(n))))
}

// mix spreads the items of each hostile list evenly over the first frac of
// the clean items, keeping every list's order.
func mix(clean []workload.Item, frac float64, hostile ...[]workload.Item) []workload.Item {
	at := make([][]workload.Item, len(clean)+1)
	n := len(clean)
	for _, h := range hostile {
		for j, it := range h {
			k := int(float64(j) * frac * float64(len(clean)) / float64(len(h)))
			at[k] = append(at[k], it)
			n++
		}
	}
	out := make([]workload.Item, 0, n)
	for i, it := range clean {
		out = append(out, at[i]...)
		out = append(out, it)
	}
	return append(out, at[len(clean)]...)
}

// lastID is the id of the script's last event.
func lastID(s *workload.Script) string {
	var a struct{ ID string }
	_ = json.Unmarshal(s.Items[len(s.Items)-1].Line, &a)
	return a.ID
}

func freePort(t *testing.T) int {
	t.Helper()
	return embedded.FreePort(t)
}

// hostileServe is one case's `seamguard serve`, with its embedded server
// and data directory (kept across restarts), a client of that server,
// every verdict published, and a watch on /readyz.
type hostileServe struct {
	t        *testing.T
	hs       *hostileSuite
	p        *procRunner
	natsURL  string
	health   string // http://HOST:PORT
	js       jetstream.JetStream
	verdicts *verdictLog
	ready    *readyWatch
	sessions []string // the hostile sessions: /readyz may name them

	published []workload.Item // in the order of the events stream
	offline   map[string]string
	offlineOf int // how many of published offline was computed for
}

// startHostile starts serve on dataDir and waits until it is ready.
func (hs *hostileSuite) startHostile(t *testing.T, dataDir string, extra ...string) *hostileServe {
	t.Helper()
	natsPort, healthPort := freePort(t), freePort(t)
	h := &hostileServe{t: t, hs: hs,
		natsURL: fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
		health:  fmt.Sprintf("http://127.0.0.1:%d", healthPort)}
	h.p = &procRunner{t: t, bin: hs.bin, args: append([]string{
		"--data-dir", dataDir, "--listen", fmt.Sprintf("127.0.0.1:%d", natsPort),
		"--health-listen", fmt.Sprintf("127.0.0.1:%d", healthPort),
		"--log-format", "json", "--source", "urn:seamguard:test", "--shards", "4",
		"--ack-wait", "2s", "--lease-ttl", "2s", "--lag-interval", "1s"}, hs.args(extra...)...)}
	t.Cleanup(func() {
		h.p.cleanup()
		if *hostileLogs != "" {
			name := filepath.Join(*hostileLogs, strings.ReplaceAll(t.Name(), "/", "_")+".log")
			if err := os.WriteFile(name, []byte(h.p.String()), 0o644); err != nil {
				t.Errorf("writing serve's log: %v", err)
			}
		}
		if t.Failed() {
			lines := strings.Split(strings.TrimSpace(h.p.String()), "\n")
			t.Logf("serve's last %d of %d log lines:\n%s", min(40, len(lines)), len(lines), strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	h.start()
	h.verdicts = startVerdictLog(t, h.js)
	return h
}

// playMixed starts serve on a fresh data directory, publishes the clean
// fleet with the hostile session s mixed in (its events spread over the
// first share of the fleet's), waits up to limit for s's request last to
// be decided and for every clean session, and checks the clean ones
// against the offline decision.
func (hs *hostileSuite) playMixed(t *testing.T, s *workload.Script, share float64, last string, limit time.Duration) *hostileServe {
	t.Helper()
	h := hs.startHostile(t, t.TempDir())
	h.sessions = []string{s.ID}
	require.NoError(t, h.publish(mix(hs.clean.Items, share, s.Items)))
	h.await("the hostile session's last verdict", limit, func() bool { _, ok := h.verdicts.decided(s.ID, last); return ok })
	h.awaitClean("clean")
	h.checkClean("clean")
	return h
}

// start starts serve (again) and a fresh watch on its readiness.
func (h *hostileServe) start() {
	h.t.Helper()
	h.p.start()
	require.True(h.t, waitStatus(h.health+"/readyz", http.StatusOK, time.Minute), "serve did not become ready within a minute")
	if h.js == nil {
		_, h.js = connectChaos(h.t, h.natsURL)
	}
	h.ready = watchReady(h.health, h.js)
}

// kill ends serve with SIGKILL, checking its readiness record first.
func (h *hostileServe) kill() {
	h.ready.check(h.t, h.sessions, h.p.String())
	h.p.kill()
}

// stop checks that serve is ready (whatever was stuck has cleared) and has
// been honest about it, then sends SIGTERM and times the exit.
func (h *hostileServe) stop() {
	t := h.t
	assert.True(t, waitStatus(h.health+"/readyz", http.StatusOK, 10*time.Second),
		"/readyz is not 200 at the end of the case, once every input was handled")
	h.ready.check(t, h.sessions, h.p.String())
	var read, stored uint64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		stored, read = streamMsgs(context.Background(), h.js, "SEAMGUARD_VERDICTS"), uint64(len(h.verdicts.all()))
		if read == stored {
			break
		}
	}
	assert.Equal(t, stored, read, "the harness read every verdict stored")
	took, err := h.p.term(hostileTerm)
	assert.NoError(t, err, "SIGTERM")
	t.Logf("SIGTERM: serve exited after %s", took.Round(time.Millisecond))
}

// done ends the case: the checks on everything serve logged and published.
func (h *hostileServe) done() {
	t := h.t
	checkRetries(t, h.p.String(), h.hs.retryBound())
	var big []string
	for _, v := range h.verdicts.all() {
		if len(v.Raw) > events.MaxOutputBytes {
			big = append(big, fmt.Sprintf("%s %s of %s: %d bytes", v.Kind, v.ID, v.Session, len(v.Raw)))
		}
	}
	assert.Empty(t, big, "outputs over 64 KiB")
	h.verdicts.mu.Lock()
	assert.Empty(t, h.verdicts.bad, "verdicts that do not decode")
	h.verdicts.mu.Unlock()
}

// publish publishes items in order.
func (h *hostileServe) publish(items []workload.Item) error {
	h.published = append(h.published, items...)
	subj := events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions}
	msgs := make([]*nats.Msg, len(items))
	for i, it := range items {
		m, err := it.Msg(subj)
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	return publishAsync(h.js, msgs)
}

// await waits until cond holds. It gives up after limit, or once the
// processor has made no progress for hostileStall and 5 s more, and says
// so.
func (h *hostileServe) await(what string, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Logf("gave up waiting for %s after %s", what, limit)
			return false
		}
		if d := h.ready.sinceProgress(); d > hostileStall+5*time.Second {
			h.t.Logf("gave up waiting for %s: no progress for %s (%d inputs pending)", what, d.Round(time.Second), h.ready.pendingNow())
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// want is the offline decision of everything published, in the same
// order (so that stream sequences in spill handles agree), for the
// sessions named prefix-*.
func (h *hostileServe) want(prefix string) map[string]string {
	if h.offline == nil || h.offlineOf != len(h.published) {
		lines := make([]string, len(h.published))
		for i, it := range h.published {
			lines[i] = string(it.Line)
		}
		h.offline, h.offlineOf = offlineVerdicts(h.t, lines), len(h.published)
	}
	want := map[string]string{}
	for id, body := range h.offline {
		var v struct{ Subject string }
		if json.Unmarshal([]byte(body), &v) == nil && strings.HasPrefix(v.Subject, prefix+"-") {
			want[id] = body
		}
	}
	return want
}

// awaitClean waits for every verdict of the sessions named prefix-* that
// the offline decision has.
func (h *hostileServe) awaitClean(prefix string) bool {
	want := h.want(prefix)
	return h.await(prefix+" sessions' verdicts", 5*time.Minute, func() bool { return h.verdicts.hasAll(want) })
}

// checkClean compares the verdicts of the sessions named prefix-* with the
// offline decision of the same events.
func (h *hostileServe) checkClean(prefix string) {
	t := h.t
	want := h.want(prefix)
	got, counts := map[string]string{}, map[string]int{}
	for _, v := range h.verdicts.all() {
		if strings.HasPrefix(v.Session, prefix+"-") {
			id, body := normalise(t, v.Raw)
			got[id] = body
			counts[id]++
		}
	}
	var missing, different, extra, twice int
	var diffs []string
	for id, body := range want {
		switch g, ok := got[id]; {
		case !ok:
			missing++
			diffs = append(diffs, fmt.Sprintf("%s: missing", id))
		case g != body:
			different++
			diffs = append(diffs, fmt.Sprintf("%s:\n  offline: %s\n  served:  %s", id, body, g))
		}
	}
	for id, body := range got {
		if _, ok := want[id]; !ok {
			extra++
			diffs = append(diffs, fmt.Sprintf("%s: served only: %s", id, body))
		}
		if counts[id] > 1 {
			twice++
			diffs = append(diffs, fmt.Sprintf("%s: stored %d times", id, counts[id]))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 4 {
		diffs = append(diffs[:4], fmt.Sprintf("... and %d more", len(diffs)-4))
	}
	t.Logf("%s sessions: %d of %d verdicts as offline; %d missing, %d different, %d extra, %d stored twice",
		prefix, len(want)-missing-different, len(want), missing, different, extra, twice)
	assert.Empty(t, diffs, "%s sessions are not decided as offline", prefix)
}

// snapshotBytes is the size of the session's stored state.
func (h *hostileServe) snapshotBytes(session string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := h.js.KeyValue(ctx, "seamguard-sessions")
	if err != nil {
		return 0, err
	}
	e, err := kv.Get(ctx, session)
	if err != nil {
		return 0, err
	}
	return len(e.Value()), nil
}

// checkSnapshot checks that the session's stored state stays under the
// limit given to serve, or under the bucket's old 1 MiB value limit.
func (h *hostileServe) checkSnapshot(session string) {
	limit := 1 << 20
	if h.hs.flags["max-snapshot-bytes"] && h.hs.plan.MaxSnapshotBytes > 0 {
		limit = h.hs.plan.MaxSnapshotBytes
	}
	n, err := h.snapshotBytes(session)
	if assert.NoError(h.t, err, "reading %s's stored state", session) {
		h.t.Logf("%s's stored state: %d bytes (limit %d)", session, n, limit)
		assert.Less(h.t, n, limit, "%s's stored state is not bounded", session)
	}
}

// verdict is one message of the verdict stream.
type verdict struct {
	Raw           []byte
	Session, Kind string // from the subject seamguard.verdicts.<session>.<kind>
	Type          string
	ID            string
	CausationID   string
	Data          verdictData
	Handle        events.SpillHandle // of transcript.spilled
}

// verdictData is the union of the verdicts' data fields the cases read.
type verdictData struct {
	RequestID     string              `json:"request_id"`
	Code          string              `json:"code"`
	Field         string              `json:"field"`
	Message       string              `json:"message"`
	Reasons       []events.Reason     `json:"reasons"`
	Unrecoverable []events.Range      `json:"unrecoverable"`
	Spill         *events.SpillHandle `json:"spill"`
}

// verdictLog collects the verdict stream as serve publishes it, through
// an ordered consumer that survives restarts of the server.
type verdictLog struct {
	mu   sync.Mutex
	list []verdict
	ids  map[string]int
	bad  []string
}

func startVerdictLog(t *testing.T, js jetstream.JetStream) *verdictLog {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	l := &verdictLog{ids: map[string]int{}}
	cc, err := c.Consume(func(m jetstream.Msg) { l.add(m.Subject(), m.Data()) })
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	return l
}

func (l *verdictLog) add(subject string, data []byte) {
	v := verdict{Raw: append([]byte(nil), data...)}
	tok := strings.Split(subject, ".")
	if len(tok) == 4 {
		v.Session, v.Kind = tok[2], tok[3]
	}
	var m struct {
		Type        string          `json:"type"`
		ID          string          `json:"id"`
		CausationID string          `json:"causationid"`
		Data        json.RawMessage `json:"data"`
	}
	err := json.Unmarshal(data, &m)
	if err == nil {
		v.Type, v.ID, v.CausationID = m.Type, m.ID, m.CausationID
		if m.Type == events.TypeTranscriptSpilled {
			err = json.Unmarshal(m.Data, &v.Handle)
		} else {
			err = json.Unmarshal(m.Data, &v.Data)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.bad = append(l.bad, fmt.Sprintf("%s: %v", subject, err))
	}
	l.list = append(l.list, v)
	l.ids[v.ID]++
}

func (l *verdictLog) all() []verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]verdict(nil), l.list...)
}

func (l *verdictLog) hasAll(want map[string]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range want {
		if l.ids[id] == 0 {
			return false
		}
	}
	return true
}

// of returns the verdicts of session, of type typ when typ is not empty.
func (l *verdictLog) of(session, typ string) []verdict {
	var out []verdict
	for _, v := range l.all() {
		if v.Session == session && (typ == "" || v.Type == typ) {
			out = append(out, v)
		}
	}
	return out
}

// first returns the first verdict of session of type typ caused by the
// event id (any cause when id is empty), and whether there is one.
func (l *verdictLog) first(session, typ, cause string) (verdict, bool) {
	for _, v := range l.of(session, typ) {
		if cause == "" || v.CausationID == cause {
			return v, true
		}
	}
	return verdict{}, false
}

// decided returns the verdict of session that decided request_id req:
// allowed, refused or halted.
func (l *verdictLog) decided(session, req string) (verdict, bool) {
	for _, v := range l.of(session, "") {
		switch v.Type {
		case events.TypeCompactionAllowed, events.TypeCompactionRefused, events.TypeSessionHalted:
			if v.Data.RequestID == req {
				return v, true
			}
		}
	}
	return verdict{}, false
}

func describe(vs []verdict) string {
	var b strings.Builder
	for i, v := range vs {
		if i == 8 {
			fmt.Fprintf(&b, "\n  ... and %d more", len(vs)-i)
			break
		}
		body := string(v.Raw)
		if len(body) > 400 {
			body = body[:400] + fmt.Sprintf("... (%d bytes)", len(v.Raw))
		}
		fmt.Fprintf(&b, "\n  %s", body)
	}
	return b.String()
}

// readyWatch polls /readyz every 100 ms and, every half second, what the
// processor does: deliveries and acks of the events consumers, verdicts,
// state writes and spill chunks. Inputs pending with none of that moving
// for hostileStall means the processor cannot consume; /readyz must not be
// 200 then. Each stretch of 503 after the first 200 is an episode: what
// /readyz said, and which seamguard_*stuck* series /metrics had above 0
// meanwhile (the name the suite expects is seamguard_sessions_stuck).
type readyWatch struct {
	url  string
	js   jetstream.JetStream
	stop chan struct{}
	done chan struct{}

	mu           sync.Mutex
	seenReady    bool
	lastStatus   int
	lastProgress time.Time
	progress     string
	pending      int
	stalledSince time.Time
	stalls       []string
	lies         int
	lieNotes     []string
	episodes     []*unready
	cur          *unready
	samples      map[int]int
}

// unready is one stretch of 503s from /readyz.
type unready struct {
	from, to time.Time
	samples  int
	bodies   map[string]int
	stuck    string // /metrics lines about stuck sessions, scraped during the episode
}

var httpShort = &http.Client{Timeout: 2 * time.Second}

func getStatus(url string) (int, string) {
	resp, err := httpShort.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitStatus waits up to d for url to answer code.
func waitStatus(url string, code int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, _ := getStatus(url); c == code {
			return true
		}
	}
	return false
}

func watchReady(base string, js jetstream.JetStream) *readyWatch {
	w := &readyWatch{url: base, js: js, stop: make(chan struct{}), done: make(chan struct{}),
		lastProgress: time.Now(), pending: -1, samples: map[int]int{}}
	go w.run()
	return w
}

func (w *readyWatch) run() {
	defer close(w.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var looked time.Time
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		code, body := getStatus(w.url + "/readyz")
		var sig string
		pending := -2 // not looked
		if time.Since(looked) >= 500*time.Millisecond {
			looked = time.Now()
			sig, pending = progressOf(w.js)
		}
		var scrape bool
		w.mu.Lock()
		now := time.Now()
		w.lastStatus = code
		w.samples[code]++
		if pending != -2 {
			w.pending = pending
			if sig != "" && sig != w.progress {
				w.progress, w.lastProgress = sig, now
			}
		}
		stalled := w.pending > 0 && now.Sub(w.lastProgress) >= hostileStall
		switch {
		case stalled && w.stalledSince.IsZero():
			w.stalledSince = w.lastProgress
		case !stalled && !w.stalledSince.IsZero():
			w.stalls = append(w.stalls, fmt.Sprintf("no progress from %s for %s", w.stalledSince.Format("15:04:05.0"), now.Sub(w.stalledSince).Round(time.Second)))
			w.stalledSince = time.Time{}
		}
		if stalled && code == http.StatusOK {
			w.lies++
			if len(w.lieNotes) < 3 {
				w.lieNotes = append(w.lieNotes, fmt.Sprintf("%s: /readyz 200 with %d inputs pending and no progress for %s",
					now.Format("15:04:05.0"), w.pending, now.Sub(w.lastProgress).Round(time.Second)))
			}
		}
		switch {
		case code == http.StatusOK:
			w.seenReady = true
			w.cur = nil
		case code == http.StatusServiceUnavailable && w.seenReady:
			if w.cur == nil {
				w.cur = &unready{from: now, bodies: map[string]int{}}
				w.episodes = append(w.episodes, w.cur)
			}
			w.cur.to = now
			w.cur.samples++
			w.cur.bodies[body]++
			scrape = w.cur.samples == 2
		}
		cur := w.cur
		w.mu.Unlock()
		if scrape {
			stuck := stuckMetrics(w.url + "/metrics")
			w.mu.Lock()
			cur.stuck = stuck
			w.mu.Unlock()
		}
	}
}

// stuckMetrics returns the /metrics lines about stuck sessions with a value
// above 0.
func stuckMetrics(url string) string {
	resp, err := httpShort.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && strings.HasPrefix(l, "seamguard_") && strings.Contains(f[0], "stuck") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil && v > 0 {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "; ")
}

// progressOf is a signature of everything the processor moves, and how
// many inputs its consumers hold pending or unacknowledged; "" and -1 when
// it cannot tell.
func progressOf(js jetstream.JetStream) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var b strings.Builder
	for _, name := range []string{"SEAMGUARD_VERDICTS", "KV_seamguard-sessions", "OBJ_" + spillBucket} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return "", -1
		}
		info, err := s.Info(ctx)
		if err != nil {
			return "", -1
		}
		fmt.Fprintf(&b, "%s:%d/%d ", name, info.State.LastSeq, info.State.Bytes)
	}
	s, err := js.Stream(ctx, "SEAMGUARD_EVENTS")
	if err != nil {
		return "", -1
	}
	pending := 0
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		pending += int(ci.NumPending) + ci.NumAckPending
		fmt.Fprintf(&b, "%s:%d/%d ", ci.Name, ci.Delivered.Stream, ci.AckFloor.Stream)
	}
	if lister.Err() != nil {
		return "", -1
	}
	return b.String(), pending
}

func (w *readyWatch) sinceProgress() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Since(w.lastProgress)
}

func (w *readyWatch) pendingNow() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

// check stops the watch and asserts what it saw: /readyz never 200 while
// the processor could not consume, and every episode of 503 that lasted
// said why; when it blamed a session, it named it, a seamguard_*stuck*
// metric was above 0, and a log line about a stuck session named it too.
func (w *readyWatch) check(t *testing.T, sessions []string, logs string) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stalledSince.IsZero() {
		w.stalls = append(w.stalls, fmt.Sprintf("no progress from %s until the end (%s)", w.stalledSince.Format("15:04:05.0"), time.Since(w.stalledSince).Round(time.Second)))
	}
	var eps []string
	for _, e := range w.episodes {
		var bodies []string
		for b := range e.bodies {
			bodies = append(bodies, b)
		}
		sort.Strings(bodies)
		eps = append(eps, fmt.Sprintf("%s for %s (%d samples): %q; stuck metrics: %q",
			e.from.Format("15:04:05.0"), e.to.Sub(e.from).Round(100*time.Millisecond), e.samples, bodies, e.stuck))
		if e.samples < 2 {
			continue
		}
		// When /readyz blames sessions, it names them, the stuck sessions
		// metric counts them, and a log line names them. A session other
		// than the hostile ones may be stuck too, for a while, when what
		// the hostile one did is shared (the store filled by its spill):
		// the clean sessions' verdicts are checked on their own.
		for _, b := range bodies {
			assert.NotEmpty(t, b, "/readyz was 503 from %s without saying why", e.from.Format("15:04:05.0"))
			named := stuckNamed.FindAllStringSubmatch(b, -1)
			if len(named) == 0 {
				continue
			}
			var blamed []string
			for _, m := range named {
				blamed = append(blamed, m[1])
			}
			assert.NotEmpty(t, e.stuck, "/readyz blames sessions %q but no seamguard_*stuck* metric is above 0", blamed)
			assert.True(t, stuckLogged(logs, blamed), "/readyz blames sessions %q but no log line about a stuck session names one of them", blamed)
		}
	}
	t.Logf("/readyz samples by status %v; %d episodes of 503 after ready%s; stalls: %q",
		w.samples, len(w.episodes), strings.Join(append([]string{""}, eps...), "\n  "), w.stalls)
	assert.Zero(t, w.lies, "/readyz said 200 while the processor could not consume, %d times: %q", w.lies, w.lieNotes)
}

// stuckNamed finds the sessions a /readyz body says are stuck.
var stuckNamed = regexp.MustCompile(`(?:^|; |: )session ([A-Za-z0-9_-]{1,128}): `)

// stuckLogged reports whether a JSON log line whose message speaks of a
// stuck session names one of sessions in its session attribute.
func stuckLogged(logs string, sessions []string) bool {
	for _, l := range strings.Split(logs, "\n") {
		var m struct{ Msg, Session string }
		if json.Unmarshal([]byte(l), &m) != nil || !strings.Contains(strings.ToLower(m.Msg), "stuck") {
			continue
		}
		for _, s := range sessions {
			if m.Session == s {
				return true
			}
		}
	}
	return false
}

// retryRun is a run of log lines retrying one thing.
type retryRun struct {
	key         string
	first, last time.Time
	lines       int
}

// retryMsg matches the log messages of an attempt that failed and will be
// made again: "...; retrying", "trying again", "publishing again", and
// warnings of a failure that recurs ("taking a partition's lease failed").
var retryMsg = regexp.MustCompile(`(?i)retrying|trying again|publishing again|failed`)

// checkRetries reads serve's JSON log lines and asserts that no run of
// retries of one thing (same message and attributes but the error; lines
// more than 10 s apart start a new run) lasted longer than bound.
func checkRetries(t *testing.T, logs string, bound time.Duration) {
	t.Helper()
	open := map[string]*retryRun{}
	var runs []*retryRun
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		if !retryMsg.MatchString(msg) {
			continue
		}
		ts, _ := m["time"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		var attrs []string
		for k, v := range m {
			switch k {
			case "time", "level", "msg", "err", "attempt", "verdict_stream", "latency":
			default:
				attrs = append(attrs, fmt.Sprintf("%s=%v", k, v))
			}
		}
		sort.Strings(attrs)
		key := msg + " " + strings.Join(attrs, " ")
		if r := open[key]; r != nil && at.Sub(r.last) <= 10*time.Second {
			r.last = at
			r.lines++
			continue
		}
		r := &retryRun{key: key, first: at, last: at, lines: 1}
		open[key] = r
		runs = append(runs, r)
	}
	var long []string
	var longest time.Duration
	for _, r := range runs {
		d := r.last.Sub(r.first)
		longest = max(longest, d)
		if d > bound {
			key := r.key
			if len(key) > 300 {
				key = key[:300] + "..."
			}
			long = append(long, fmt.Sprintf("%s: %d lines over %s", key, r.lines, d.Round(time.Second)))
		}
	}
	t.Logf("retry log lines: %d runs, the longest %s (bound %s)", len(runs), longest.Round(time.Millisecond), bound)
	assert.Empty(t, long, "retries that ran past their bound of %s", bound)
}

// hostileOversizeVerdict: a commit whose request_id is 600,000 bytes
// (structured mode) and a turn whose ce-id header is 60,000 bytes (binary
// mode; the most JetStream stores in headers is 64 KiB). Each is rejected with too_large naming the field; nothing stalls;
// the session goes on.
func hostileOversizeVerdict(t *testing.T, hs *hostileSuite) {
	s := &workload.Script{ID: "hostile-a"}
	s.Open("turns", 4, "turns")
	s.Turns(12, 1)
	s.Compact("a1", workload.R(0, s.Head), workload.R(0, s.Head-4), s.Head-4, false)
	s.Commit("a1")
	s.Commit(strings.Repeat("r", 600_000))
	s.Items[len(s.Items)-1].Structured = true
	bigCommit := lastID(s)
	// JetStream refuses a message whose headers pass 64 KiB, so the
	// largest ce-id the events stream can hold stands in for 600 kB.
	s.N++
	s.EventWithID("hostile-a-"+strings.Repeat("i", 60_000), events.TypeTurnAppended, map[string]any{"offset": s.Head, "size": 1})
	s.Items[len(s.Items)-1].Structured = false
	s.Items[len(s.Items)-1].MsgID = "hostile-a-big-ce-id"
	s.Turns(8, 1)
	s.Compact("a2", workload.R(0, s.Head), workload.R(0, s.Head-4), s.Head-4, false)
	s.Commit("a2")

	h := hs.playMixed(t, s, 0.3, "a2", 3*time.Minute)

	rej := h.verdicts.of(s.ID, events.TypeEventRejected)
	fields := map[string]string{}
	for _, v := range rej {
		fields[v.Data.Field] = v.Data.Code
		if v.Data.Field == "data.request_id" {
			assert.Equal(t, bigCommit, v.CausationID, "the request_id rejection answers the commit")
		}
	}
	assert.Equal(t, map[string]string{"data.request_id": "too_large", "id": "too_large"}, fields,
		"want one too_large rejection naming data.request_id (structured) and one naming id (binary); hostile-a's rejections:%s", describe(rej))
	assert.Empty(t, h.verdicts.of(s.ID, events.TypeCompactionViolation), "the oversize commit must be rejected, not answered with a violation")
	for _, req := range []string{"a1", "a2"} {
		v, ok := h.verdicts.decided(s.ID, req)
		if assert.True(t, ok, "%s is not decided; hostile-a's verdicts:%s", req, describe(h.verdicts.of(s.ID, ""))) {
			assert.Equal(t, events.TypeCompactionAllowed, v.Type, "%s", req)
		}
	}
	h.stop()
	h.done()
}

// uuidLike returns a random id shaped like a UUID.
func uuidLike(r *rand.Rand) string {
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", r.Uint32(), r.Uint32()&0xffff, r.Uint32()&0xfff, 0x8000|r.Uint32()&0x3fff, r.Uint64()&0xffffffffffff)
}

// hostileManyRequests is route 1 to an oversize snapshot: many ordinary
// requests with UUID ids. Remembered ids stay bounded (at least the 256
// most recent), a commit of the first is a violation that says it is
// forgotten, and the session is still decided.
func hostileManyRequests(t *testing.T, hs *hostileSuite) {
	n := hs.plan.Requests
	if hs.flags["max-requests"] && hs.plan.MaxRequests > 0 {
		n = 4 * hs.plan.MaxRequests
	}
	r := rand.New(rand.NewPCG(1, 4))
	s := &workload.Script{ID: "hostile-b1"}
	s.Open("turns", 2, "turns")
	s.Turns(6, 1)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuidLike(r)
		s.Compact(ids[i], workload.R(0, 6), workload.R(0, 4), 4, false)
	}
	s.Commit(ids[0])
	early := lastID(s)
	s.Commit(ids[n-200])
	recent := lastID(s)
	s.Commit(ids[n-1])
	last := lastID(s)
	s.Turns(6, 1)
	s.Compact("b1-after", workload.R(0, s.Head), workload.R(0, s.Head-2), s.Head-2, false)
	t.Logf("%d requests with UUID ids", n)

	h := hs.playMixed(t, s, 0.9, "b1-after", 5*time.Minute)

	allowed := len(h.verdicts.of(s.ID, events.TypeCompactionAllowed))
	assert.Equal(t, n+1, allowed, "every request of hostile-b1 is allowed")
	v, ok := h.verdicts.first(s.ID, events.TypeCompactionViolation, early)
	if assert.True(t, ok, "the commit of the first request id is no violation; hostile-b1's other verdicts:%s",
		describe(append(h.verdicts.of(s.ID, events.TypeCompactionViolation), h.verdicts.of(s.ID, events.TypeSessionHalted)...))) {
		assert.Regexp(t, `(?i)forg[oe]t|no longer remember`, v.Data.Message, "the violation says the request id is forgotten")
	}
	for _, id := range []string{recent, last} {
		_, ok := h.verdicts.first(s.ID, events.TypeCompactionViolation, id)
		assert.False(t, ok, "a commit of one of the 256 most recent request ids is a violation")
	}
	assert.Empty(t, h.verdicts.of(s.ID, events.TypeSessionHalted), "hostile-b1 is halted")
	assert.Empty(t, h.verdicts.of(s.ID, events.TypeEventRejected), "hostile-b1 has rejections")
	h.checkSnapshot(s.ID)
	h.stop()
	h.done()
}

// hostileManyRanges is route 2: disjoint one-token truncations past the
// limit on ranges. The first over it is rejected with state_limit and the
// session halted at once (empty request_id, that truncation unrecoverable);
// its next request is refused as halted.
func hostileManyRanges(t *testing.T, hs *hostileSuite) {
	m := hs.plan.Ranges
	if hs.flags["max-ranges"] && hs.plan.MaxRanges > 0 {
		m = hs.plan.MaxRanges + 10
	}
	if m == 0 {
		t.Skipf("serve has no --max-ranges, and the route needs 524,300 truncations without it: run -hostile=full")
	}
	s := &workload.Script{ID: "hostile-b2"}
	s.Open("tokens", 4, "tokens")
	s.TurnAt(0, uint64(2*m+8))
	ranges := map[string]events.Range{}
	for i := range m {
		s.Truncate(uint64(2*i), uint64(2*i+1))
		ranges[lastID(s)] = events.Range{Start: uint64(2 * i), End: uint64(2*i + 1)}
	}
	s.Compact("b2-after", workload.R(0, s.Head), workload.R(0, s.Head-4), s.Head-4, false)
	t.Logf("%d disjoint truncations", m)

	h := hs.playMixed(t, s, 0.9, "b2-after", 10*time.Minute)

	rej, ok := h.verdicts.first(s.ID, events.TypeEventRejected, "")
	if assert.True(t, ok, "no truncation of hostile-b2 is rejected") {
		assert.Equal(t, "state_limit", rej.Data.Code, "%s", rej.Raw)
		want, isTrunc := ranges[rej.CausationID]
		assert.True(t, isTrunc, "the rejection answers a truncation: %s", rej.Raw)
		halted, ok := h.verdicts.first(s.ID, events.TypeSessionHalted, "")
		if assert.True(t, ok, "hostile-b2 is not halted") {
			assert.Equal(t, "", halted.Data.RequestID)
			assert.Equal(t, []events.Range{want}, halted.Data.Unrecoverable, "the halt names the offsets of the rejected truncation")
			assert.Regexp(t, `(?i)limit`, halted.Data.Message, "the halt names the limit")
		}
	}
	after, ok := h.verdicts.decided(s.ID, "b2-after")
	if assert.True(t, ok, "b2-after is not decided") && assert.Equal(t, events.TypeCompactionRefused, after.Type, "%s", after.Raw) &&
		assert.NotEmpty(t, after.Data.Reasons) {
		assert.Equal(t, events.ReasonSessionHalted, after.Data.Reasons[0].Code)
	}
	h.checkSnapshot(s.ID)
	h.stop()
	h.done()
}

// hostileHugeIDs is route 3: two requests whose ids are 600 kB each are
// rejected with too_large, and the session goes on.
func hostileHugeIDs(t *testing.T, hs *hostileSuite) {
	s := &workload.Script{ID: "hostile-b3"}
	s.Open("turns", 2, "turns")
	s.Turns(6, 1)
	var huge []string
	for k := range 2 {
		s.Compact(fmt.Sprintf("b3-%d-", k)+strings.Repeat("u", 600_000), workload.R(0, 6), workload.R(0, 4), 4, false)
		huge = append(huge, lastID(s))
	}
	s.Turns(4, 1)
	s.Compact("b3-after", workload.R(0, s.Head), workload.R(0, s.Head-2), s.Head-2, false)
	s.Commit("b3-after")

	h := hs.playMixed(t, s, 0.3, "b3-after", 3*time.Minute)

	for _, id := range huge {
		v, ok := h.verdicts.first(s.ID, events.TypeEventRejected, id)
		if assert.True(t, ok, "the request with a 600 kB id is not rejected; hostile-b3's verdicts:%s", describe(h.verdicts.of(s.ID, ""))) {
			assert.Equal(t, "too_large", v.Data.Code)
			assert.Equal(t, "data.request_id", v.Data.Field)
		}
	}
	v, ok := h.verdicts.decided(s.ID, "b3-after")
	if assert.True(t, ok, "b3-after is not decided") {
		assert.Equal(t, events.TypeCompactionAllowed, v.Type, "%s", v.Raw)
	}
	assert.Empty(t, h.verdicts.of(s.ID, events.TypeSessionHalted))
	h.checkSnapshot(s.ID)
	h.stop()
	h.done()
}

// hostileFullDisk runs serve with its data directory on a 64 MiB tmpfs
// and a session whose spill cannot fit: the spill hits storage exhaustion,
// and the session is halted (rule 5), while the other sessions are still
// decided, /readyz stays honest and SIGTERM returns. After a restart on the
// same storage, serve is ready and decides new sessions.
func hostileFullDisk(t *testing.T, hs *hostileSuite) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("full disk: cannot mount a 64 MiB tmpfs on %s (%v: %s); the case needs root on Linux", dir, err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	s := &workload.Script{ID: "hostile-c"}
	s.Open("turns", 4, "turns")
	s.PaddedTurns(hs.plan.DiskTurns, 256_000)
	turns := len(s.Items)
	s.Truncate(0, 8)
	s.Turns(4, 1)
	tail := s.Head - 4
	s.Compact("c1", workload.R(8, s.Head), workload.R(8, tail), tail, false)
	request := len(s.Items)
	s.Compact("c2", workload.R(8, s.Head), workload.R(8, tail), tail, false)

	h := hs.startHostile(t, dir, "spill-quota", strconv.Itoa(1<<30))
	h.sessions = []string{s.ID}
	clean := hs.clean.Items
	half, q3 := len(clean)/2, len(clean)*3/4
	// c1 goes last: its spill fills the disk until it fails, and a
	// publish that falls in that moment is refused for want of storage.
	phase1 := append(mix(clean[:half], 1, s.Items[:turns]), s.Items[turns:request-1]...)
	require.NoError(t, h.publish(append(phase1, clean[half:q3]...)))
	require.NoError(t, h.publish(s.Items[request-1:request]))
	published := time.Now()
	if h.await("hostile-c's halt", 3*time.Minute, func() bool { _, ok := h.verdicts.decided(s.ID, "c1"); return ok }) {
		t.Logf("c1 decided %s after it was published", time.Since(published).Round(100*time.Millisecond))
	}
	err := h.publish(append(append([]workload.Item(nil), clean[q3:]...), s.Items[request:]...))
	assert.NoError(t, err, "publishing the rest of the fleet after hostile-c's spill failed (are the failed spill's chunks still there?)")
	if err == nil {
		h.await("hostile-c's c2", time.Minute, func() bool { _, ok := h.verdicts.decided(s.ID, "c2"); return ok })
		h.awaitClean("clean")
	}
	h.checkClean("clean")

	v, ok := h.verdicts.decided(s.ID, "c1")
	if assert.True(t, ok, "c1 is not decided; hostile-c's verdicts:%s", describe(h.verdicts.of(s.ID, ""))) {
		assert.Equal(t, events.TypeSessionHalted, v.Type, "storage exhausted while spilling is rule 5: %s", v.Raw)
		t.Logf("c1: %.400s", v.Raw)
	}
	if v, ok := h.verdicts.decided(s.ID, "c2"); assert.True(t, ok, "c2 is not decided") && assert.Equal(t, events.TypeCompactionRefused, v.Type) &&
		assert.NotEmpty(t, v.Data.Reasons) {
		assert.Equal(t, events.ReasonSessionHalted, v.Data.Reasons[0].Code)
	}
	h.stop()

	// A restart on the full storage: ready only once it consumes, and it
	// decides new sessions.
	h.start()
	late := cleanFleet(20, "late")
	if assert.NoError(t, h.publish(late.Items), "publishing after a restart") {
		h.awaitClean("late")
		h.checkClean("late")
	}
	h.stop()
	h.done()
}

// hostileStuck: the session bucket's value limit is lowered under a
// running serve (an operator's mistake, a failure retrying cannot fix), and
// a session whose state outgrows it arrives with small sessions around it.
// That session is stuck: /readyz turns 503 naming it, the stuck metric and
// a log line name it, and the small sessions are all decided meanwhile.
// Once the limit is lifted, its redelivered inputs are applied, /readyz is
// 200 again, and its request is decided once.
func hostileStuck(t *testing.T, hs *hostileSuite) {
	const limit = 512
	s := &workload.Script{ID: "hostile-f"}
	s.Open("turns", 2, "turns")
	s.Turns(400, 1)
	for i := range uint64(190) { // under the case's --max-ranges
		s.Truncate(2*i, 2*i+1)
	}
	s.Compact("f1", workload.R(0, s.Head), workload.R(0, s.Head-2), s.Head-2, false)
	var small []workload.Item
	for i := range 40 {
		l := &workload.Script{ID: fmt.Sprintf("small-%03d", i)}
		l.Open("turns", 2, "turns")
		l.Turns(4, 1)
		l.Compact("s1", workload.R(0, 4), workload.R(0, 2), 2, false)
		small = append(small, l.Items...)
	}

	h := hs.startHostile(t, t.TempDir())
	h.sessions = []string{s.ID}
	require.NoError(t, h.publish(hs.clean.Items))
	h.awaitClean("clean")
	h.checkClean("clean")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	setLimit := func(n int32) {
		t.Helper()
		str, err := h.js.Stream(ctx, "KV_seamguard-sessions")
		require.NoError(t, err)
		cfg := str.CachedInfo().Config
		cfg.MaxMsgSize = n
		_, err = h.js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	setLimit(limit)
	require.NoError(t, h.publish(mix(small, 1, s.Items)))
	h.awaitClean("small")
	h.checkClean("small")
	stuck := waitStatus(h.health+"/readyz", http.StatusServiceUnavailable, 30*time.Second)
	if assert.True(t, stuck, "/readyz stays 200 while hostile-f's state cannot be stored") {
		_, body := getStatus(h.health + "/readyz")
		assert.Contains(t, body, "session hostile-f", "/readyz names the stuck session")
		assert.Contains(t, stuckMetrics(h.health+"/metrics"), `session="hostile-f"`, "the stuck metric names the session")
	}
	assert.Regexp(t, `"msg":"session stuck[^"]*","session":"hostile-f"`, h.p.String(), "a log line names the stuck session")

	setLimit(-1)
	assert.True(t, waitStatus(h.health+"/readyz", http.StatusOK, 30*time.Second), "/readyz is not 200 once the limit is lifted")
	if h.await("hostile-f's request", time.Minute, func() bool { _, ok := h.verdicts.decided(s.ID, "f1"); return ok }) {
		counts := map[string]int{}
		for _, v := range h.verdicts.of(s.ID, "") {
			counts[v.Type]++
		}
		for typ, n := range counts {
			assert.Equal(t, 1, n, "hostile-f's %s verdicts: each once", typ)
		}
	}
	h.stop()
	h.done()
}

// hostileAmplification: a session with a large transcript, then 20 rounds
// of (one turn, its truncation, a request). Every round is refused with an
// incremental spill chained to the one before, and the bytes spilled stay
// near the transcript's size instead of rounds times it.
func hostileAmplification(t *testing.T, hs *hostileSuite) {
	const rounds, pad = 20, 64_000
	s := &workload.Script{ID: "hostile-d"}
	s.Open("turns", 4, "turns")
	s.PaddedTurns(hs.plan.AmplifyTurns, pad)
	s.Truncate(0, 8)
	s.Turns(4, 1)
	s.Compact("d0", workload.R(8, s.Head), workload.R(8, s.Head-4), s.Head-4, false)
	heads := []uint64{s.Head}
	for r := range rounds {
		s.Turns(1, 1)
		s.Truncate(s.Head-1, s.Head)
		s.Compact(fmt.Sprintf("d%d", r+1), workload.R(8, s.Head), workload.R(8, s.Head-4), s.Head-4, false)
		heads = append(heads, s.Head)
	}
	transcript := 0
	for _, it := range s.Items {
		transcript += len(it.Line)
	}
	scripts := [][]workload.Item{s.Items}
	// With a per-session spill quota, a session whose first spill would
	// pass it is halted (rule 5).
	quota := transcript * 3 / 2
	q := &workload.Script{ID: "hostile-dq"}
	if hs.flags["spill-quota"] {
		q.Open("turns", 4, "turns")
		q.PaddedTurns(2*hs.plan.AmplifyTurns, pad)
		q.Truncate(0, 8)
		q.Turns(4, 1)
		q.Compact("q1", workload.R(8, q.Head), workload.R(8, q.Head-4), q.Head-4, false)
		scripts = append(scripts, q.Items)
	}

	h := hs.startHostile(t, t.TempDir(), "spill-quota", strconv.Itoa(quota))
	h.sessions = []string{s.ID, q.ID}
	require.NoError(t, h.publish(mix(hs.clean.Items, 0.6, scripts...)))
	last := fmt.Sprintf("d%d", rounds)
	h.await("hostile-d's last round", 5*time.Minute, func() bool { _, ok := h.verdicts.decided(s.ID, last); return ok })
	h.awaitClean("clean")
	h.checkClean("clean")

	spilled := h.verdicts.of(s.ID, events.TypeTranscriptSpilled)
	var total uint64
	for _, v := range spilled {
		total += v.Handle.Size
	}
	var first uint64
	if len(spilled) > 0 {
		first = spilled[0].Handle.Size
	}
	t.Logf("spill amplification: transcript %d bytes of events; %d spills wrote %d bytes in all (the first %d, %.2f times it); rewriting [0, head) each round would write about %d",
		transcript, len(spilled), total, first, float64(total)/float64(max(first, 1)), uint64(rounds+1)*first)
	assert.Len(t, spilled, rounds+1, "a spill for d0 and one for each round")
	assert.LessOrEqual(t, total, first+uint64(rounds)*64<<10, "the rounds' spills rewrote the transcript")
	var chain []string
	prev := ""
	for r := 0; r <= rounds; r++ {
		req := fmt.Sprintf("d%d", r)
		v, ok := h.verdicts.decided(s.ID, req)
		switch {
		case !ok:
			chain = append(chain, req+": not decided")
			continue
		case v.Type != events.TypeCompactionRefused || v.Data.Spill == nil:
			chain = append(chain, fmt.Sprintf("%s: not refused with a spill: %.300s", req, v.Raw))
			continue
		}
		hd := v.Data.Spill
		if want := (events.Range{Start: 0, End: heads[r]}); hd.Range != want {
			chain = append(chain, fmt.Sprintf("%s: the spill's range is %v, not [0, head) %v", req, hd.Range, want))
		}
		switch {
		case r == 0 && hd.Previous != nil:
			chain = append(chain, fmt.Sprintf("%s: the first spill names a previous one, %q", req, *hd.Previous))
		case r > 0 && hd.Previous == nil:
			chain = append(chain, fmt.Sprintf("%s: %s (%d bytes) names no previous spill", req, hd.Name, hd.Size))
		case r > 0 && *hd.Previous != prev:
			chain = append(chain, fmt.Sprintf("%s: %s names %q as previous, not %q", req, hd.Name, *hd.Previous, prev))
		}
		prev = hd.Name
	}
	assert.Empty(t, chain, "every round is refused with a spill chained to the one before")
	if hs.flags["spill-quota"] {
		v, ok := h.verdicts.decided(q.ID, "q1")
		if assert.True(t, ok, "q1 is not decided") {
			assert.Equal(t, events.TypeSessionHalted, v.Type, "a spill over the quota halts: %.400s", v.Raw)
		}
		assert.Empty(t, h.verdicts.of(q.ID, events.TypeTranscriptSpilled), "a spill over the quota was written")
	} else {
		t.Logf("serve has no --spill-quota: the quota is not checked")
	}
	h.stop()
	h.done()
}

// hostileKillMidSpill kills serve (SIGKILL) while it writes a large spill,
// restarts it on the same storage, and checks that the spill is completed
// and verifies, and that no chunk is left that belongs to no object once
// the sweep has run.
func hostileKillMidSpill(t *testing.T, hs *hostileSuite) {
	s := &workload.Script{ID: "hostile-e"}
	s.Open("turns", 4, "turns")
	s.PaddedTurns(hs.plan.KillTurns, 256_000)
	s.Truncate(0, 8)
	s.Turns(4, 1)
	s.Compact("e1", workload.R(8, s.Head), workload.R(8, s.Head-4), s.Head-4, false)

	// This case kills serve's process, not the power: its embedded server
	// syncs lazily, so that publishing the fleet ends well before the
	// spill it kills is half written (syncing every write slows the
	// publishing until the kill can fall in the middle of it).
	h := hs.startHostile(t, t.TempDir(), "spill-quota", strconv.Itoa(1<<30), "sync-interval", "2m")
	h.sessions = []string{s.ID}
	// Count the chunks as they are published, and kill serve from the
	// subscription once a fifth of the spill's chunks are out (no clean
	// spill has more than one).
	at := max(4, hs.plan.KillTurns*256_000/spill.DefaultChunkSize/5)
	var mu sync.Mutex
	chunks := map[string]int{}
	var most atomic.Int64
	var killed atomic.Bool
	nc := h.js.Conn()
	sub, err := nc.Subscribe("$O."+spillBucket+".C.>", func(m *nats.Msg) {
		mu.Lock()
		chunks[m.Subject]++
		n := chunks[m.Subject]
		mu.Unlock()
		most.Store(max(most.Load(), int64(n)))
		if n >= at && !killed.Swap(true) {
			h.p.mu.Lock()
			_ = h.p.cmd.Process.Signal(syscall.SIGKILL)
			h.p.mu.Unlock()
		}
	})
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, nc.Flush())
	// e1 goes last, once the fleet is in: the kill falls in its spill, not
	// in the publishing.
	e1 := len(s.Items) - 1
	require.NoError(t, h.publish(mix(hs.clean.Items, 0.5, s.Items[:e1])))
	require.NoError(t, h.publish(s.Items[e1:]))
	spilled := func() bool { return len(h.verdicts.of(s.ID, events.TypeTranscriptSpilled)) > 0 }
	begun := h.await("hostile-e's spill to be under way", 3*time.Minute, func() bool { return killed.Load() || spilled() })
	require.True(t, begun, "hostile-e's spill never began")
	require.False(t, spilled(), "hostile-e's spill finished before the harness could kill serve (%d chunks seen)", most.Load())
	h.kill()
	_ = sub.Unsubscribe()
	t.Logf("killed serve with %d chunks of hostile-e's spill published", most.Load())

	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if o, err := orphanChunks(ctx, h.js); assert.NoError(t, err) {
		t.Logf("after the restart: %d orphaned chunks (%v)", sumCounts(o), o)
	}
	h.await("hostile-e's refusal", 3*time.Minute, func() bool { _, ok := h.verdicts.decided(s.ID, "e1"); return ok })
	h.awaitClean("clean")
	h.checkClean("clean")

	v, ok := h.verdicts.decided(s.ID, "e1")
	if assert.True(t, ok, "e1 is not decided after the restart") && assert.Equal(t, events.TypeCompactionRefused, v.Type, "%.400s", v.Raw) &&
		assert.NotNil(t, v.Data.Spill, "e1 is refused without a spill") {
		store := &spill.Store{JS: h.js, Stream: "SEAMGUARD_EVENTS", Subjects: events.Subjects{Prefix: "seamguard", Partitions: processor.DefaultPartitions}, Bucket: spillBucket}
		digest, size, err := readSpill(ctx, store, v.Data.Spill.Name)
		if assert.NoError(t, err, "reading the spill back") {
			assert.Equal(t, v.Data.Spill.Digest, digest)
			assert.Equal(t, v.Data.Spill.Size, size)
			t.Logf("the spill completed after the restart: %s, %d bytes", v.Data.Spill.Name, size)
		}
	}
	var orphans map[string]uint64
	swept := false
	for deadline := time.Now().Add(hostileOrphanWait); !swept && time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		o, err := orphanChunks(ctx, h.js)
		orphans, swept = o, err == nil && len(o) == 0
	}
	assert.True(t, swept, "%d orphaned chunks in %d objects remain %s after the restart: %v", sumCounts(orphans), len(orphans), hostileOrphanWait, orphans)
	h.stop()
	h.done()
}

// orphanChunks lists the chunks in the spill bucket's stream, by object
// nuid, that no object's info names.
func orphanChunks(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	prefix := "$O." + spillBucket + ".C."
	s, err := js.Stream(ctx, "OBJ_"+spillBucket)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, err
	}
	obs, err := js.ObjectStore(ctx, spillBucket)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	infos, err := obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, err
	}
	for _, oi := range infos {
		live[oi.NUID] = true
		// A spill keeps the state its next spill starts from in chunks of
		// its own, named in its metadata.
		if st := oi.Metadata["seamguard-state-nuid"]; st != "" {
			live[st] = true
		}
	}
	orphans := map[string]uint64{}
	for subj, n := range info.State.Subjects {
		if id := strings.TrimPrefix(subj, prefix); !live[id] {
			orphans[id] = n
		}
	}
	return orphans, nil
}

func sumCounts(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
