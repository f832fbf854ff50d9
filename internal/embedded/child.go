package embedded

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"time"
)

// A child server is the embedded server run in a process of its own (the
// same binary started again), so that measurements of the parent hold only
// the parent's memory. The parent starts it with StartChild; the child's
// main (or TestMain) calls ServeChild first thing.

// ChildEnv is the environment variable that makes a process serve an
// embedded nats-server on the directory it names instead of doing its own
// work; see ServeChild.
const ChildEnv = "SEAMGUARD_CHILD_SERVER_DIR"

// ChildProfileEnv, when set, makes a child server write a CPU profile of
// itself to the file it names.
const ChildProfileEnv = "SEAMGUARD_CHILD_SERVER_CPUPROFILE"

// ServeChild is what a child process calls first: when ChildEnv is set it
// runs the embedded server on that directory, prints its URL on standard
// output, serves until standard input closes, and returns true with the
// exit code. Otherwise it returns false and does nothing.
func ServeChild() (int, bool) {
	dir := os.Getenv(ChildEnv)
	if dir == "" {
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
	s, err := Start(Config{StoreDir: dir})
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
