package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Config says how big a run is and where the server is. The zero value is
// a full run on an embedded server in this process.
type Config struct {
	// Quick makes every measurement small: the whole run takes well under
	// a minute. CI runs it to keep the harness working.
	Quick bool
	// URL is a NATS server to measure against; empty means a fresh
	// embedded server for each measurement, in a child process when Child
	// is set, else in this process.
	URL string
	// Child is the command line of a child process that serves the
	// embedded server (it must call ServeChild first thing).
	Child []string
	// Dir holds the servers' storage and scratch files; empty means a new
	// temporary directory, removed at the end.
	Dir string
	// Progress receives a line as each step starts; nil discards.
	Progress io.Writer
	// HeapProfile, when set, names a file to write a heap profile to while
	// the sessions of measurement 3's largest size are held.
	HeapProfile string
	// SessionsCPUProfile, when set, names a file to write a CPU profile of
	// this process to while seamguard decides the events of measurement
	// 3's largest size (with an in-process server, the server's work is in
	// it too).
	SessionsCPUProfile string
	// IngestCPUProfile, when set, names a file to write a CPU profile of
	// this process to while the processor (atomic batches) decides the
	// last round of the first ingest measurement (1 KiB bodies; with an
	// in-process server, the server's work is in it too).
	IngestCPUProfile string
	// SessionSizes are the numbers of live sessions measurement 3 measures
	// at, ascending; nil means 100,000, 500,000 and 1,000,000 (Quick: a
	// few thousand).
	SessionSizes []int
	// SessionEvents is how many events each run of each size of
	// measurement 3 decides, one each for as many distinct sessions; 0
	// means 20,000 (Quick: 1,000). The runs of a size (seamguard and
	// per-message writes, and at the largest size the lazy run when there
	// is one) decide events of distinct sessions: a size with fewer
	// sessions than that needs takes its share of them for each run.
	SessionEvents int
	// Skip names measurements to leave out: "ingest", "latency", "http",
	// "sessions", "decision", "spill".
	Skip []string
	// SyncInterval is how the servers the run starts sync: 0 (the
	// default, as serve's) fsyncs every write before acknowledging it; a
	// positive interval acknowledges first. Both sides of every ratio run
	// on the same server, so with the same setting. Ignored with URL.
	SyncInterval time.Duration
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.SyncInterval < 0 {
		errs = append(errs, fmt.Errorf("bench: SyncInterval %s is negative; 0 syncs every write", c.SyncInterval))
	}
	if c.URL != "" && len(c.Child) > 0 {
		errs = append(errs, errors.New("bench: both URL and Child are set; a run measures one server"))
	}
	for i, n := range c.SessionSizes {
		switch {
		case n < 3:
			errs = append(errs, fmt.Errorf("bench: SessionSizes holds %d; at least 3 (each run of a size decides sessions of its own)", n))
		case n > 9_999_999:
			errs = append(errs, fmt.Errorf("bench: SessionSizes holds %d; at most 9,999,999", n))
		case i > 0 && n <= c.SessionSizes[i-1]:
			errs = append(errs, fmt.Errorf("bench: SessionSizes %v is not ascending", c.SessionSizes))
		}
	}
	if c.SessionEvents < 0 {
		errs = append(errs, fmt.Errorf("bench: SessionEvents %d is negative; 0 means the default", c.SessionEvents))
	}
	known := map[string]bool{"ingest": true, "latency": true, "http": true, "sessions": true, "decision": true, "spill": true}
	for _, s := range c.Skip {
		if !known[s] {
			errs = append(errs, fmt.Errorf("bench: Skip names %q; use ingest, latency, http, sessions, decision or spill", s))
		}
	}
	return errors.Join(errs...)
}

func (c Config) skips(name string) bool {
	for _, s := range c.Skip {
		if s == name {
			return true
		}
	}
	return false
}

