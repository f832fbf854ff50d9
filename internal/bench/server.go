package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/embedded"
)

// ChildEnv is the environment variable that makes a process started by
// Config.Child serve an embedded nats-server on the directory it names
// instead of doing its own work; see ServeChild.
const ChildEnv = "SEAMGUARD_BENCH_SERVER_DIR"

// ServeChild is what a child process calls first: when ChildEnv is set it
// runs the embedded server on that directory, prints its URL on standard
// output, serves until standard input closes, and returns true with the
// exit code. Otherwise it returns false and does nothing.
func ServeChild() (int, bool) {
	dir := os.Getenv(ChildEnv)
	if dir == "" {
		return 0, false
	}
	s, err := embedded.Start(embedded.Config{StoreDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, true
	}
	fmt.Println(s.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	return 0, true
}

// server is the broker one measurement runs against.
type server struct {
	url  string
	mode string // "url", "child process" or "in process"
	nc   *nats.Conn
	js   jetstream.JetStream
	stop func()
}

// startServer connects to cfg.URL, or starts a fresh server in a child
// process or in this process with storage under dir.
func startServer(cfg Config, dir string) (*server, error) {
	s := &server{stop: func() {}}
	switch {
	case cfg.URL != "":
		s.url, s.mode = cfg.URL, "url"
	case len(cfg.Child) > 0:
		url, stop, err := startChild(cfg.Child, dir)
		if err != nil {
			return nil, err
		}
		s.url, s.mode, s.stop = url, "child process", stop
	default:
		srv, err := embedded.Start(embedded.Config{StoreDir: dir})
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		s.url, s.mode = srv.ClientURL(), "in process"
		s.stop = func() { srv.Shutdown(); srv.WaitForShutdown() }
	}
	nc, err := nats.Connect(s.url, nats.MaxReconnects(-1))
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("bench: connect to %s: %w", s.url, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		s.stop()
		return nil, fmt.Errorf("bench: %w", err)
	}
	s.nc, s.js = nc, js
	return s, nil
}

func (s *server) close() {
	if s.nc != nil {
		s.nc.Close()
	}
	s.stop()
}

// startChild runs argv with ChildEnv set to dir and reads the server URL
// it prints. stop closes its standard input and waits for it to exit.
func startChild(argv []string, dir string) (string, func(), error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), ChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, fmt.Errorf("bench: child server: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, fmt.Errorf("bench: child server: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("bench: start child server %s: %w", argv[0], err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	urls := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		urls <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case url := <-urls:
		if url == "" {
			stop()
			return "", nil, errors.New("bench: the child server failed to start (see its error above)")
		}
		return url, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, errors.New("bench: the child server printed no URL within 30s")
	}
}

// waitCtx sleeps d or until ctx ends.
func waitCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
