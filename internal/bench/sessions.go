package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/internal/heapwatch"
	"github.com/seamguard/seamguard/processor"
)

// SessionsResult is what many live sessions cost the processor: memory per
// session and snapshot writes as the number of sessions grows.
type SessionsResult struct {
	Sessions int `json:"sessions"`
	Events   int `json:"events"`
	// Where the server ran: when "in process", RSS includes the server's
	// own memory and says little about the processor's.
	Server         string  `json:"server"`
	RSSBase        uint64  `json:"rss_base_bytes"`
	RSSAfter       uint64  `json:"rss_after_bytes"`
	RSSPeak        uint64  `json:"rss_peak_bytes"` // VmHWM: includes the publisher's buffers
	RSSPerSession  float64 `json:"rss_per_session_bytes"`
	HeapPerSession float64 `json:"heap_per_session_bytes"` // Go heap in use, after a GC
	// Snapshot bytes in the session bucket per session.
	SnapshotBytes float64 `json:"snapshot_bytes_per_session"`
	// MaxSessions is the processor's cap on sessions in memory; Held is how
	// many it held at the end, Dropped how many left memory past the cap.
	MaxSessions int     `json:"max_sessions"`
	Held        int     `json:"held_sessions"`
	Dropped     uint64  `json:"dropped_sessions"`
	Stages      []Stage `json:"stages"`
}

// Stage is one slice of the sessions: how fast they were opened (published
// and processed) with Sessions live at its end.
type Stage struct {
	Sessions       int     `json:"sessions"` // live at the end of the stage
	Seconds        float64 `json:"seconds"`
	EventsPerSec   float64 `json:"events_per_sec"`
	WritesPerSec   float64 `json:"snapshot_writes_per_sec"`
	WritesPerEvent float64 `json:"snapshot_writes_per_event"`
}

func runSessions(ctx context.Context, s *server, n, turns int, heapProfile string, progress func(string, ...any)) (*SessionsResult, error) {
	cfg := benchProcessorConfig("benchs")
	p, err := processor.New(ctx, s.js, cfg, procOpts()...)
	if err != nil {
		return nil, err
	}
	defer dropResources(context.WithoutCancel(ctx), s.js, cfg)
	res := &SessionsResult{Sessions: n, Server: s.mode}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	for p.Ready() != nil {
		if err := waitCtx(ctx, 5*time.Millisecond); err != nil {
			return nil, err
		}
	}
	kvStream, err := s.js.Stream(ctx, "KV_"+cfg.Names().Sessions)
	if err != nil {
		return nil, err
	}
	res.RSSBase, _ = settledMemory()
	heapBase := heapwatch.InUse()

	g := newGen(cfg.Subjects(), Seed+2)
	const stages = 10
	const chunk = 1_000
	per := max(n/stages, 1)
	var total uint64
	var lastWrites uint64
	for opened := 0; opened < n; {
		stage := min(per, n-opened)
		start := time.Now()
		for done := 0; done < stage; done += chunk {
			k := min(chunk, stage-done)
			msgs := make([]*nats.Msg, 0, k*(turns+1))
			for i := range k {
				id := fmt.Sprintf("s%07d", opened+done+i)
				msgs = append(msgs, g.open(id, 12))
				for t := range turns {
					msgs = append(msgs, g.turn(id, uint64(t), 256))
				}
			}
			if _, err := publishAll(ctx, s.js, msgs, 4096); err != nil {
				return nil, err
			}
			total += uint64(len(msgs))
		}
		for st := p.Stats(); st.Handled+st.CaughtUp < total; st = p.Stats() {
			select {
			case err := <-done:
				return nil, fmt.Errorf("bench: processor stopped: %v", err)
			case <-time.After(2 * time.Millisecond):
			}
		}
		opened += stage
		took := time.Since(start)
		info, err := kvStream.Info(ctx)
		if err != nil {
			return nil, err
		}
		writes := info.State.LastSeq - lastWrites
		lastWrites = info.State.LastSeq
		events := stage * (turns + 1)
		res.Stages = append(res.Stages, Stage{
			Sessions: opened, Seconds: took.Seconds(), EventsPerSec: float64(events) / took.Seconds(),
			WritesPerSec: float64(writes) / took.Seconds(), WritesPerEvent: float64(writes) / float64(events),
		})
		progress("sessions: %d live, %.0f events/s, %.0f snapshot writes/s", opened, float64(events)/took.Seconds(), float64(writes)/took.Seconds())
	}
	res.Events = int(total)
	for {
		pending, err := ackPending(ctx, s.js, p.Config())
		if err != nil {
			return nil, err
		}
		if pending == 0 {
			break
		}
		if err := waitCtx(ctx, 10*time.Millisecond); err != nil {
			return nil, err
		}
	}
	info, err := kvStream.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.State.Msgs != uint64(n) {
		return nil, fmt.Errorf("bench: the session bucket holds %d sessions, want %d", info.State.Msgs, n)
	}
	res.SnapshotBytes = float64(info.State.Bytes) / float64(n)
	res.RSSAfter, res.RSSPeak = settledMemory()
	res.HeapPerSession = (float64(heapwatch.InUse()) - float64(heapBase)) / float64(n)
	res.RSSPerSession = (float64(res.RSSAfter) - float64(res.RSSBase)) / float64(n)
	st := p.Stats()
	res.MaxSessions, res.Held, res.Dropped = p.Config().MaxSessions, st.Sessions, st.Dropped
	if heapProfile != "" {
		if err := writeHeapProfile(heapProfile); err != nil {
			return nil, err
		}
	}
	runtime.KeepAlive(p) // the sessions live in p's shards until here
	cancel()
	if err := <-done; err != nil {
		return nil, err
	}
	return res, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: heap profile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: heap profile: %w", err)
	}
	return f.Close()
}

// settledMemory collects garbage, returns freed memory to the system and
// reads the process's resident set size and its peak (VmRSS, VmHWM; 0
// where /proc is not there).
func settledMemory() (rss, hwm uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	time.Sleep(100 * time.Millisecond)
	debug.FreeOSMemory()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) < 1 {
			continue
		}
		kb, _ := strconv.ParseUint(fields[0], 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm
}
