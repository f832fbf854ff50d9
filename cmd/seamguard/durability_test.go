package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// monitored starts a JetStream server with a monitoring port, syncing
// always or every interval.
func monitored(t *testing.T, interval time.Duration) (*nats.Conn, string) {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, HTTPHost: "127.0.0.1", HTTPPort: server.RANDOM_PORT,
		JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true, ServerName: fmt.Sprintf("sync-%s", interval)}
	if interval == 0 {
		o.SyncAlways = true
	} else {
		o.SyncInterval = interval
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, "http://" + s.MonitorAddr().String()
}

func TestAskSync(t *testing.T) {
	ctx := context.Background()
	t.Run("durable", func(t *testing.T) {
		nc, mon := monitored(t, 0)
		st := askSync(ctx, nc, []string{mon}, 2*time.Second)
		if !st.Durable() || st.Gauge() != 1 || st.Servers != 1 {
			t.Errorf("a server with sync_interval: always reads as %+v, want durable", st)
		}
	})
	t.Run("lazy", func(t *testing.T) {
		nc, mon := monitored(t, 2*time.Minute)
		st := askSync(ctx, nc, []string{mon + "/varz"}, 2*time.Second)
		if st.Durable() || !st.Known || st.Gauge() != 0 || len(st.Lazy) != 1 {
			t.Fatalf("a server syncing every 2m reads as %+v, want known and lazy", st)
		}
		t.Logf("lazy: %s", st.Lazy[0])
	})
	t.Run("unknown", func(t *testing.T) {
		// No monitoring URL, and a user outside the system account: the
		// VARZ request has no responder, so nothing can be told.
		nc, _ := monitored(t, 0)
		st := askSync(ctx, nc, nil, 300*time.Millisecond)
		if st.Known || st.Gauge() != -1 {
			t.Errorf("with nothing to ask, the state reads as %+v, want unknown", st)
		}
	})
}
