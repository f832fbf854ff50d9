package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A netLab is a small network of namespaces for one fault test: a switch
// namespace holding a bridge, node namespaces each tied to it by a veth
// pair (address 10.231.0.<i+1>/24 on the node end, eth0), and a client
// namespace (10.231.0.100) where the test process makes its own sockets
// (see netnsDialer). No address is ever put in the root namespace. A node
// is isolated by setting the switch end of its veth down, and healed by
// setting it up again.
//
// Every namespace is named netLabPrefix, the creating process's pid, 'x'
// and a random part: a test binary that died without cleaning up (go
// test's -timeout panics past every Cleanup) leaves namespaces whose pid
// is gone, and the next lab sweeps them away with the processes left in
// them (processes an earlier run of this test started).
const netLabPrefix = "sgf"

const netnsDir = "/run/netns"

type netLab struct {
	t      *testing.T
	tag    string
	sw     string
	client string
	nodes  []string
	addrs  []string // the node ends' addresses
	dir    string   // configs and logs

	mu    sync.Mutex
	procs []*os.Process // killed at teardown if still running
	stops []func()      // then called
	made  []string      // namespaces made, deleted at teardown
	once  sync.Once
}

var netLabs struct {
	sync.Mutex
	live       map[*netLab]bool
	dirAbsent  bool // /run/netns did not exist before the first lab
	dirChecked bool
	signals    chan os.Signal
}

