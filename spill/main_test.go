package spill

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/embedded"
)

// serverDirEnv, when set, makes the test binary serve nats-server on that
// directory instead of running tests (see startServerProcess).
const serverDirEnv = "SEAMGUARD_SPILL_TEST_SERVER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(serverDirEnv); dir != "" {
		os.Exit(serve(dir))
	}
	os.Exit(m.Run())
}

// serve runs the embedded server until stdin closes, after printing its URL.
func serve(dir string) int {
	s, err := embedded.Start(embedded.Config{StoreDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// startServerProcess runs the same embedded server in a child process (this
// test binary again), so that the test's heap holds only the client's
// memory, and returns a JetStream context on it. The child stops when the
// test ends.
func startServerProcess(t testing.TB) jetstream.JetStream {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serverDirEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	urls := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		urls <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var url string
	select {
	case url = <-urls:
	case <-time.After(30 * time.Second):
		t.Fatal("the server process printed no URL within 30s")
	}
	if url == "" {
		t.Fatal("the server process failed to start")
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
