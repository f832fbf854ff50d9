package embedded

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A child server is the embedded server run in a process of its own (the
// same binary started again), so that measurements of the parent hold only
// the parent's memory. The parent starts it with StartChild; the child's
// main (or TestMain) calls ServeChild first thing.

// ChildEnv is the environment variable that makes a process serve an
// embedded nats-server on the directory it names instead of doing its own
// work; see ServeChild.
const ChildEnv = "SEAMGUARD_CHILD_SERVER_DIR"

// ChildConfigEnv is the environment variable that makes a process serve a
// nats-server from the configuration file it names (cluster routes, listen
// address, store directory, sync_interval and all), as the nats-server
// binary would; see ServeChild. It wins over ChildEnv.
const ChildConfigEnv = "SEAMGUARD_CHILD_SERVER_CONFIG"

// ChildSyncEnv sets a ChildEnv server's SyncInterval: "always" (the
// default) or a duration such as 2m.
const ChildSyncEnv = "SEAMGUARD_CHILD_SERVER_SYNC"

// ChildProfileEnv, when set, makes a child server write a CPU profile of
// itself to the file it names.
const ChildProfileEnv = "SEAMGUARD_CHILD_SERVER_CPUPROFILE"

// ServeChild is what a child process calls first: when ChildEnv is set it
// runs the embedded server on that directory, prints its URL on standard
// output, serves until standard input closes, and returns true with the
// exit code. Otherwise it returns false and does nothing.
func ServeChild() (int, bool) {
	dir, conf := os.Getenv(ChildEnv), os.Getenv(ChildConfigEnv)
	if dir == "" && conf == "" {
		return 0, false
	}
	if path := os.Getenv(ChildProfileEnv); path != "" {
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1, true
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	var s *server.Server
	var err error
	if conf != "" {
		s, err = StartFile(conf)
	} else {
		c := Config{StoreDir: dir}
		if c.SyncInterval, err = ParseSync(os.Getenv(ChildSyncEnv)); err == nil {
			s, err = Start(c)
		}
	}
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

// ParseSync reads a sync setting: "always" or "" (0: fsync every write
// before acknowledging it) or a positive duration such as 2m.
func ParseSync(v string) (time.Duration, error) {
	if v == "" || v == "always" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("embedded: sync setting %q: use always, or a positive duration such as 2m", v)
	}
	return d, nil
}

// StartFile starts a nats-server from a configuration file, as the
// nats-server binary would, and waits until it accepts clients.
func StartFile(path string) (*server.Server, error) {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("embedded: config %s: %w", path, err)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	if !opts.NoLog {
		s.ConfigureLogger()
	}
	if err := startAndWait(s, net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), 30*time.Second); err != nil {
		return nil, fmt.Errorf("%w (configuration %s)", err, path)
	}
	return s, nil
}

// StartChild runs argv with ChildEnv set to dir (and env added to the
// environment) and reads the URL of the server it starts. stop closes its
// standard input and waits for it to exit (killing it after 30s).
func StartChild(argv []string, dir string, env ...string) (url string, pid int, stop func(), err error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+dir), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", 0, nil, fmt.Errorf("embedded: child server: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, fmt.Errorf("embedded: child server: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("embedded: start child server %s: %w", argv[0], err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
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
	case url = <-urls:
		if url == "" {
			stop()
			return "", 0, nil, errors.New("embedded: the child server failed to start (see its error above)")
		}
		return url, cmd.Process.Pid, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return "", 0, nil, errors.New("embedded: the child server printed no URL within 30s")
	}
}
