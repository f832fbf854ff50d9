package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// readmeWalkthrough returns the commands of the README's live walkthrough:
// the lines of the first sh block under its heading, comments dropped.
func readmeWalkthrough(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n## A live server, step by step\n")
	require.True(t, ok, "the README has no section \"A live server, step by step\"")
	_, rest, ok = strings.Cut(rest, "```sh\n")
	require.True(t, ok, "the walkthrough has no sh block")
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	var cmds []string
	sc := bufio.NewScanner(strings.NewReader(block))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		if line = strings.TrimSpace(line); line != "" {
			cmds = append(cmds, line)
		}
	}
	return cmds
}

// TestReadmeWalkthrough runs the README's live walkthrough, command by
// command, as written, with a seamguard built from this checkout first in
// PATH: serve in the background, watch in the background, publish, inspect,
// spill get, and the check that the evicted rule is in the spill; then
// stops serve, and runs it all again on the same data directory and files,
// as a reader trying it twice would. Only the environment differs:
// SEAMGUARD_LISTEN and SEAMGUARD_NATS_URL put the embedded server on a free
// port, and /tmp/ paths go to the test's own directory.
func TestReadmeWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	cmds := readmeWalkthrough(t)
	require.GreaterOrEqual(t, len(cmds), 5, "%q", cmds)

	bin := buildBinary(t)
	binDir := filepath.Dir(bin)
	tmp := t.TempDir()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	// serve starts its embedded server on SEAMGUARD_LISTEN; the other
	// commands find it at SEAMGUARD_NATS_URL (serve would take that for an
	// external server).
	var base []string // nothing of the caller's seamguard configuration
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SEAMGUARD_") {
			base = append(base, kv)
		}
	}
	serveEnv := append(base,
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		fmt.Sprintf("SEAMGUARD_LISTEN=127.0.0.1:%d", port),
	)
	env := append(serveEnv[:len(serveEnv):len(serveEnv)], "SEAMGUARD_NATS_URL="+url)
	shell := func(line string) *exec.Cmd {
		cmd := exec.Command("bash", "-c", strings.ReplaceAll(line, "/tmp/", tmp+"/"))
		cmd.Dir, cmd.Env = root, env
		if strings.HasPrefix(line, "seamguard serve") {
			cmd.Env = serveEnv
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}
	type bg struct {
		line string
		cmd  *exec.Cmd
		out  *lockedBuffer
		done chan error
	}
	var background []*bg
	t.Cleanup(func() {
		for _, b := range background {
			if b.cmd.ProcessState == nil && b.cmd.Process != nil {
				_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
				<-b.done
			}
		}
	})
	// walk runs the walkthrough once, then stops serve as the README says,
	// and returns each foreground command's output, by its first two words.
	walk := func() map[string]string {
		round := len(background)
		outputs := map[string]string{}
		for _, line := range cmds {
			if strings.HasSuffix(line, "&") {
				line = strings.TrimSpace(strings.TrimSuffix(line, "&"))
				b := &bg{line: line, cmd: shell(line), out: &lockedBuffer{}, done: make(chan error, 1)}
				b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
				require.NoError(t, b.cmd.Start(), line)
				go func() { b.done <- b.cmd.Wait() }()
				background = append(background, b)
				if strings.HasPrefix(line, "seamguard serve") {
					waitDeployed(t, url, b.out, b.done)
				}
				continue
			}
			cmd := shell(line)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s\n%s", line, out)
			outputs[strings.Fields(line)[0]+" "+strings.Fields(line)[1]] = string(out)
		}
		require.Contains(t, outputs["seamguard inspect"], "ops-agent-42")
		require.Equal(t, "1", strings.TrimSpace(outputs["grep -c"]), "the evicted rule is in the spill once")

		for _, b := range background[round:] {
			if strings.HasPrefix(b.line, "seamguard watch") {
				select {
				case err := <-b.done:
					require.NoError(t, err, "%s\n%s", b.line, b.out)
					for _, kind := range []string{"spilled", "refused", "allowed"} {
						require.Contains(t, b.out.String(), kind, "watch printed the story's verdicts:\n%s", b.out)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("%s did not end after its verdicts:\n%s", b.line, b.out)
				}
			}
		}
		for _, b := range background[round:] {
			if strings.HasPrefix(b.line, "seamguard serve") {
				require.NoError(t, syscall.Kill(-b.cmd.Process.Pid, syscall.SIGTERM))
				select {
				case err := <-b.done:
					require.NoError(t, err, "serve after SIGTERM:\n%s", b.out)
				case <-time.After(30 * time.Second):
					t.Fatalf("serve did not stop 30s after SIGTERM:\n%s", b.out)
				}
			}
		}
		return outputs
	}

	first := walk()
	require.Contains(t, first["seamguard publish"], "coverage_hole [0, 8)", "publish --wait prints the refusal")
	require.Contains(t, first["seamguard publish"], "published 57 event(s) of 1 session(s)")

	// Again, on the same data directory and files: each step does the
	// same, and says what it found done already.
	second := walk()
	require.Contains(t, second["seamguard publish"], "published 0 event(s) of 1 session(s); 57 more were in the events stream already")
	require.Contains(t, second["seamguard publish"], "nothing new for the processor to decide")
	require.Contains(t, second["seamguard spill"], "holds exactly this transcript already: left as it is")
}

// waitDeployed waits until the processor at url has made its streams.
func waitDeployed(t *testing.T, url string, logs *lockedBuffer, exited chan error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("serve exited (%v):\n%s", err, logs)
		default:
		}
		if nc, err := nats.Connect(url, nats.Timeout(time.Second)); err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := js.Stream(ctx, "SEAMGUARD_VERDICTS")
			cancel()
			nc.Close()
			if err == nil {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("serve made no streams in 60s:\n%s", logs)
}