// newNetLab makes a lab of n nodes. Everything it makes is removed when t
// ends, when the test binary is interrupted (SIGINT, SIGTERM), or by the
// next lab if this process dies first.
func newNetLab(t *testing.T, n int) *netLab {
	t.Helper()
	sweepStaleLabs(t)
	lab := &netLab{t: t, tag: fmt.Sprintf("%s%dx%04x", netLabPrefix, os.Getpid(), rand.IntN(1<<16)), dir: t.TempDir()}
	lab.sw, lab.client = lab.tag+"-sw", lab.tag+"-cl"
	netLabs.Lock()
	if !netLabs.dirChecked {
		netLabs.dirChecked = true
		_, err := os.Stat(netnsDir)
		netLabs.dirAbsent = errors.Is(err, os.ErrNotExist)
	}
	if netLabs.live == nil {
		netLabs.live = map[*netLab]bool{}
	}
	netLabs.live[lab] = true
	if netLabs.signals == nil {
		netLabs.signals = make(chan os.Signal, 1)
		signal.Notify(netLabs.signals, os.Interrupt, syscall.SIGTERM)
		go tearDownOnSignal(netLabs.signals)
	}
	netLabs.Unlock()
	t.Cleanup(lab.teardown)

	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	lab.addNS(lab.sw)
	must("-n", lab.sw, "link", "add", "br0", "type", "bridge")
	must("-n", lab.sw, "link", "set", "br0", "up")
	attach := func(ns, swEnd, addr string) {
		lab.addNS(ns)
		must("-n", lab.sw, "link", "add", swEnd, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("-n", lab.sw, "link", "set", swEnd, "master", "br0")
		must("-n", lab.sw, "link", "set", swEnd, "up")
		must("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
		must("-n", ns, "link", "set", "lo", "up")
	}
	attach(lab.client, "cl", "10.231.0.100")
	for i := range n {
		ns, addr := fmt.Sprintf("%s-n%d", lab.tag, i+1), fmt.Sprintf("10.231.0.%d", i+1)
		attach(ns, fmt.Sprintf("n%d", i+1), addr)
		lab.nodes, lab.addrs = append(lab.nodes, ns), append(lab.addrs, addr)
	}
	return lab
}

func (lab *netLab) addNS(ns string) {
	lab.t.Helper()
	lab.mu.Lock()
	lab.made = append(lab.made, ns) // before: a half-made one is deleted too
	lab.mu.Unlock()
	if err := ipCmd("netns", "add", ns); err != nil {
		lab.t.Fatal(err)
	}
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// isolate cuts node i off the switch; heal joins it again.
func (lab *netLab) isolate(i int) error {
	return ipCmd("-n", lab.sw, "link", "set", fmt.Sprintf("n%d", i+1), "down")
}

func (lab *netLab) heal(i int) error {
	return ipCmd("-n", lab.sw, "link", "set", fmt.Sprintf("n%d", i+1), "up")
}

// inNode returns argv run in node i's namespace; ip execs the program, so
// the process started is the program's.
func (lab *netLab) inNode(i int, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", lab.nodes[i]}, argv...)
}

// track makes teardown kill p (if still running) and then call stop.
func (lab *netLab) track(p *os.Process, stop func()) {
	lab.mu.Lock()
	defer lab.mu.Unlock()
	if p != nil {
		lab.procs = append(lab.procs, p)
	}
	if stop != nil {
		lab.stops = append(lab.stops, stop)
	}
}

// teardown kills every process the lab started, by its own handle, and
// deletes the namespaces. It may be called more than once and from a
// signal handler.
func (lab *netLab) teardown() {
	lab.once.Do(func() {
		lab.mu.Lock()
		procs, stops, made := lab.procs, lab.stops, lab.made
		lab.mu.Unlock()
		for _, p := range procs {
			// os.Process signals through a pidfd: one already reaped is
			// not signalled, and no other process can be hit.
			_ = p.Signal(syscall.SIGCONT)
			_ = p.Signal(syscall.SIGKILL)
		}
		for _, stop := range stops {
			stop()
		}
		for i := len(made) - 1; i >= 0; i-- {
			if err := ipCmd("netns", "del", made[i]); err != nil {
				fmt.Fprintf(os.Stderr, "netlab: %v\n", err)
			}
		}
		netLabs.Lock()
		delete(netLabs.live, lab)
		netLabs.Unlock()
	})
}

// removeNetnsDir undoes what `ip netns add` did to /run/netns (a directory
// bind-mounted on itself) if it did not exist before the first lab and no
// namespace is left in it.
func removeNetnsDir() {
	netLabs.Lock()
	absent, live := netLabs.dirAbsent, len(netLabs.live)
	netLabs.Unlock()
	if !absent || live > 0 {
		return
	}
	if ents, err := os.ReadDir(netnsDir); err != nil || len(ents) > 0 {
		return
	}
	_ = unix.Unmount(netnsDir, unix.MNT_DETACH)
	_ = os.Remove(netnsDir)
}

func tearDownOnSignal(c chan os.Signal) {
	s := <-c
	netLabs.Lock()
	var labs []*netLab
	for lab := range netLabs.live {
		labs = append(labs, lab)
	}
	netLabs.Unlock()
	for _, lab := range labs {
		lab.teardown()
	}
	removeNetnsDir()
	signal.Reset(s)
	_ = syscall.Kill(os.Getpid(), s.(syscall.Signal))
}

// sweepStaleLabs deletes the namespaces of labs whose process is gone,
// killing what an earlier run left running in them.
func sweepStaleLabs(t *testing.T) {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, netLabPrefix)
		if !ok {
			continue
		}
		pidS, _, ok := strings.Cut(rest, "x")
		pid, err := strconv.Atoi(pidS)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // a lab of a run still going
		}
		out, _ := exec.Command("ip", "netns", "pids", name).Output()
		for _, f := range strings.Fields(string(out)) {
			if p, err := strconv.Atoi(f); err == nil && p > 1 {
				_ = syscall.Kill(p, syscall.SIGCONT)
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if err := ipCmd("netns", "del", name); err != nil {
			t.Logf("sweeping a stale lab: %v", err)
		} else {
			t.Logf("swept namespace %s left by process %d", name, pid)
		}
	}
}

// netnsDialer dials from inside a network namespace: on a thread of its
// own it enters the namespace, creates and connects the socket (which
// stays in that namespace for good), and goes back. A thread that cannot
// go back is not reused: its goroutine ends while locked to it, and the
// runtime ends the thread.
type netnsDialer struct {
	ns      string
	timeout time.Duration
}

func (d netnsDialer) Dial(network, address string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		c, back, err := d.dialHere(network, address)
		if back {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// dialHere runs on a locked thread; back says whether the thread is in
// its own namespace again.
func (d netnsDialer) dialHere(network, address string) (net.Conn, bool, error) {
	home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, true, fmt.Errorf("netns dialer: %w", err)
	}
	defer home.Close()
	target, err := os.Open(filepath.Join(netnsDir, d.ns))
	if err != nil {
		return nil, true, fmt.Errorf("netns dialer: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("netns dialer: enter %s: %w", d.ns, err)
	}
	c, err := (&net.Dialer{Timeout: d.timeout}).Dial(network, address)
	back := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil
	return c, back, err
}
