package bench

import (
	"strings"
	"testing"
)

func TestValidateSessionSizes(t *testing.T) {
	if err := (Config{SessionSizes: []int{2, 10}}).Validate(); err == nil || !strings.Contains(err.Error(), "at least 3") {
		t.Fatalf("sizes under 3: got %v, want an error saying at least 3", err)
	}
	if err := (Config{SessionSizes: []int{3, 10}}).Validate(); err != nil {
		t.Fatalf("sizes 3 and 10: %v", err)
	}
}

// TestRows checks the rows and targets of the ingest and sessions figures:
// the CAS target at the largest size only, the lazy target, and the
// recovery row, measured or skipped.
func TestRows(t *testing.T) {
	r := &Report{Targets: map[string]*bool{},
		Ingest: []IngestResult{{BodyBytes: 1 << 10, Rounds: 1, RawPerSec: 100, SeamguardPerSec: 80, Ratio: 0.8,
			RawPublishPerSec: 40, PublishRatio: 2, PerMessagePerSec: 60, PerMessageRatio: 0.6, AtomicOverPerMessage: 80.0 / 60,
			SeamguardCPU: CPUPerEvent{ProcessMicros: 20, ServerMicros: 18, TotalMicros: 38, CoresBusy: 1.4},
			RawCPU:       CPUPerEvent{ProcessMicros: 3, ServerMicros: 16, TotalMicros: 19, CoresBusy: 1.7}}},
		Sessions: &SessionsResult{Sync: "always", LazySync: "2m0s",
			Sizes: []SessionsSize{
				{Sessions: 100, Events: 50, SeamguardPerSec: 10, CASPerSec: 5, CASRatio: 2, PerMessagePerSec: 8},
				{Sessions: 300, Events: 100, SeamguardPerSec: 12, CASPerSec: 3, CASRatio: 4, PerMessagePerSec: 6, LazyPerSec: 10, LazyRatio: 1.2},
			},
			Recovery: &Recovery{Sessions: 300, Sync: "always", ServerRestart: 0.5, FirstDecision: 15, Total: 15.5, LeaseTaken: 14.9, LeaseTTL: 15},
		},
	}
	r.rows()
	for key, want := range map[string]bool{"ingest_1k": true, "sessions_cas": true, "sessions_lazy": true} {
		got, ok := r.Targets[key]
		if !ok || *got != want {
			t.Errorf("target %s: got %v (present %v), want %v", key, got, ok, want)
		}
	}
	var table strings.Builder
	if err := r.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(a read rate)", "(a write rate", "per-message writes", "what batching buys", "(lazy)", "recovery after SIGKILL", "15.5s", "processor 20.0 + server 18.0 µs (1.40 cores busy) vs raw consumer 3.0 + server 16.0 µs"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, table.String())
		}
	}
	cas := 0
	for _, row := range r.Rows {
		if row.Target == ">= 3" {
			cas++
		}
	}
	if cas != 1 {
		t.Errorf("%d rows carry the CAS target; want 1, at the largest size", cas)
	}

	// Skipped: said so, with no target.
	r = &Report{Targets: map[string]*bool{}, Sessions: &SessionsResult{Sync: "2m0s", LazySkipped: "the run is already lazy (sync every 2m0s)",
		Sizes:    []SessionsSize{{Sessions: 300, Events: 100, SeamguardPerSec: 12, CASPerSec: 3, CASRatio: 4}},
		Recovery: &Recovery{Skipped: "the server runs in this process (--in-process): killing it would end the bench"}}}
	r.rows()
	if _, ok := r.Targets["sessions_lazy"]; ok {
		t.Error("a skipped lazy run has a target")
	}
	var skipped []string
	for _, row := range r.Rows {
		if strings.Contains(row.Metric, "skipped") {
			skipped = append(skipped, row.Metric)
		}
	}
	if len(skipped) != 2 {
		t.Errorf("rows saying skipped: %q; want the lazy run's and the recovery's", skipped)
	}
}

func TestCPUPerEvent(t *testing.T) {
	rs := []Round{
		{Usage: Usage{Wall: 2, ClientCPU: 2, ServerCPU: 1}},
		{Usage: Usage{Wall: 1, ClientCPU: 1, ServerCPU: 1}},
		{Usage: Usage{Wall: 4, ClientCPU: 3, ServerCPU: 3}},
	}
	got := cpuPerEvent(rs, 100_000)
	want := CPUPerEvent{ProcessMicros: 20, ServerMicros: 10, TotalMicros: 30, CoresBusy: 1.5}
	if got != want {
		t.Fatalf("cpuPerEvent = %+v, want %+v", got, want)
	}
	if z := cpuPerEvent(rs, 0); z != (CPUPerEvent{}) {
		t.Fatalf("no events: %+v, want zero", z)
	}
}
