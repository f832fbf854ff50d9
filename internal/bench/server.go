package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/embedded"
)

// ServerProfileEnv, when set in the environment of a run, makes each child
// server write a CPU profile of itself to the file it names (each server
// overwrites the last: use it with all but one measurement skipped).
const ServerProfileEnv = "SEAMGUARD_BENCH_SERVER_CPUPROFILE"

// ServeChild is what a child process calls first: when it was started as a
// child server it serves (see embedded.ServeChild) and returns true with the
// exit code; otherwise it returns false and does nothing.
func ServeChild() (int, bool) { return embedded.ServeChild() }

// server is the broker one measurement runs against.
type server struct {
	url  string
	mode string // "url", "child process" or "in process"
	nc   *nats.Conn
	js   jetstream.JetStream
	stop func()
	pid  int // the child process, 0 for none
}

// cpu is the CPU time (user and system) used so far by this process and by
// the server when it runs in a child process, from /proc; zero where that
// is not there.
func (s *server) cpu() (self, srv time.Duration) {
	self = procCPU("/proc/self/stat")
	if s.pid != 0 {
		srv = procCPU(fmt.Sprintf("/proc/%d/stat", s.pid))
	}
	return self, srv
}

// procCPU reads utime and stime (fields 14 and 15, in clock ticks of 1/100 s) of a /proc/<pid>/stat file.
func procCPU(path string) time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	_, rest, ok := strings.Cut(string(b), ") ") // the command name may hold spaces
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// meter measures the wall and CPU time of one phase.
type meter struct {
	s           *server
	start       time.Time
	self0, srv0 time.Duration
}

func (s *server) meter() meter {
	m := meter{s: s, start: time.Now()}
	m.self0, m.srv0 = s.cpu()
	return m
}

// Usage is the wall time of a phase and the CPU time this process and the
// server spent in it, in seconds; ServerCPU is 0 unless the server runs in a
// child process.
type Usage struct {
	Wall      float64 `json:"wall_seconds"`
	ClientCPU float64 `json:"client_cpu_seconds"`
	ServerCPU float64 `json:"server_cpu_seconds"`
}

func (m meter) stop() Usage {
	self, srv := m.s.cpu()
	return Usage{Wall: time.Since(m.start).Seconds(), ClientCPU: (self - m.self0).Seconds(), ServerCPU: (srv - m.srv0).Seconds()}
}

// startServer connects to cfg.URL, or starts a fresh server in a child
// process or in this process with storage under dir.
func startServer(cfg Config, dir string) (*server, error) {
	s := &server{stop: func() {}}
	switch {
	case cfg.URL != "":
		s.url, s.mode = cfg.URL, "url"
	case len(cfg.Child) > 0:
		url, pid, stop, err := startChild(cfg.Child, dir, cfg.SyncInterval)
		if err != nil {
			return nil, err
		}
		s.url, s.mode, s.stop, s.pid = url, "child process", stop, pid
	default:
		srv, err := embedded.Start(embedded.Config{StoreDir: dir, SyncInterval: cfg.SyncInterval})
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

// startChild runs argv as a child server on dir, passing ServerProfileEnv
// on as the child's profile file.
func startChild(argv []string, dir string, sync time.Duration) (string, int, func(), error) {
	env := []string{embedded.ChildSyncEnv + "=always"}
	if sync > 0 {
		env[0] = embedded.ChildSyncEnv + "=" + sync.String()
	}
	if path := os.Getenv(ServerProfileEnv); path != "" {
		env = append(env, embedded.ChildProfileEnv+"="+path)
	}
	return embedded.StartChild(argv, dir, env...)
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
