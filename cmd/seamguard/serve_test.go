package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
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
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// fleet builds a workload from the shipped stories: copies of each, with
// session ids and event ids made unique per copy. Lines stay in story order
// and stories are interleaved line by line, as a fleet would publish.
func fleet(t *testing.T, copies int) []string {
	t.Helper()
	stories, err := filepath.Glob(filepath.Join(storiesDir, "*.jsonl"))
	require.NoError(t, err)
	var queues [][]string
	for c := range copies {
		for _, st := range stories {
			var q []string
			for _, l := range readLines(t, st) {
				q = append(q, renameLine(l, c))
			}
			queues = append(queues, q)
		}
	}
	var out []string
	for more := true; more; {
		more = false
		for i := range queues {
			if len(queues[i]) > 0 {
				out = append(out, queues[i][0])
				queues[i] = queues[i][1:]
				more = true
			}
		}
	}
	return out
}

// renameLine gives the sessions and ids of a story line a copy suffix; lines
// that are not JSON objects stay as they are.
func renameLine(line string, c int) string {
	var m map[string]any
	if json.Unmarshal([]byte(line), &m) != nil {
		return line
	}
	suffix := fmt.Sprintf("-c%d", c)
	if s, ok := m["subject"].(string); ok && events.ValidSessionID(s) {
		m["subject"] = s + suffix
	}
	if id, ok := m["id"].(string); ok {
		m["id"] = id + suffix
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// publishLines publishes each line in structured mode on the subject of its
// session (or of a fixed session when it has none), in order: a
// session.resumed on the control subject, everything else on the events one.
func publishLines(t *testing.T, js jetstream.JetStream, lines []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, l := range lines {
		var m struct {
			Subject any `json:"subject"`
			ID      any `json:"id"`
			Type    any `json:"type"`
		}
		_ = json.Unmarshal([]byte(l), &m)
		s, _ := m.Subject.(string)
		if !events.ValidSessionID(s) {
			s = "unnamed"
		}
		msg := nats.NewMsg("seamguard.events." + s)
		if m.Type == events.TypeSessionResumed {
			// A file's resumes are the operator's, as check reads them.
			msg.Subject = "seamguard.control." + s
		}
		msg.Data = []byte(l)
		var opts []jetstream.PublishOpt
		if id, ok := m.ID.(string); ok && id != "" {
			opts = append(opts, jetstream.WithMsgID(id))
		}
		_, err := js.PublishMsg(ctx, msg, opts...)
		require.NoError(t, err)
	}
}

// verdictBodies reads the whole verdict stream: the body of each verdict by
// id, normalised (time dropped, rejection headers dropped), and how many
// messages carried each id.
func verdictBodies(t *testing.T, js jetstream.JetStream) (map[string]string, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := js.Stream(ctx, "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	bodies, counts := map[string]string{}, map[string]int{}
	if info.State.Msgs == 0 {
		return bodies, counts
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for n := uint64(0); n < info.State.Msgs; n++ {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		id, body := normalise(t, m.Data())
		bodies[id] = body
		counts[id]++
	}
	return bodies, counts
}

// normalise drops what legitimately differs between an offline and a served
// decision: the time attribute, and where a rejection says its input came
// from (a line offline, a NATS subject with headers served). Rejections
// are keyed by their input's sequence: the id of one whose input could not
// be decoded derives from where it came from (its causationid, the input's
// id where it could be read, does not).
func normalise(t *testing.T, b []byte) (key, body string) {
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	delete(m, "time")
	key = m["id"].(string)
	if d, ok := m["data"].(map[string]any); ok {
		if in, ok := d["input"].(map[string]any); ok {
			delete(in, "headers")
			delete(in, "subject")
			key = fmt.Sprintf("rejected@%v", in["stream_seq"])
			delete(m, "id")
			delete(m, "subject")
		}
	}
	out, _ := json.Marshal(m)
	return key, string(out)
}

// offlineVerdicts decides the same lines with `check` and normalises them.
func offlineVerdicts(t *testing.T, lines []string) map[string]string {
	t.Helper()
	code, stdout, stderr := runCLI(t, strings.Join(lines, "\n")+"\n", "check", "--spill-dir", t.TempDir(), "--source", "urn:seamguard:test")
	require.Equal(t, 0, code, stderr)
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		id, body := normalise(t, []byte(l))
		out[id] = body
	}
	return out
}

// buildBinary builds the seamguard command once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "seamguard")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// TestServeKilledAndRestarted runs `seamguard serve` as a separate process
// against a NATS server, kills it with SIGKILL while it works through a fleet
// of sessions, starts it again, and checks the verdict stream against the
// offline decision of the same events: every verdict there, none twice, all
// identical.
func TestServeKilledAndRestarted(t *testing.T) {
	longtest.Skip(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	srv := embedded.StartTest(t)
	lines := fleet(t, 12)
	require.GreaterOrEqual(t, len(lines), 2000)
	want := offlineVerdicts(t, lines)

	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "serve", "--nats-url", srv.Server.ClientURL(), "--source", "urn:seamguard:test", "--shards", "4", "--ack-wait", "2s", "--lease-ttl", "2s", "--log-level", "warn")
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			if t.Failed() {
				t.Logf("serve output:\n%s", logs.String())
			}
		})
		return cmd
	}
	first := start()
	// Publishing and processing overlap; kill once a fair share is decided.
	go publishLines(t, srv.JS, lines)
	verdicts := func() uint64 {
		s, err := srv.JS.Stream(context.Background(), "SEAMGUARD_VERDICTS")
		if err != nil {
			return 0
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return 0
		}
		return info.State.Msgs
	}
	require.Eventually(t, func() bool { return verdicts() >= uint64(len(want))/3 }, time.Minute, 20*time.Millisecond)
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	killedAt := verdicts()

	second := start()
	require.Eventually(t, func() bool { return verdicts() >= uint64(len(want)) }, 2*time.Minute, 50*time.Millisecond,
		"killed after %d verdicts; the restarted processor should reach %d", killedAt, len(want))
	// Let anything extra (a duplicate) surface before counting.
	time.Sleep(500 * time.Millisecond)
	got, counts := verdictBodies(t, srv.JS)
	for id, n := range counts {
		assert.Equal(t, 1, n, "verdict %s appears %d times", id, n)
	}
	var diffs []string
	for id, body := range want {
		if got[id] != body {
			diffs = append(diffs, fmt.Sprintf("%s:\n  offline: %s\n  served:  %s", id, body, got[id]))
		}
	}
	for id, body := range got {
		if _, ok := want[id]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: served only: %s", id, body))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 3 {
		diffs = append(diffs[:3], fmt.Sprintf("... and %d more", len(diffs)-3))
	}
	assert.Len(t, got, len(want))
	assert.Empty(t, diffs, "served verdicts differ from the offline decision")
	t.Logf("%d events, %d verdicts; killed after %d verdicts and restarted", len(lines), len(want), killedAt)
	require.NoError(t, second.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.Wait(), "serve exits 0 on SIGTERM after draining")
}

