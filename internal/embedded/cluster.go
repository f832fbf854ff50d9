package embedded

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is a JetStream cluster of servers in this process, on loopback,
// for tests: every server has its own storage, client port and route port,
// and keeps them when restarted.
type Cluster struct {
	Servers []*server.Server
	opts    []*server.Options
}

// StartCluster starts n clustered servers and waits until JetStream has a
// meta leader. They are stopped when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	ports := make([][2]int, n)
	for i := range ports {
		ports[i] = [2]int{FreePort(t), FreePort(t)}
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p[1]))
	}
	dir := t.TempDir()
	for i := range n {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[i][0],
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			NoSigs:     true,
			NoLog:      true,
			Cluster:    server.ClusterOpts{Name: "seamguard-test", Host: "127.0.0.1", Port: ports[i][1]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		c.opts = append(c.opts, o)
		c.Servers = append(c.Servers, nil)
	}
	for i := range n {
		c.start(t, i)
	}
	t.Cleanup(func() {
		for _, s := range c.Servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
	})
	c.WaitReady(t)
	return c
}

func (c *Cluster) start(t testing.TB, i int) {
	t.Helper()
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) { // a loaded CI machine starts slowly
		t.Fatalf("server %s not ready", o.ServerName)
	}
	c.Servers[i] = s
}

// URLs is every server's client URL, comma-separated, starting with server i.
func (c *Cluster) URLs(first int) string {
	var urls []string
	for k := range c.opts {
		o := c.opts[(first+k)%len(c.opts)]
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(urls, ",")
}

// Stop stops server i, as a crash of that node would.
func (c *Cluster) Stop(i int) {
	c.Servers[i].Shutdown()
	c.Servers[i].WaitForShutdown()
	c.Servers[i] = nil
}

// Start starts server i again with its ports and storage.
func (c *Cluster) Start(t testing.TB, i int) { c.start(t, i) }

// WaitReady waits until every running server routes to the others and the
// JetStream API answers through each.
func (c *Cluster) WaitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i, s := range c.Servers {
		if s == nil {
			continue
		}
		for {
			if time.Now().After(deadline) {
				t.Fatalf("JetStream cluster not ready through server %d", i+1)
			}
			if ready(s.ClientURL()) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func ready(url string) bool {
	nc, err := nats.Connect(url)
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := js.AccountInfo(ctx)
	return err == nil && info != nil
}

// FreePort returns a loopback port nothing listens on, outside the range
// the kernel takes ports from for outgoing connections: a cluster's ports
// are chosen before its servers start, and a port from that range could be
// taken meanwhile by a connection the servers themselves open (a route to
// the others), which would keep a server from listening. No port is
// returned twice in one process.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := ephemeralRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		// Below the range when there is room, else above it.
		p := 10000 + rand.IntN(max(lo-10000, 1))
		if lo <= 11000 {
			p = hi + 1 + rand.IntN(max(65535-hi, 1))
		}
		if portsGiven[p] || p >= lo && p <= hi {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[p] = true
		return p
	}
	t.Fatalf("embedded: no free loopback port outside the ephemeral range %d-%d", lo, hi)
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralRange is the kernel's range of ports for outgoing connections
// (Linux's default where it cannot be read).
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	var l, h int
	if n, _ := fmt.Sscan(string(b), &l, &h); n == 2 && l > 0 && h >= l && h <= 65535 {
		return l, h
	}
	return lo, hi
}
