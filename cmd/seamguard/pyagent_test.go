package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/gateway"
	"github.com/seamguard/seamguard/internal/longtest"
)

// TestPythonAgentOverHTTP runs examples/python/agent.py, in both modes,
// against a real serve --http-listen with a token file: the seed story is
// refused, the agent reads the spill and finds the evicted rule in it, and
// its retry is allowed. With a token for other sessions it fails, saying
// why.
func TestPythonAgentOverHTTP(t *testing.T) {
	longtest.Skip(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte(gateway.HashToken("py-agent")+" agent ops-agent-42-*\n"+
		gateway.HashToken("py-other")+" agent team-b-*\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveOut, serveErr lockedBuffer
	go func() {
		served <- run(ctx, []string{"serve", "--data-dir", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			"--http-listen", "127.0.0.1:0", "--http-tokens", tokens, "--log-format", "json"},
			strings.NewReader(""), &serveOut, &serveErr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-served:
			assert.Equal(t, 0, code, serveErr.String())
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop")
		}
	})
	base := httpBase(t, &serveErr)
	require.Eventually(t, func() bool { return strings.Contains(serveOut.String(), "seamguard serving on") }, 20*time.Second, 10*time.Millisecond)

	agent := func(token string, args ...string) (string, error) {
		cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
		defer ccancel()
		cmd := exec.CommandContext(cctx, py, append([]string{"../../examples/python/agent.py", "--url", base}, args...)...)
		cmd.Env = append(os.Environ(), "SEAMGUARD_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, mode := range []string{"binary", "structured"} {
		out, err := agent("py-agent", "--mode", mode)
		require.NoError(t, err, "%s mode:\n%s", mode, out)
		assert.Contains(t, out, "io.seamguard.compaction.refused", mode)
		assert.Contains(t, out, "Do not touch anything under /etc.", "%s: the evicted rule is read back from the spill", mode)
		assert.Contains(t, out, "io.seamguard.compaction.allowed", mode)
		assert.Contains(t, out, "the story went as it should", mode)
	}
	out, err := agent("py-other")
	require.Error(t, err, "a token for other sessions may not play ops-agent-42-*:\n%s", out)
	assert.Contains(t, out, "403", out)
}
