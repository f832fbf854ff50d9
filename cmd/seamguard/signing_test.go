package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
)

var signingKeyLog = regexp.MustCompile(`signing_key=(N[A-Z2-7]{55})`)

// serveOnce runs serve on url with dataDir until stop is called, and
// returns the signing key it logged.
func serveOnce(t *testing.T, url, dataDir string, extra ...string) (key string, logs *lockedBuffer, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var out, errs lockedBuffer
	go func() {
		served <- run(ctx, append([]string{"serve", "--nats-url", url, "--data-dir", dataDir, "--source", "urn:seamguard:test", "--log-level", "info"}, extra...),
			strings.NewReader(""), &out, &errs)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-served:
			assert.Equal(t, 0, code, errs.String())
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop after its context was cancelled")
		}
	}
	t.Cleanup(stop)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "seamguard serving on") }, 30*time.Second, 10*time.Millisecond, errs.String())
	m := signingKeyLog.FindStringSubmatch(errs.String())
	require.NotNil(t, m, "serve logs its signing key:\n%s", errs.String())
	return m[1], &errs, stop
}

// TestAttributableVerdicts: serve makes a signing key at first start in
// its data directory (mode 0600) and keeps it across restarts; its
// verdicts verify against it; messages published straight on a verdict
// subject (unsigned, signed by another key, a genuine verdict changed, a
// genuine verdict of another session) are reported by watch, inspect and
// replay, and left out of what they show as decided.
func TestAttributableVerdicts(t *testing.T) {
	srv := embedded.StartTest(t)
	url := srv.Server.ClientURL()
	dataDir := filepath.Join(t.TempDir(), "data")
	key, logs, stop := serveOnce(t, url, dataDir)
	assert.Contains(t, logs.String(), "made a signing key")
	st, err := os.Stat(filepath.Join(dataDir, attest.KeyFileName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	publishLines(t, srv.JS, readLines(t, filepath.Join(storiesDir, "healthy-chain.jsonl")))
	publishLines(t, srv.JS, readLines(t, filepath.Join(storiesDir, "seed-story.jsonl")))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Wait for both sessions' last verdicts.
	var genuine, elsewhere rawMsg
	vs, err := srv.JS.Stream(ctx, "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		a, err1 := vs.GetLastMsgForSubject(ctx, "seamguard.verdicts.healthy-chain.allowed")
		b, err2 := vs.GetLastMsgForSubject(ctx, "seamguard.verdicts.ops-agent-42.allowed")
		if err1 != nil || err2 != nil {
			return false
		}
		genuine, elsewhere = rawMsg{a}, rawMsg{b}
		return strings.Contains(string(a.Data), `"request_id":"c2"`)
	}, time.Minute, 20*time.Millisecond, "the processor did not decide the stories")
	stop()

	// Genuine verdicts verify against the key serve logged, and no other.
	ver, err := attest.NewVerifier(events.Subjects{}, key)
	require.NoError(t, err)
	_, err = ver.Verify(genuine.Subject(), genuine.Headers(), genuine.Data())
	require.NoError(t, err)

	// The forgeries, on healthy-chain's allowed subject, through the
	// verdict stream.
	other, err := attest.Generate()
	require.NoError(t, err)
	subject := "seamguard.verdicts.healthy-chain.allowed"
	forge := func(body []byte, h nats.Header) {
		m := &nats.Msg{Subject: subject, Data: body, Header: h}
		_, err := srv.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	changed := []byte(strings.Replace(string(genuine.Data()), `"request_id":"c2"`, `"request_id":"c3"`, 1))
	forge(changed, nats.Header{})
	h := nats.Header{}
	other.SignMsg(h, changed)
	forge(changed, h)
	forge(changed, signatureOf(genuine))
	forge(elsewhere.Data(), signatureOf(elsewhere))
	reasons := []string{attest.ReasonUnsigned, attest.ReasonUntrusted, attest.ReasonBadSignature, attest.ReasonMisrouted}

	// A restart reuses the key.
	again, logs, stop := serveOnce(t, url, dataDir)
	assert.Equal(t, key, again, "the key kept in the data directory")
	assert.NotContains(t, logs.String(), "made a signing key")
	stop()

	// watch: every verdict of the session, the four forgeries flagged.
	info, err := vs.Info(ctx, jetstream.WithSubjectFilter("seamguard.verdicts.healthy-chain.>"))
	require.NoError(t, err)
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	require.Greater(t, n, 4)
	code, out, stderr := runCLI(t, "", "watch", "--nats-url", url, "--session", "healthy-chain", "--all", "--max", strconv.Itoa(n), "--trust-key", key)
	assert.Equal(t, 1, code, "watch exits 1 after unattributed messages:\n%s%s", out, stderr)
	assert.Contains(t, stderr, "4 message(s) on verdict subjects failed verification")
	assert.Equal(t, 4, strings.Count(out, "UNATTRIBUTED "+subject))
	for _, r := range reasons {
		assert.Contains(t, out, "attest: "+r+": ", "watch names reason %s", r)
	}
	assert.Regexp(t, `claims: \S+ healthy-chain +allowed +c3:`, out)
	code, out, stderr = runCLI(t, "", "watch", "--nats-url", url, "--session", "healthy-chain", "--all", "--max", strconv.Itoa(n), "--trust-key", key, "--json")
	assert.Equal(t, 1, code, stderr)
	assert.NotContains(t, out, `"request_id":"c3"`, "with --json, standard output holds only attributed verdicts")
	assert.Equal(t, 4, strings.Count(stderr, "UNATTRIBUTED "+subject))
	code, out, stderr = runCLI(t, "", "watch", "--nats-url", url, "--session", "healthy-chain", "--all", "--max", strconv.Itoa(n))
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "no trusted key")
	assert.Equal(t, 3, strings.Count(out, "UNATTRIBUTED "+subject), "without trusted keys, another key's signature passes:\n%s", out)

	// inspect: the history leaves them out and lists them.
	code, out, stderr = runCLI(t, "", "inspect", "healthy-chain", "--nats-url", url, "--trust-key", key)
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "4 message(s) on the verdict subjects of session healthy-chain failed verification")
	assert.Contains(t, out, "UNATTRIBUTED: 4 message(s)")
	assert.NotContains(t, out, " c3 ", "no forgery in the decisions")
	for _, r := range reasons {
		assert.Contains(t, out, " "+r+" on "+subject, "inspect names reason %s", r)
	}
	code, js, stderr := runCLI(t, "", "inspect", "healthy-chain", "--nats-url", url, "--trust-key", key, "--json")
	assert.Equal(t, 1, code, stderr)
	var model struct {
		History      []struct{ ID string }
		Unattributed []struct{ Reason, Subject, Session string }
	}
	require.NoError(t, json.Unmarshal([]byte(js), &model))
	require.Len(t, model.Unattributed, 4)
	for i, u := range model.Unattributed {
		assert.Equal(t, reasons[i], u.Reason)
	}
	assert.Equal(t, "ops-agent-42", model.Unattributed[3].Session, "the copied verdict claims its own session")
	code, _, stderr = runCLI(t, "", "inspect", "ops-agent-42", "--nats-url", url, "--trust-key", key)
	assert.Equal(t, 0, code, "the copy's own session is untouched: %s", stderr)

	// replay: each is an unattributed difference, and nothing else differs.
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", url, "--trust-key", key)
	assert.Equal(t, 1, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Contains(t, lines[len(lines)-1], "4 difference(s): 4 unattributed")

	// Bad trusted keys are usage errors.
	code, _, stderr = runCLI(t, "", "watch", "--nats-url", url, "--trust-key", "NOTAKEY")
	assert.Equal(t, 2, code, stderr)
	assert.Contains(t, stderr, "trusted key")
}

// TestSigningKeySources: --signing-key-file, SEAMGUARD_SIGNING_KEY, both
// (refused), a bad seed (refused, not echoed), and the data directory.
func TestSigningKeySources(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := attest.Generate()
	require.NoError(t, err)
	b, err := attest.Generate()
	require.NoError(t, err)
	dir := t.TempDir()
	file := filepath.Join(dir, "a.nk")
	require.NoError(t, os.WriteFile(file, append(a.Seed(), '\n'), 0o600))
	t.Setenv(signingKeyEnv, "")

	seed, err := signingKey(file, filepath.Join(dir, "data"), log)
	require.NoError(t, err)
	assert.Equal(t, string(a.Seed()), seed)
	_, err = os.Stat(filepath.Join(dir, "data", attest.KeyFileName))
	assert.ErrorIs(t, err, os.ErrNotExist, "a key given is not written to the data directory")

	t.Setenv(signingKeyEnv, string(b.Seed()))
	seed, err = signingKey("", filepath.Join(dir, "data"), log)
	require.NoError(t, err)
	assert.Equal(t, string(b.Seed()), seed)
	_, err = signingKey(file, filepath.Join(dir, "data"), log)
	assert.ErrorIs(t, err, errUsage)

	t.Setenv(signingKeyEnv, "SNOTASEEDATALL")
	_, err = signingKey("", filepath.Join(dir, "data"), log)
	require.ErrorIs(t, err, errUsage)
	assert.Contains(t, err.Error(), signingKeyEnv)

	t.Setenv(signingKeyEnv, "")
	first, err := signingKey("", filepath.Join(dir, "data"), log)
	require.NoError(t, err)
	second, err := signingKey("", filepath.Join(dir, "data"), log)
	require.NoError(t, err)
	assert.Equal(t, first, second)
	_, err = signingKey(filepath.Join(dir, "missing.nk"), filepath.Join(dir, "data"), log)
	assert.ErrorContains(t, err, "--signing-key-file")
}

// rawMsg makes a stored message look like a consumed one.
type rawMsg struct{ m *jetstream.RawStreamMsg }

func (r rawMsg) Subject() string      { return r.m.Subject }
func (r rawMsg) Headers() nats.Header { return r.m.Header }
func (r rawMsg) Data() []byte         { return r.m.Data }

func signatureOf(m rawMsg) nats.Header {
	return nats.Header{attest.HeaderSigner: {m.Headers().Get(attest.HeaderSigner)}, attest.HeaderSignature: {m.Headers().Get(attest.HeaderSignature)}}
}