// TestOperatorCommands drives serve, watch, spill get and resume in-process
// against one server.
func TestOperatorCommands(t *testing.T) {
	srv := embedded.StartTest(t)
	url := srv.Server.ClientURL()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveOut, serveErr lockedBuffer
	go func() {
		served <- run(ctx, []string{"serve", "--nats-url", url, "--log-level", "warn"}, strings.NewReader(""), &serveOut, &serveErr)
	}()
	seedLines := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	gapLines := readLines(t, filepath.Join(storiesDir, "gap-then-resume.jsonl"))
	publishLines(t, srv.JS, seedLines)
	// The gap story up to its halt and the refused retry (k1, k2), no resume yet.
	publishLines(t, srv.JS, gapLines[:6])

	code, out, stderr := runCLI(t, "", "watch", "--nats-url", url, "--all", "--session", "ops-agent-42", "--max", "3")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Contains(t, lines[0], "spilled")
	assert.Contains(t, lines[1], "refused")
	assert.Contains(t, lines[1], "coverage_hole [0, 8)")
	assert.Contains(t, lines[2], "allowed")
	assert.Contains(t, lines[2], "cured [coverage_hole] by ops-agent-42/1.jsonl")

	file := filepath.Join(t.TempDir(), "t.jsonl")
	code, _, stderr = runCLI(t, "", "spill", "get", "ops-agent-42/1.jsonl", "--nats-url", url, "-o", file)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "verified ops-agent-42/1.jsonl")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, 55, bytes.Count(b, []byte("\n")))
	assert.Contains(t, string(b), "Do not touch anything under /etc.")

	code, _, stderr = runCLI(t, "", "spill", "get", "nope/1.jsonl", "--nats-url", url)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `no spill "nope/1.jsonl"`)

	code, _, stderr = runCLI(t, "", "resume", "gap-then-resume", "--nats-url", url)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--note is required")

	code, out, stderr = runCLI(t, "", "resume", "gap-then-resume", "--nats-url", url, "--note", "chunk lost upstream; accepted (OPS-311)")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "published session.resumed")
	// A retry after the resume is allowed, with the gap cured by the waiver.
	publishLines(t, srv.JS, []string{strings.Replace(gapLines[8], `"k3"`, `"k9"`, 1)})
	code, out, stderr = runCLI(t, "", "watch", "--nats-url", url, "--all", "--session", "gap-then-resume", "--kind", "allowed", "--max", "1")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "k9")
	assert.Contains(t, out, "cured [sequence_gap]")

	cancel()
	select {
	case code := <-served:
		assert.Equal(t, 0, code, serveErr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context was cancelled")
	}
	assert.Contains(t, serveOut.String(), "seamguard serving on "+url)
}

func TestServeUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--policy", "maybe"}, "--policy"},
		{[]string{"serve", "--listen", "nowhere"}, "--listen"},
		{[]string{"serve", "--tlscert", "x"}, "--tlscert and --tlskey"},
		{[]string{"serve", "--shards", "-1"}, `invalid value "-1" for flag -shards: out of range; use 1 to 1024`},
		{[]string{"serve", "--events-max-age", "soon"}, "events-max-age"},
		{[]string{"serve", "extra"}, "no arguments"},
		{[]string{"watch", "--kind", "odd"}, "--kind"},
		{[]string{"spill"}, "spill get NAME"},
		{[]string{"resume", "bad.id", "--note", "x"}, "not a session id"},
	} {
		code, _, stderr := runCLI(t, "", tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	t.Setenv("SEAMGUARD_SHARDS", "many")
	code, _, stderr := runCLI(t, "", "serve")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "SEAMGUARD_SHARDS")
}

// TestServeHealth checks /healthz and /readyz of a running serve.
func TestServeHealth(t *testing.T) {
	srv := embedded.StartTest(t)
	url, _, stop := serveWithHealth(t, srv.Server.ClientURL())
	get := func(path string) int {
		resp, err := http.Get(url + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return get("/readyz") == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, http.StatusOK, get("/healthz"))
	assert.Equal(t, http.StatusMethodNotAllowed, func() int {
		resp, err := http.Post(url+"/healthz", "text/plain", nil)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}())
	// With NATS gone, neither is healthy.
	srv.Server.Shutdown()
	require.Eventually(t, func() bool {
		return get("/healthz") == http.StatusServiceUnavailable && get("/readyz") == http.StatusServiceUnavailable
	},
		10*time.Second, 20*time.Millisecond)
	stop()
}

// TestServeReadyzMissingStore deletes the spill object store's stream
// under a running serve: /readyz answers 503 naming the store and what to
// do, seamguard_store_missing says which stream, one error is logged; once
// the store is created again (as serve's start does), /readyz is 200 again.
func TestServeReadyzMissingStore(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx := context.Background()
	url, errb, stop := serveWithHealth(t, srv.Server.ClientURL())
	get := func(path string) (int, string) {
		resp, err := http.Get(url + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)

	const stream = "OBJ_seamguard-spills"
	require.NoError(t, srv.JS.DeleteStream(ctx, stream))
	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "spill object store seamguard-spills")
	}, 10*time.Second, 20*time.Millisecond, "/readyz does not name the missing store")
	assert.Contains(t, body, "restart seamguard serve")
	_, m := get("/metrics")
	assert.Contains(t, m, `seamguard_store_missing{stream="`+stream+`"} 1`)

	_, err := processor.Provision(ctx, srv.JS, processor.Config{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	_, m = get("/metrics")
	assert.Contains(t, m, `seamguard_store_missing{stream="`+stream+`"} 0`)
	assert.Equal(t, 1, strings.Count(errb.String(), `"msg":"store missing`), "one error logged for the store going missing:\n%s", errb.String())
	stop()
}

// serveWithHealth runs serve against natsURL with --health-listen on a
// free loopback port and JSON logs, and returns the health base URL, its
// log, and the function that stops it and waits (30s at most).
func serveWithHealth(t *testing.T, natsURL string) (string, *lockedBuffer, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var out lockedBuffer
	errb := &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--nats-url", natsURL, "--health-listen", "127.0.0.1:0", "--log-format", "json"}, strings.NewReader(""), &out, errb)
	}()
	url := healthBase(t, errb)
	return url, errb, func() {
		t.Helper()
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop")
		}
	}
}

// lockedBuffer is a bytes.Buffer that a command may write while a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// healthBase waits for serve's JSON log line that names its health
// endpoints and returns their base URL (http://HOST:PORT).
func healthBase(t *testing.T, log *lockedBuffer) string {
	t.Helper()
	var base string
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "health endpoints" {
				base = strings.TrimSuffix(m["url"].(string), "/healthz")
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	return base
}