// Report is what one run measured. Ratios are seamguard's figure over raw
// JetStream's, measured on the same server in the same run.
type Report struct {
	Started time.Time `json:"started"`
	Took    string    `json:"took"`
	Quick   bool      `json:"quick"`
	Server  string    `json:"server"` // "url", "child process" or "in process"
	// Sync is how the servers synced: "always", an interval, or "as
	// configured" for a server at URL.
	Sync     string           `json:"sync"`
	CPUs     int              `json:"cpus"`
	GoVer    string           `json:"go"`
	Ingest   []IngestResult   `json:"ingest,omitempty"`
	Latency  *LatencyResult   `json:"latency,omitempty"`
	HTTP     *HTTPResult      `json:"http,omitempty"`
	Sessions *SessionsResult  `json:"sessions,omitempty"`
	Decision *DecisionResult  `json:"decision,omitempty"`
	Spill    *SpillResult     `json:"spill,omitempty"`
	Rows     []Row            `json:"rows"`
	Targets  map[string]*bool `json:"targets_met"`
}

// Row is one line of the table.
type Row struct {
	Item      string  `json:"item"`
	Metric    string  `json:"metric"`
	Seamguard string  `json:"seamguard"`
	Raw       string  `json:"raw"`
	Ratio     float64 `json:"ratio,omitempty"`
	Target    string  `json:"target"`
	Met       *bool   `json:"met,omitempty"`
}

// Run runs every measurement not skipped and returns the report. ctx
// bounds the whole run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "seamguard-bench-")
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	r := &Report{Started: time.Now().UTC(), Quick: cfg.Quick, CPUs: runtime.NumCPU(), GoVer: runtime.Version(), Targets: map[string]*bool{}}
	switch {
	case cfg.URL != "":
		r.Sync = "as configured"
	case cfg.SyncInterval == 0:
		r.Sync = "always"
	default:
		r.Sync = cfg.SyncInterval.String()
	}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "bench: "+format+"\n", args...)
		}
	}
	step := 0
	// with runs f against a fresh server (or the one at URL).
	with := func(name string, f func(*server) error) error {
		if cfg.skips(name) {
			return nil
		}
		step++
		srv, err := startServer(cfg, filepath.Join(dir, fmt.Sprintf("%d-%s", step, name)))
		if err != nil {
			return err
		}
		defer srv.close()
		r.Server = srv.mode
		progress("%s (server: %s)", name, srv.mode)
		if err := f(srv); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	sz := sizes(cfg.Quick)
	err := errors.Join(
		with("ingest", func(s *server) error {
			for i, body := range sz.ingestBodies {
				prof := ""
				if i == 0 {
					prof = cfg.IngestCPUProfile
				}
				res, err := runIngest(ctx, s, fmt.Sprintf("i%d", i), body, sz.ingestEvents[i], sz.ingestSessions, sz.ingestRounds, prof, progress)
				if err != nil {
					return err
				}
				r.Ingest = append(r.Ingest, res)
			}
			return nil
		}),
		with("latency", func(s *server) error {
			res, err := runLatency(ctx, s, sz.latencyRequests, progress)
			r.Latency = res
			return err
		}),
		with("http", func(s *server) error {
			res, err := runHTTP(ctx, s, sz.httpEvents, sz.ingestSessions, sz.httpRounds, sz.httpRequests, progress)
			r.HTTP = res
			return err
		}),
		func() error {
			// The sessions measurement restarts its server between
			// writing the sessions and measuring, so it starts its own.
			if cfg.skips("sessions") {
				return nil
			}
			step++
			progress("sessions")
			sizes, perSize := sz.sessionSizes, sz.sessionEvents
			if len(cfg.SessionSizes) > 0 {
				sizes = cfg.SessionSizes
			}
			if cfg.SessionEvents > 0 {
				perSize = cfg.SessionEvents
			}
			res, err := runSessions(ctx, cfg, filepath.Join(dir, fmt.Sprintf("%d-sessions", step)), sizes, perSize, cfg.HeapProfile, cfg.SessionsCPUProfile, progress)
			r.Sessions = res
			if res != nil {
				r.Server = res.Server
			}
			if err != nil {
				return fmt.Errorf("sessions: %w", err)
			}
			return nil
		}(),
		func() error {
			if cfg.skips("decision") {
				return nil
			}
			progress("decision (no server)")
			res, err := runDecision(ctx, sz.decisionSizes, sz.decisionTime)
			r.Decision = res
			return err
		}(),
		with("spill", func(s *server) error {
			res, err := runSpill(ctx, s, filepath.Join(dir, "spill-scratch"), sz.spillSizes, sz.spillRounds, progress)
			r.Spill = res
			return err
		}),
	)
	r.Took = time.Since(r.Started).Round(time.Millisecond).String()
	r.rows()
	return r, err
}

