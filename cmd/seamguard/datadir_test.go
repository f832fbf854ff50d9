package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
)

// serveProc is a `seamguard serve` process of a test, stopped (killed if
// need be) when the test ends.
type serveProc struct {
	cmd  *exec.Cmd
	out  *lockedBuffer // stdout and stderr
	done chan struct{}
	err  error // Wait's, once done is closed
}

func startServeProc(t *testing.T, bin string, args ...string) *serveProc {
	t.Helper()
	p := &serveProc{cmd: exec.Command(bin, append([]string{"serve"}, args...)...), out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("serve %v output:\n%s", args, p.out.String())
		}
	})
	return p
}

// ready waits until serve says it serves.
func (p *serveProc) ready(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-p.done:
			t.Fatalf("serve exited before it served: %v\n%s", p.err, p.out.String())
		default:
		}
		return strings.Contains(p.out.String(), "seamguard serving on")
	}, time.Minute, 20*time.Millisecond)
}

// exited waits at most d for the process to exit and returns its exit code
// and how long it ran.
func (p *serveProc) exited(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("serve still running after %s:\n%s", d, p.out.String())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, p.err)
	return 0
}

// stop sends SIGTERM and waits for a clean exit.
func (p *serveProc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.exited(t, 30*time.Second), "serve exits 0 on SIGTERM")
}

// msgsAt is how many messages a stream holds, read through url (0 when it
// cannot tell).
func msgsAt(t *testing.T, url, stream string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		return 0
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return streamMsgs(ctx, js, stream)
}

// sharedSigningKey writes a signing key into a file of its own and returns
// its path, for the instances of one deployment that a test runs side by
// side: without it each would keep its key in the data directory, which
// takes one serve at a time.
func sharedSigningKey(t *testing.T) string {
	t.Helper()
	s, err := attest.Generate()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "signing.nk")
	require.NoError(t, os.WriteFile(path, s.Seed(), 0o600))
	return path
}

// TestServeOneWriterPerDataDir runs two serve processes on one data
// directory: the second refuses at once, naming the first (its pid and
// address), and touches nothing; the first keeps serving, and what it
// stored is there after a restart. A serve killed with SIGKILL leaves the
// directory to the next one.
func TestServeOneWriterPerDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "data")
	addr1 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	url := "nats://" + addr1
	common := []string{"--data-dir", dir, "--source", "urn:seamguard:test", "--log-level", "warn"}

	first := startServeProc(t, bin, append(common, "--listen", addr1)...)
	first.ready(t)
	lines := fleet(t, 1)
	want := offlineVerdicts(t, lines)
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	publishLines(t, js, lines)
	require.Eventually(t, func() bool { return msgsAt(t, url, "SEAMGUARD_VERDICTS") >= uint64(len(want)) }, time.Minute, 50*time.Millisecond)
	events, verdicts := msgsAt(t, url, "SEAMGUARD_EVENTS"), msgsAt(t, url, "SEAMGUARD_VERDICTS")

	addr2 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	began := time.Now()
	second := startServeProc(t, bin, append(common, "--listen", addr2, "--health-listen", "127.0.0.1:0")...)
	code := second.exited(t, 10*time.Second)
	took := time.Since(began)
	msg := second.out.String()
	assert.NotEqual(t, 0, code, "the second serve fails")
	assert.Less(t, took, 5*time.Second, "the second serve refuses at once")
	assert.Contains(t, msg, "--data-dir "+dir+" is in use by another seamguard serve")
	assert.Contains(t, msg, "pid "+strconv.Itoa(first.cmd.Process.Pid))
	assert.Contains(t, msg, "nats "+addr1)
	assert.Contains(t, msg, "since ")
	assert.Contains(t, msg, "another --data-dir")
	assert.NotContains(t, msg, "seamguard serving on")
	t.Logf("second serve: exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(msg))
	_, err = net.DialTimeout("tcp", addr2, time.Second)
	assert.Error(t, err, "the second serve never listened")

	// The first keeps serving.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.Publish(ctx, "seamguard.events.after-refusal", []byte(lines[0]))
	require.NoError(t, err)
	events++
	nc.Close()
	require.Eventually(t, func() bool { return msgsAt(t, url, "SEAMGUARD_EVENTS") == events }, 10*time.Second, 20*time.Millisecond)
	lock, err := os.ReadFile(filepath.Join(dir, "LOCK"))
	require.NoError(t, err)
	assert.Contains(t, string(lock), fmt.Sprintf(`"pid":%d`, first.cmd.Process.Pid), "the lock file still names the first")

	// What it stored survives a restart.
	first.stop(t)
	again := startServeProc(t, bin, append(common, "--listen", addr1)...)
	again.ready(t)
	assert.Equal(t, events, msgsAt(t, url, "SEAMGUARD_EVENTS"), "events after a restart")
	assert.GreaterOrEqual(t, msgsAt(t, url, "SEAMGUARD_VERDICTS"), verdicts, "verdicts after a restart")

	// Killed, it leaves the directory to the next serve.
	require.NoError(t, again.cmd.Process.Signal(syscall.SIGKILL))
	again.exited(t, 10*time.Second)
	next := startServeProc(t, bin, append(common, "--listen", addr1)...)
	next.ready(t)
	assert.Equal(t, events, msgsAt(t, url, "SEAMGUARD_EVENTS"), "events after SIGKILL and a restart")
	lock, err = os.ReadFile(filepath.Join(dir, "LOCK"))
	require.NoError(t, err)
	assert.Contains(t, string(lock), fmt.Sprintf(`"pid":%d`, next.cmd.Process.Pid), "the lock file names the new holder")
	next.stop(t)
}

// TestServeBusyListen: an address another socket holds, as --listen or as
// --health-listen, fails serve at once with the address and the OS error.
func TestServeBusyListen(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	addr := busy.Addr().String()

	for _, tc := range []struct {
		name string
		args []string
		flag string
	}{
		{"listen", []string{"--listen", addr}, "--listen"},
		{"health-listen", []string{"--listen", "127.0.0.1:0", "--health-listen", addr}, "--health-listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			began := time.Now()
			p := startServeProc(t, bin, append([]string{"--data-dir", dir, "--log-level", "warn"}, tc.args...)...)
			code := p.exited(t, 15*time.Second)
			took := time.Since(began)
			msg := p.out.String()
			assert.NotEqual(t, 0, code)
			assert.Less(t, took, 3*time.Second, "a busy address fails at once")
			assert.Contains(t, msg, tc.flag+" "+addr)
			assert.Contains(t, msg, "address already in use")
			assert.NotContains(t, msg, "is the port taken")
			if tc.flag == "--health-listen" {
				_, err := os.Stat(filepath.Join(dir, "jetstream"))
				assert.True(t, os.IsNotExist(err), "the server was not started: %v", err)
			}
			t.Logf("%s: exit %d after %s: %s", tc.name, code, took.Round(time.Millisecond), strings.TrimSpace(msg))
		})
	}
}
