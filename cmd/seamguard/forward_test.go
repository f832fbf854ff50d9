package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/forward"
	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// ceReceiver records the CloudEvents POSTed to it (decoded with sdk-go)
// and answers 400 to the types in reject.
type ceReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	types  []string // of the events answered 2xx
	reject map[string]bool
}

func newCEReceiver(t *testing.T, reject ...string) *ceReceiver {
	r := &ceReceiver{reject: map[string]bool{}}
	for _, ty := range reject {
		r.reject[ty] = true
	}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		ev, err := binding.ToEvent(req.Context(), cehttp.NewMessageFromHttpRequest(req))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.reject[ev.Type()] {
			http.Error(w, "not today", http.StatusBadRequest)
			return
		}
		r.types = append(r.types, ev.Type())
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *ceReceiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.types...)
}

// TestForwardCommand runs seamguard forward against a real processor
// playing the seed story: the refusal and the allowed retry arrive, the
// spill's verdict, which the receiver refuses with 400, is kept, counted
// on /metrics, listed by forward failed, and forward retry delivers it
// once the receiver takes it.
func TestForwardCommand(t *testing.T) {
	d := startDeployment(t)
	r := newCEReceiver(t, events.TypeTranscriptSpilled)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"forward", "--nats-url", d.url, "--to", r.URL, "--trust-key", d.key.PublicKey(),
			"--kinds", "refused,allowed,spilled", "--session", "ops-agent-42", "--name", "test-fwd",
			"--health-listen", "127.0.0.1:0", "--log-format", "json", "--min-backoff", "10ms"}, strings.NewReader(""), &out, &errs)
	}()
	stopped := false
	stop := func() int {
		if stopped {
			return 0
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(30 * time.Second):
			t.Error("forward did not stop")
			return -1
		}
	}
	t.Cleanup(func() { stop() })
	base := healthBase(t, &errs)
	d.publish(t, readLines(t, filepath.Join(storiesDir, "seed-story.jsonl")))
	require.Eventually(t, func() bool { return len(r.got()) == 2 }, 20*time.Second, 20*time.Millisecond, errs.String())
	assert.Equal(t, []string{events.TypeCompactionRefused, events.TypeCompactionAllowed}, r.got())
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `seamguard_forward_undeliverable_total{reason="rejected"} 1`) &&
			strings.Contains(string(b), "seamguard_forward_delivered_total 2")
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 0, stop(), errs.String())
	assert.Contains(t, errs.String(), "verdict not delivered: kept as undeliverable")

	code, stdout, stderr := runCLI(t, "", "forward", "failed", "--nats-url", d.url, "--json")
	require.Equal(t, 0, code, stderr)
	var recs []forward.Record
	require.NoError(t, json.Unmarshal([]byte(stdout), &recs))
	require.Len(t, recs, 1)
	assert.Equal(t, "test-fwd", recs[0].Name)
	assert.Equal(t, events.KindSpilled, recs[0].Kind)
	assert.Equal(t, "ops-agent-42", recs[0].Session)
	assert.Equal(t, forward.ReasonRejected, recs[0].Reason)
	assert.Equal(t, 400, recs[0].Status)

	code, stdout, stderr = runCLI(t, "", "forward", "failed", "--nats-url", d.url)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "test-fwd ops-agent-42 spilled")
	assert.Contains(t, stdout, "rejected (status 400, 1 attempt(s))")

	// Still refused: it stays, and retry says so.
	code, stdout, stderr = runCLI(t, "", "forward", "retry", "--nats-url", d.url, "--all", "--trust-key", d.key.PublicKey())
	assert.Equal(t, 1, code, stdout+stderr)
	assert.Contains(t, stdout, "still undeliverable, kept")

	r.mu.Lock()
	r.reject = map[string]bool{}
	r.mu.Unlock()
	code, stdout, stderr = runCLI(t, "", "forward", "retry", "--nats-url", d.url, "--trust-key", d.key.PublicKey(), "1")
	require.Equal(t, 0, code, stdout+stderr)
	assert.Contains(t, stdout, "delivered")
	assert.Equal(t, []string{events.TypeCompactionRefused, events.TypeCompactionAllowed, events.TypeTranscriptSpilled}, r.got())
	code, stdout, stderr = runCLI(t, "", "forward", "failed", "--nats-url", d.url, "--json")
	require.Equal(t, 0, code, stderr)
	assert.JSONEq(t, "[]", stdout)
}

// TestForwardUsage: the command's usage errors, before it connects.
func TestForwardUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"forward"}, "--to URL is required"},
		{[]string{"forward", "--to", "ftp://x"}, "is not an http or https URL"},
		{[]string{"forward", "--to", "http://x", "--kinds", "refused,nope"}, `kind "nope"`},
		{[]string{"forward", "--to", "http://x", "--from", "yesterday"}, `from "yesterday"`},
		{[]string{"forward", "--to", "http://x", "--header", "no-colon"}, "use NAME: VALUE"},
		{[]string{"forward", "retry"}, "give the sequences to retry, or --all"},
		{[]string{"forward", "retry", "x"}, "is not a sequence"},
		{[]string{"forward", "failed", "x"}, "takes no arguments"},
	} {
		code, _, errs := runCLI(t, "", tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, errs)
		assert.Contains(t, errs, tc.want, "%v", tc.args)
	}
}