// sizes of one run.
type runSizes struct {
	ingestBodies    []int
	ingestEvents    []int
	ingestSessions  int
	ingestRounds    int
	latencyRequests int
	sessionSizes    []int
	sessionEvents   int
	httpEvents      int
	httpRounds      int
	httpRequests    int
	decisionSizes   []int
	decisionTime    time.Duration
	spillSizes      []int64 // the last is the one compared with a raw put
	spillRounds     int
}

func sizes(quick bool) runSizes {
	if quick {
		return runSizes{
			ingestBodies: []int{1 << 10, 8 << 10}, ingestEvents: []int{4_000, 1_000}, ingestSessions: 10, ingestRounds: 1,
			latencyRequests: 100,
			httpEvents:      2_000, httpRounds: 1, httpRequests: 50,
			sessionSizes: []int{1_000, 3_000}, sessionEvents: 1_000,
			decisionSizes: []int{1_000, 10_000, 100_000}, decisionTime: 100 * time.Millisecond,
			spillSizes: []int64{4 << 20, 16 << 20}, spillRounds: 1,
		}
	}
	// Ingest rounds last seconds, so that the processor's start (tens of
	// milliseconds, Round.FirstMs) is a small part of each.
	return runSizes{
		ingestBodies: []int{1 << 10, 8 << 10}, ingestEvents: []int{150_000, 36_000}, ingestSessions: 100, ingestRounds: 5,
		latencyRequests: 2_000,
		httpEvents:      5_000, httpRounds: 3, httpRequests: 1_000,
		sessionSizes: []int{100_000, 500_000, 1_000_000}, sessionEvents: 20_000,
		decisionSizes: []int{1_000, 10_000, 100_000}, decisionTime: time.Second,
		spillSizes: []int64{64 << 20, 256 << 20}, spillRounds: 3,
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func met(ok bool) *bool { return &ok }

// cpuMetric describes the ingest measurement's CPU row: CPU per event of
// the processor and of the raw consumer, split between the bench process
// and the server when the server runs in a process of its own.
func cpuMetric(sg, raw CPUPerEvent, rounds int) string {
	if sg.ServerMicros == 0 && raw.ServerMicros == 0 {
		return fmt.Sprintf("CPU per event, server and client together, median of %d (%.2f vs %.2f cores busy)", rounds, sg.CoresBusy, raw.CoresBusy)
	}
	return fmt.Sprintf("CPU per event, median of %d: processor %.1f + server %.1f µs (%.2f cores busy) vs raw consumer %.1f + server %.1f µs (%.2f cores busy)",
		rounds, sg.ProcessMicros, sg.ServerMicros, sg.CoresBusy, raw.ProcessMicros, raw.ServerMicros, raw.CoresBusy)
}

// rows builds the table from the results.
func (r *Report) rows() {
	add := func(key string, row Row) {
		r.Rows = append(r.Rows, row)
		if row.Met != nil {
			r.Targets[key] = row.Met
		}
	}
	for _, in := range r.Ingest {
		add(fmt.Sprintf("ingest_%dk", in.BodyBytes>>10), Row{
			Item: "1 ingest", Metric: fmt.Sprintf("events/s, %d KiB bodies, %d events, %d sessions, median of %d (%.2f snapshot writes/event), vs a raw pull consumer reading them (a read rate)", in.BodyBytes>>10, in.Events, in.Sessions, in.Rounds, in.WritesPerEvent),
			Seamguard: fmt.Sprintf("%.0f", in.SeamguardPerSec), Raw: fmt.Sprintf("%.0f", in.RawPerSec),
			Ratio: in.Ratio, Target: ">= 0.7", Met: met(in.Ratio >= 0.7),
		})
		add("", Row{
			Item: "1 ingest", Metric: fmt.Sprintf("  raw durable publish of the first %d of the same events, pipelined (a write rate, median of %d)", in.PublishEvents, in.Rounds),
			Seamguard: fmt.Sprintf("%.0f", in.SeamguardPerSec), Raw: fmt.Sprintf("%.0f", in.RawPublishPerSec),
			Ratio: in.PublishRatio, Target: "(anchor)",
		})
		add("", Row{
			Item: "1 ingest", Metric: fmt.Sprintf("  the same through the processor's consumer layout, no processing (median of %d)", in.Rounds),
			Seamguard: fmt.Sprintf("%.0f", in.LayoutPerSec), Raw: fmt.Sprintf("%.0f", in.RawPerSec),
			Ratio: in.LayoutRatio, Target: "(reference)",
		})
		add("", Row{
			Item: "1 ingest", Metric: fmt.Sprintf("  per-message writes (NoAtomicBatches), vs the raw pull consumer (median of %d)", in.Rounds),
			Seamguard: fmt.Sprintf("%.0f", in.PerMessagePerSec), Raw: fmt.Sprintf("%.0f", in.RawPerSec),
			Ratio: in.PerMessageRatio, Target: "(report)",
		})
		add("", Row{
			Item: "1 ingest", Metric: fmt.Sprintf("  atomic batches (the default) vs per-message writes: what batching buys (%d batches, %.1f writes each, %d fell back)", in.AtomicBatches, ratio(float64(in.BatchedWrites), float64(in.AtomicBatches)), in.BatchFallbacks),
			Seamguard: fmt.Sprintf("%.0f", in.SeamguardPerSec), Raw: fmt.Sprintf("%.0f (per-message)", in.PerMessagePerSec),
			Ratio: in.AtomicOverPerMessage, Target: "(report)",
		})
		add("", Row{
			Item: "1 ingest", Metric: "  " + cpuMetric(in.SeamguardCPU, in.RawCPU, in.Rounds),
			Seamguard: fmt.Sprintf("%.1f µs", in.SeamguardCPU.TotalMicros), Raw: fmt.Sprintf("%.1f µs", in.RawCPU.TotalMicros),
			Ratio: ratio(in.SeamguardCPU.TotalMicros, in.RawCPU.TotalMicros), Target: "(report)",
		})
	}
	if h := r.HTTP; h != nil {
		add("http_ingest", Row{Item: "2b http", Metric: fmt.Sprintf("events/s through the HTTP gateway, binary mode (one event a request, %d clients), %d events of 1 KiB, %d sessions, decided, median of %d, vs the same published on NATS", h.Concurrency, h.Events, h.Sessions, h.Rounds),
			Seamguard: fmt.Sprintf("%.0f", h.BinaryPerSec), Raw: fmt.Sprintf("%.0f (NATS)", h.NATSPerSec), Ratio: h.BinaryRatio, Target: ">= 0.5", Met: met(h.BinaryRatio >= 0.5)})
		add("", Row{Item: "2b http", Metric: fmt.Sprintf("  batched mode (%d events a request, %d clients), vs the same published on NATS", h.BatchEvents, h.Concurrency),
			Seamguard: fmt.Sprintf("%.0f", h.BatchPerSec), Raw: fmt.Sprintf("%.0f (NATS)", h.NATSPerSec), Ratio: h.BatchRatio, Target: "(report)"})
		add("http_latency_p50", Row{Item: "2b http", Metric: fmt.Sprintf("p50 of %d requests to their verdicts: POST ?wait= vs NATS publish and subscribe", h.Requests),
			Seamguard: dur(h.HTTPLatency.P50), Raw: dur(h.NATSLatency.P50) + " (NATS)", Ratio: h.LatencyRatio, Target: "<= 2", Met: met(h.LatencyRatio <= 2)})
		add("", Row{Item: "2b http", Metric: fmt.Sprintf("  p99 of %d requests, the same", h.Requests),
			Seamguard: dur(h.HTTPLatency.P99), Raw: dur(h.NATSLatency.P99) + " (NATS)", Ratio: ratio(h.HTTPLatency.P99, h.NATSLatency.P99), Target: "(report)"})
	}
	if l := r.Latency; l != nil {
		add("latency_p50", Row{Item: "2 latency", Metric: fmt.Sprintf("p50 of %d requests", l.Requests),
			Seamguard: dur(l.Seamguard.P50), Raw: dur(l.Raw.P50), Ratio: ratio(l.Seamguard.P50, l.Raw.P50), Target: "<= 2", Met: met(ratio(l.Seamguard.P50, l.Raw.P50) <= 2)})
		add("latency_p99", Row{Item: "2 latency", Metric: fmt.Sprintf("p99 of %d requests", l.Requests),
			Seamguard: dur(l.Seamguard.P99), Raw: dur(l.Raw.P99), Ratio: ratio(l.Seamguard.P99, l.Raw.P99), Target: "<= 3", Met: met(ratio(l.Seamguard.P99, l.Raw.P99) <= 3)})
	}
	if s := r.Sessions; s != nil && len(s.Sizes) > 0 {
		for i, z := range s.Sizes {
			largest := i == len(s.Sizes)-1
			target, ok := "(report)", (*bool)(nil)
			if z.Sessions >= 1_000_000 {
				target, ok = ">= 0.5", met(z.Ratio >= 0.5)
			}
			lowest := 0.0
			for _, a := range z.anchors() {
				if a.name == z.Lowest {
					lowest = a.v
				}
			}
			add(fmt.Sprintf("sessions_%d", z.Sessions), Row{Item: "3 sessions", Metric: fmt.Sprintf("events/s at %s live sessions, %s events one per session, vs the lowest anchor (%s); sync %s", thousands(z.Sessions), thousands(z.Events), z.Lowest, s.Sync),
				Seamguard: fmt.Sprintf("%.0f", z.SeamguardPerSec), Raw: fmt.Sprintf("%.0f", lowest), Ratio: z.Ratio, Target: target, Met: ok})
			for _, a := range []struct {
				key, what string
				v         float64
				target    string
				met       *bool
			}{
				{"", "raw KV puts/s of existing keys, pipelined", z.PutPerSec, "(anchor)", nil},
				{"sessions_cas", "raw KV compare-and-set updates/s, pipelined", z.CASPerSec, ">= 3", met(z.CASRatio >= 3)},
				{"", "raw consume of the same events/s, AckAll per fetch", z.ConsumePerSec, "(anchor)", nil},
			} {
				if a.key != "" && !largest {
					a.key, a.target, a.met = "", "(anchor)", nil
				}
				add(a.key, Row{Item: "3 sessions", Metric: fmt.Sprintf("  %s, %s keys", a.what, thousands(z.Sessions)),
					Seamguard: fmt.Sprintf("%.0f", z.SeamguardPerSec), Raw: fmt.Sprintf("%.0f", a.v), Ratio: ratio(z.SeamguardPerSec, a.v), Target: a.target, Met: a.met})
			}
			if z.GetPerSec > 0 {
				add("", Row{Item: "3 sessions", Metric: fmt.Sprintf("  raw KV gets/s of existing keys not read before, 64 at a time, %s keys", thousands(z.Sessions)),
					Seamguard: fmt.Sprintf("%.0f", z.SeamguardPerSec), Raw: fmt.Sprintf("%.0f", z.GetPerSec), Ratio: ratio(z.SeamguardPerSec, z.GetPerSec), Target: "(reference)"})
			}
			add("", Row{Item: "3 sessions", Metric: fmt.Sprintf("  per-message writes (NoAtomicBatches): events/s on %s other sessions, vs raw KV compare-and-set updates/s", thousands(z.Events)),
				Seamguard: fmt.Sprintf("%.0f", z.PerMessagePerSec), Raw: fmt.Sprintf("%.0f", z.CASPerSec), Ratio: ratio(z.PerMessagePerSec, z.CASPerSec), Target: "(report)"})
			add("", Row{Item: "3 sessions", Metric: fmt.Sprintf("  atomic batches (the default) vs per-message writes: what batching buys (%d batches, %.1f writes each, %d fell back)", z.AtomicBatches, ratio(float64(z.BatchedWrites), float64(z.AtomicBatches)), z.BatchFallbacks),
				Seamguard: fmt.Sprintf("%.0f", z.SeamguardPerSec), Raw: fmt.Sprintf("%.0f (per-message)", z.PerMessagePerSec), Ratio: z.AtomicOverPerMessage, Target: "(report)"})
			if !largest {
				continue
			}
			if z.LazyPerSec > 0 {
				add("sessions_lazy", Row{Item: "3 sessions", Metric: fmt.Sprintf("events/s at %s live sessions, sync always vs the same server restarted syncing every %s (lazy), %s other sessions", thousands(z.Sessions), s.LazySync, thousands(z.Events)),
					Seamguard: fmt.Sprintf("%.0f", z.SeamguardPerSec), Raw: fmt.Sprintf("%.0f (lazy)", z.LazyPerSec), Ratio: z.LazyRatio, Target: ">= 0.8", Met: met(z.LazyRatio >= 0.8)})
			} else if s.LazySkipped != "" {
				add("", Row{Item: "3 sessions", Metric: "sync always vs lazy: skipped, " + s.LazySkipped, Seamguard: "-", Raw: "-", Target: "-"})
			}
		}
		if n := len(s.Sizes); n > 1 {
			first, last := s.Sizes[0], s.Sizes[n-1]
			target, ok := "(report)", (*bool)(nil)
			if last.Sessions >= 1_000_000 && first.Sessions <= 100_000 {
				target, ok = ">= 0.9", met(ratio(last.SeamguardPerSec, first.SeamguardPerSec) >= 0.9)
			}
			add("sessions_scale", Row{Item: "3 sessions", Metric: fmt.Sprintf("events/s at %s vs %s live sessions", thousands(last.Sessions), thousands(first.Sessions)),
				Seamguard: fmt.Sprintf("%.0f vs %.0f", last.SeamguardPerSec, first.SeamguardPerSec), Raw: "-", Ratio: ratio(last.SeamguardPerSec, first.SeamguardPerSec), Target: target, Met: ok})
			if first.GetPerSec > 0 && last.GetPerSec > 0 {
				add("", Row{Item: "3 sessions", Metric: fmt.Sprintf("  raw KV gets/s at %s vs %s keys (the broker's own fall)", thousands(last.Sessions), thousands(first.Sessions)),
					Seamguard: "-", Raw: fmt.Sprintf("%.0f vs %.0f", last.GetPerSec, first.GetPerSec), Ratio: ratio(last.GetPerSec, first.GetPerSec), Target: "(reference)"})
			}
		}
		// Every session seamguard's round at the largest size touched is held, most with a live
		// ledger: the cost of a held session, not of one opened.
		add("", Row{Item: "3 sessions", Metric: fmt.Sprintf("RSS per session held in memory after seamguard's round at the largest size, %d held (cap %d; heap: %.0f B)", s.Held, s.MaxSessions, s.HeapPerSession),
			Seamguard: fmt.Sprintf("%.0f B", s.RSSPerSession), Raw: "-", Target: "(report)"})
		if rec := s.Recovery; rec != nil {
			if rec.Skipped != "" {
				add("", Row{Item: "3 sessions", Metric: "recovery after SIGKILL of server and processor: skipped, " + rec.Skipped, Seamguard: "-", Raw: "-", Target: "-"})
			} else {
				add("", Row{Item: "3 sessions", Metric: fmt.Sprintf("recovery after SIGKILL of server and processor at %s live sessions, sync %s: time to the first decision (server restart %s + processor start to decision %s, of which %s until it took the crashed instance's lease, TTL %s)",
					thousands(rec.Sessions), rec.Sync, dur(rec.ServerRestart), dur(rec.FirstDecision), dur(rec.LeaseTaken), dur(rec.LeaseTTL)),
					Seamguard: dur(rec.Total), Raw: dur(rec.ServerRestart) + " (server restart)", Target: "(report)"})
			}
		}
	}
	if d := r.Decision; d != nil && len(d.Points) > 0 {
		last := d.Points[len(d.Points)-1]
		add("", Row{Item: "4 decision", Metric: fmt.Sprintf("Step, %d vs %d truncated ranges", last.Truncated, d.Points[0].Truncated),
			Seamguard: fmt.Sprintf("%s vs %s", dur(last.StepNs/1e9), dur(d.Points[0].StepNs/1e9)), Raw: "-", Ratio: ratio(last.StepNs, d.Points[0].StepNs), Target: "(logarithmic)"})
		add("", Row{Item: "4 decision", Metric: fmt.Sprintf("speed-up over the seed's scan at %d truncations", last.Truncated),
			Seamguard: dur(last.StepNs / 1e9), Raw: dur(last.ScanNs/1e9) + " (scan)", Ratio: ratio(last.ScanNs, last.StepNs), Target: "(report)"})
	}
	if s := r.Spill; s != nil {
		add("spill", Row{Item: "5 spill", Metric: fmt.Sprintf("MB/s, %d MiB transcript, vs object store put (median of %d)", s.Bytes>>20, s.Rounds),
			Seamguard: fmt.Sprintf("%.0f", s.SpillMBps), Raw: fmt.Sprintf("%.0f", s.PutMBps), Ratio: s.Ratio, Target: ">= 0.5", Met: met(s.Ratio >= 0.5)})
		add("", Row{Item: "5 spill", Metric: fmt.Sprintf("  the same events read back and put with no processing (median of %d)", s.Rounds),
			Seamguard: fmt.Sprintf("%.0f", s.PipeMBps), Raw: fmt.Sprintf("%.0f", s.PutMBps), Ratio: s.PipeRatio, Target: "(reference)"})
		if a := s.Amplification; a != nil {
			add("", Row{Item: "5 spill", Metric: fmt.Sprintf("bytes written by %d spills of one session, a %d KiB turn a round: incremental vs the whole transcript each time", a.Rounds+1, a.TurnBytes>>10),
				Seamguard: fmt.Sprintf("%.1f MiB", mib(a.IncrementalBytes)), Raw: fmt.Sprintf("%.1f MiB", mib(a.FullBytes)), Ratio: a.Ratio, Target: "(report)"})
			add("", Row{Item: "5 spill", Metric: fmt.Sprintf("  time of one incremental spill vs the whole %.1f MiB transcript once", mib(a.IncrementalBytes)),
				Seamguard: dur(a.SpillSecs), Raw: dur(a.FullSecs), Ratio: ratio(a.FullSecs, a.SpillSecs), Target: "(report)"})
		}
		if len(s.Peaks) > 1 {
			a, b := s.Peaks[0], s.Peaks[len(s.Peaks)-1]
			add("spill_memory", Row{Item: "5 spill", Metric: fmt.Sprintf("peak heap growth, %d MiB vs %d MiB transcript", b.Bytes>>20, a.Bytes>>20),
				Seamguard: fmt.Sprintf("%.1f vs %.1f MiB", mib(b.PeakGrowth), mib(a.PeakGrowth)), Raw: "-", Ratio: ratio(float64(b.PeakGrowth), float64(a.PeakGrowth)),
				Target: "independent of size", Met: met(b.PeakGrowth < 64<<20 && float64(b.PeakGrowth) < 2*float64(max(a.PeakGrowth, 8<<20)))})
		}
	}
}

// thousands formats n with commas: 1,000,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// dur formats seconds.
func dur(s float64) string {
	return time.Duration(s * 1e9).Round(time.Microsecond / 10).String()
}

// WriteTable prints the table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "seamguard bench (%s, server %s, sync %s, %d CPUs, %s, took %s)\n\n", map[bool]string{true: "quick", false: "full"}[r.Quick], r.Server, r.Sync, r.CPUs, r.GoVer, r.Took)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "item\tmetric\tseamguard\traw JetStream\tratio\ttarget\tmet")
	for _, row := range r.Rows {
		ratio := ""
		if row.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f", row.Ratio)
		}
		m := ""
		if row.Met != nil {
			m = map[bool]string{true: "yes", false: "NO"}[*row.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Item, row.Metric, row.Seamguard, row.Raw, ratio, row.Target, m)
	}
	return tw.Flush()
}

// WriteJSON writes the whole report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Markdown renders the table as Markdown.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("| item | metric | seamguard | raw JetStream | ratio | target | met |\n|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		ratio := ""
		if row.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f", row.Ratio)
		}
		m := ""
		if row.Met != nil {
			m = map[bool]string{true: "yes", false: "no"}[*row.Met]
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", row.Item, row.Metric, row.Seamguard, row.Raw, ratio, row.Target, m)
	}
	return b.String()
}
