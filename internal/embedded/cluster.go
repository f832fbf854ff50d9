package embedded

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
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
		ports[i] = [2]int{freePort(t), freePort(t)}
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
	if !s.ReadyForConnections(10 * time.Second) {
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

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
