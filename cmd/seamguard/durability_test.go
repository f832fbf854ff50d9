package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/metrics/metricstest"
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

// TestServeWarnsOfALazyServer runs serve against a server that acknowledges
// before it syncs: serve must say so in its log and in
// seamguard_nats_sync_always, and say the opposite of a durable one.
func TestServeWarnsOfALazyServer(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		gauge    float64
		log      string
	}{
		{2 * time.Minute, 0, "acknowledge before they sync"},
		{0, 1, "sync before acknowledging"},
	} {
		t.Run(tc.interval.String(), func(t *testing.T) {
			nc, mon := monitored(t, tc.interval)
			ctx, cancel := context.WithCancel(context.Background())
			var out, errb lockedBuffer
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, []string{"serve", "--nats-url", nc.ConnectedUrl(), "--nats-monitor-url", mon,
					"--health-listen", "127.0.0.1:0", "--log-format", "json"}, strings.NewReader(""), &out, &errb)
			}()
			defer func() { cancel(); <-done }()
			base := healthBase(t, &errb)
			s, _, err := metricstest.Get(base + "/metrics")
			require.NoError(t, err)
			got, ok := s.Value("seamguard_nats_sync_always", map[string]string{})
			require.True(t, ok, "no seamguard_nats_sync_always in the scrape")
			require.Equal(t, tc.gauge, got)
			require.Contains(t, errb.String(), tc.log)
		})
	}
}

// TestAskSyncThroughTheSystemAccount asks a server's VARZ with a user of the
// system account, and with one of another account, who cannot.
func TestAskSyncThroughTheSystemAccount(t *testing.T) {
	dir := t.TempDir()
	conf := dir + "/nats.conf"
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(`
listen: "127.0.0.1:-1"
server_name: sysacct
jetstream { store_dir: %q, sync_interval: "2m" }
accounts {
  SYS: { users: [{user: sys, password: sys}] }
  APP: { jetstream: enabled, users: [{user: app, password: app}] }
}
system_account: SYS
`, dir+"/js")), 0o600))
	s, err := embedded.StartFile(conf)
	require.NoError(t, err)
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	ask := func(user string) syncState {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, user))
		require.NoError(t, err)
		defer nc.Close()
		return askSync(context.Background(), nc, nil, time.Second)
	}
	if st := ask("sys"); !st.Known || st.Durable() || len(st.Lazy) != 1 || !strings.HasPrefix(st.Lazy[0], "sysacct: ") {
		t.Errorf("through the system account: %+v, want sysacct known and lazy", st)
	}
	if st := ask("app"); st.Known {
		t.Errorf("a user outside the system account: %+v, want unknown", st)
	}
}