// TestForwardPythonReceiver runs examples/python/receiver.py and delivers
// the seed story's verdicts to it with seamguard forward: what it prints
// names each verdict's kind, session and reasons, in order, with the
// processor's signing key.
func TestForwardPythonReceiver(t *testing.T) {
	longtest.Skip(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	d := startDeployment(t)
	cmd := exec.Command(py, "../../examples/python/receiver.py", "--port", "0")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var pyErr lockedBuffer
	cmd.Stderr = &pyErr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	var url string
	select {
	case l := <-lines:
		url = strings.TrimPrefix(l, "listening on ")
		require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), l)
	case <-time.After(10 * time.Second):
		t.Fatalf("receiver.py did not start: %s", pyErr.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	var errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"forward", "--nats-url", d.url, "--to", url, "--trust-key", d.key.PublicKey()}, strings.NewReader(""), io.Discard, &errs)
	}()
	defer func() {
		cancel()
		assert.Equal(t, 0, <-done, errs.String())
	}()
	require.Eventually(t, func() bool { return strings.Contains(errs.String(), "forwarding verdicts") }, 10*time.Second, 10*time.Millisecond, errs.String())
	d.publish(t, readLines(t, filepath.Join(storiesDir, "seed-story.jsonl")))

	var got []string
	timeout := time.After(20 * time.Second)
	for len(got) < 3 {
		select {
		case l := <-lines:
			got = append(got, l)
		case <-timeout:
			t.Fatalf("receiver.py printed %q; stderr %s; forward %s", got, pyErr.String(), errs.String())
		}
	}
	key := " signer=" + d.key.PublicKey()
	assert.Regexp(t, `^spilled ops-agent-42 spill=ops-agent-42/1\.jsonl id=sg-\S+ seq=1`+key+`$`, got[0])
	assert.Regexp(t, `^refused ops-agent-42 request=compact-1 reasons=coverage_hole spill=ops-agent-42/1\.jsonl next=retry id=sg-\S+ seq=2`+key+`$`, got[1])
	assert.Regexp(t, `^allowed ops-agent-42 request=compact-1 cured=\S+ id=sg-\S+ seq=3`+key+`$`, got[2])
}

// TestForwardEnv: --to may come from SEAMGUARD_TO, like every flag.
func TestForwardEnv(t *testing.T) {
	t.Setenv("SEAMGUARD_TO", "ftp://from-env")
	code, _, errs := runCLI(t, "", "forward")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, `"ftp://from-env" is not an http or https URL`)
}

// TestForwardShippedIdentity runs forward, forward failed and forward
// retry through the CLI as the shipped forwarder identity of
// deploy/nats/standalone.conf, against verdicts the shipped processor
// identity published: no permissions violation, and the verdict the
// receiver refused is kept, listed and delivered again. As the operator,
// forward stops at once, saying the forwarder identity may.
func TestForwardShippedIdentity(t *testing.T) {
	url := startShipped(t)
	proc := connectAs(t, url, "processor", processorInbox)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := processor.Provision(ctx, proc.js, processor.Config{})
	require.NoError(t, err)
	key, err := attest.Generate()
	require.NoError(t, err)
	for _, kind := range []string{events.TypeCompactionRefused, events.TypeTranscriptSpilled} {
		var data any = &events.CompactionRefused{RequestID: "r1", Next: events.NextRetry}
		if kind == events.TypeTranscriptSpilled {
			data = &events.SpillHandle{Name: "s1/1.jsonl"}
		}
		id, subject, body, err := events.Encoder{}.Encode(events.Output{Type: kind, Session: "s1", Cause: events.Cause{ID: "in-" + kind}, Data: data})
		require.NoError(t, err)
		m := nats.NewMsg(subject)
		m.Data = body
		key.SignMsg(m.Header, body)
		_, err = proc.js.PublishMsg(ctx, m, jetstream.WithMsgID(id))
		require.NoError(t, err)
	}
	require.Empty(t, proc.refused(t))

	r := newCEReceiver(t, events.TypeTranscriptSpilled)
	t.Setenv("SEAMGUARD_PASSWORD", shippedPasswords["forwarder"])
	fctx, fcancel := context.WithCancel(context.Background())
	var errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(fctx, []string{"forward", "--nats-url", url, "--user", "forwarder", "--to", r.URL, "--from", "start",
			"--trust-key", key.PublicKey(), "--health-listen", "127.0.0.1:0", "--log-format", "json"}, strings.NewReader(""), io.Discard, &errs)
	}()
	base := healthBase(t, &errs)
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), `seamguard_forward_undeliverable_total{reason="rejected"} 1`)
	}, 20*time.Second, 20*time.Millisecond, errs.String())
	fcancel()
	assert.Equal(t, 0, <-done, errs.String())
	assert.Equal(t, []string{events.TypeCompactionRefused}, r.got())
	assert.NotContains(t, errs.String(), "permission")

	code, stdout, stderr, _ := cliRun(t, "forward", "failed", "--nats-url", url, "--user", "forwarder")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "s1 spilled")
	r.mu.Lock()
	r.reject = map[string]bool{}
	r.mu.Unlock()
	code, stdout, stderr, _ = cliRun(t, "forward", "retry", "--all", "--nats-url", url, "--user", "forwarder", "--trust-key", key.PublicKey())
	require.Equal(t, 0, code, stdout+stderr)
	assert.Equal(t, []string{events.TypeCompactionRefused, events.TypeTranscriptSpilled}, r.got())
	assert.NotContains(t, stderr, "permission")

	t.Setenv("SEAMGUARD_PASSWORD", shippedPasswords["operator"])
	code, _, stderr, took := cliRun(t, "forward", "--nats-url", url, "--user", "operator", "--inbox-prefix", operatorInbox, "--to", r.URL)
	assert.Equal(t, 1, code)
	assert.Less(t, took, 10*time.Second, "refused at once")
	assert.Contains(t, stderr, "permission denied")
	assert.Contains(t, stderr, "the shipped forwarder identity")
}
