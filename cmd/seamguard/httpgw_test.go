package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/gateway"
)

// httpBase waits for serve's JSON log line that names its HTTP gateway and
// returns its base URL (http://HOST:PORT).
func httpBase(t *testing.T, log *lockedBuffer) string {
	t.Helper()
	var base string
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "HTTP gateway" {
				base = strings.TrimSuffix(m["url"].(string), "/v1/events")
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "%s", log)
	return base
}

func httpPost(t *testing.T, url, token, contentType, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, res.Header, string(b)
}

// TestServeHTTPShippedIdentities runs serve with the HTTP gateway against
// a real server loaded with the shipped identities: the gateway publishes
// events as the agent identity and a resume as the operator identity, with
// no permissions violation; an agent token reaches its sessions only; a
// ?wait= request gets its verdict; SIGHUP reloads the token file and
// revokes the token taken out of it.
func TestServeHTTPShippedIdentities(t *testing.T) {
	url := startShipped(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	agentLine := gateway.HashToken("agent-tok") + " agent gw-*"
	opLine := gateway.HashToken("op-tok") + " operator"
	require.NoError(t, os.WriteFile(tokens, []byte(agentLine+"\n"+opLine+"\n"), 0o600))

	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveOut, serveErr lockedBuffer
	go func() {
		served <- run(ctx, []string{"serve", "--nats-url", url, "--user", "processor", "--password", shippedPasswords["processor"],
			"--responder-user", "responder", "--responder-password", shippedPasswords["responder"],
			"--http-listen", "127.0.0.1:0", "--http-tokens", tokens,
			"--http-agent-user", "agent", "--http-agent-password", shippedPasswords["agent"],
			"--http-operator-user", "operator", "--http-operator-password", shippedPasswords["operator"],
			"--partitions", "1", "--log-format", "json"},
			strings.NewReader(""), &serveOut, &serveErr)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case code := <-served:
				assert.Equal(t, 0, code, serveErr.String())
			case <-time.After(30 * time.Second):
				t.Error("serve did not stop after its context was cancelled")
			}
			assert.NotContains(t, serveErr.String(), "refused a permission")
		})
	}
	t.Cleanup(stop)
	base := httpBase(t, &serveErr)
	require.Eventually(t, func() bool { return strings.Contains(serveOut.String(), "seamguard serving on") }, 20*time.Second, 10*time.Millisecond)

	ev := func(session, id, typ, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"urn:agent:h","type":"io.seamguard.%s","subject":%q,"data":%s}`, id, typ, session, data)
	}
	batch := []string{ev("gw-1", "o", "session.opened", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`)}
	for i := range 6 {
		batch = append(batch, ev("gw-1", fmt.Sprintf("t%d", i), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1}`, i)))
	}
	code, _, body := httpPost(t, base+"/v1/events", "agent-tok", "application/cloudevents-batch+json", "["+strings.Join(batch, ",")+"]")
	require.Equal(t, http.StatusAccepted, code, body)

	// Binary mode, as curl sends it.
	breq, err := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(`{"offset":6,"size":1,"content":"binary"}`))
	require.NoError(t, err)
	for k, v := range map[string]string{"Authorization": "Bearer agent-tok", "Content-Type": "application/json", "ce-specversion": "1.0",
		"ce-id": "t6", "ce-source": "urn:agent:h", "ce-type": events.TypeTurnAppended, "ce-subject": "gw-1"} {
		breq.Header.Set(k, v)
	}
	bres, err := http.DefaultClient.Do(breq)
	require.NoError(t, err)
	bres.Body.Close()
	require.Equal(t, http.StatusAccepted, bres.StatusCode)
	require.Equal(t, "binary", bres.Header.Get(gateway.HeaderMode))

	req := ev("gw-1", "r1", "compaction.requested", `{"request_id":"c1","summarizer_input":{"start":0,"end":6},"summary_range":{"start":0,"end":4},"tail_start":4}`)
	code, hdr, body := httpPost(t, base+"/v1/events?wait=20s", "agent-tok", "application/cloudevents+json", req)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "verdict", hdr.Get(gateway.HeaderWait))
	v, err := events.DecodeVerdict([]byte(body))
	require.NoError(t, err)
	require.Equal(t, events.OutputID(events.Cause{ID: "r1", Source: "urn:agent:h"}, v.Type), v.ID)

	// The same request again: stored once, answered with its verdict,
	// read back as the operator identity.
	code, hdr, body2 := httpPost(t, base+"/v1/events?wait=5s", "agent-tok", "application/cloudevents+json", req)
	require.Equal(t, http.StatusOK, code, body2)
	require.Equal(t, "1", hdr.Get(gateway.HeaderDuplicates))
	require.Equal(t, body, body2)
	// Another event under the same (source, id): 409, read back as the
	// processor identity.
	code, _, body2 = httpPost(t, base+"/v1/events", "agent-tok", "application/cloudevents+json", strings.Replace(batch[1], `"size":1`, `"size":2`, 1))
	require.Equal(t, http.StatusConflict, code, body2)
	require.Contains(t, body2, "differs in data")

	// The agent token: not another session, not control.
	code, _, body = httpPost(t, base+"/v1/events", "agent-tok", "application/cloudevents+json", ev("other", "x", "turn.appended", `{"offset":0,"size":1}`))
	require.Equal(t, http.StatusForbidden, code, body)
	resume := ev("gw-1", "res1", "session.resumed", `{"note":"looked at it"}`)
	code, _, body = httpPost(t, base+"/v1/events", "agent-tok", "application/cloudevents+json", resume)
	require.Equal(t, http.StatusForbidden, code, body)
	// The operator's resume goes out as the operator identity.
	code, _, body = httpPost(t, base+"/v1/events", "op-tok", "application/cloudevents+json", resume)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Contains(t, body, `"nats_subject":"seamguard.control.gw-1"`)

	// A refusal with a spill, read back over HTTP as the agent: the spill's
	// chain and the session's verdicts as Server-Sent Events, verified
	// against the processor's key (read as the operator identity).
	hole := []string{ev("gw-2", "g2-o", "session.opened", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`)}
	for i := range 6 {
		hole = append(hole, ev("gw-2", fmt.Sprintf("g2-t%d", i), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"content":"turn %d of gw-2"}`, i, i)))
	}
	hole = append(hole, ev("gw-2", "g2-tr", "context.truncated", `{"range":{"start":0,"end":2},"stage":"budget"}`))
	code, _, body = httpPost(t, base+"/v1/events", "agent-tok", "application/cloudevents-batch+json", "["+strings.Join(hole, ",")+"]")
	require.Equal(t, http.StatusAccepted, code, body)
	code, _, body = httpPost(t, base+"/v1/events?wait=20s", "agent-tok", "application/cloudevents+json",
		ev("gw-2", "g2-r1", "compaction.requested", `{"request_id":"c1","summarizer_input":{"start":2,"end":6},"summary_range":{"start":2,"end":4},"tail_start":4}`))
	require.Equal(t, http.StatusOK, code, body)
	refused, err := events.DecodeVerdict([]byte(body))
	require.NoError(t, err)
	require.Equal(t, events.TypeCompactionRefused, refused.Type, body)
	get := func(path, token string) (int, http.Header, string) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return res.StatusCode, res.Header, string(b)
	}
	code, hdr, body = get("/v1/sessions/gw-2/spills/1", "agent-tok")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "turn 0 of gw-2", "the truncated turn is in the spill")
	require.NotEmpty(t, hdr.Get("Digest"))
	code, _, body = get("/v1/sessions/other/spills/1", "agent-tok")
	require.Equal(t, http.StatusForbidden, code, body)
	code, _, body = get("/v1/sessions/gw-2/spills/1", "")
	require.Equal(t, http.StatusUnauthorized, code, body)
	code, _, body = get("/v1/verdicts", "agent-tok")
	require.Equal(t, http.StatusForbidden, code, "an agent token may not read every session's verdicts: %s", body)
	sse, err := http.NewRequest(http.MethodGet, base+"/v1/verdicts?session=gw-2&from=start", nil)
	require.NoError(t, err)
	sse.Header.Set("Authorization", "Bearer agent-tok")
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	res, err := http.DefaultClient.Do(sse.WithContext(sctx))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	var seen []string
	buf := make([]byte, 64<<10)
	for !strings.Contains(strings.Join(seen, ""), "event: "+events.TypeCompactionRefused) {
		n, err := res.Body.Read(buf)
		seen = append(seen, string(buf[:n]))
		if err != nil {
			break
		}
	}
	scancel()
	res.Body.Close()
	stream := strings.Join(seen, "")
	require.Contains(t, stream, "event: "+events.TypeCompactionRefused, "the refusal comes as a verified verdict")
	require.NotContains(t, stream, "event: "+"unverified", "the processor's own verdicts verify against its key")
	require.Contains(t, stream, refused.ID)

	// SIGHUP after the agent's line is taken out revokes it.
	require.NoError(t, os.WriteFile(tokens, []byte(opLine+"\n"), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		code, _, _ := httpPost(t, base+"/v1/events", "agent-tok", "application/cloudevents+json", ev("gw-1", "t9", "turn.appended", `{"offset":9,"size":1}`))
		return code == http.StatusUnauthorized
	}, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, serveErr.String(), "HTTP token file reloaded")

	// The gateway stops with serve.
	stop()
	_, err = http.Post(base+"/v1/events", "application/cloudevents+json", strings.NewReader(resume))
	require.Error(t, err, "the gateway still answers after serve returned")
}

func TestServeHTTPUsage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("secret-token agent s\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--data-dir", dir, "--http-listen", "0.0.0.0:0"}, "loopback"},
		{[]string{"serve", "--data-dir", dir, "--http-listen", ":0"}, "loopback"},
		{[]string{"serve", "--data-dir", dir, "--http-listen", "127.0.0.1:0", "--http-tokens", bad}, "64 hex digits"},
		{[]string{"serve", "--data-dir", dir, "--http-tokens", bad}, "--http-tokens needs --http-listen"},
		{[]string{"serve", "--nats-url", "nats://127.0.0.1:1", "--http-listen", "127.0.0.1:0"}, "--http-agent-user"},
		{[]string{"serve", "--data-dir", dir, "--http-listen", "127.0.0.1:0", "--http-agent-user", "agent"}, "need --nats-url"},
		{[]string{"http-token", "--role", "agent"}, "needs the sessions"},
		{[]string{"http-token", "secret"}, "--stdin"},
	} {
		code, _, stderr := runCLI(t, "", tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

func TestHTTPTokenCommand(t *testing.T) {
	code, out, stderr := runCLI(t, "", "http-token", "--role", "agent", "--sessions", "a,team-*", "--label", "bot")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	tok, ok := strings.CutPrefix(lines[0], "token: ")
	require.True(t, ok, out)
	require.Equal(t, gateway.HashToken(tok)+" agent a team-* # bot", lines[1])
	entries, err := gateway.ParseTokens([]byte(lines[1]))
	require.NoError(t, err)
	require.Len(t, entries, 1)

	code, out, stderr = runCLI(t, "x\n", "http-token", "--role", "operator", "--stdin")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 operator\n", out)
}
