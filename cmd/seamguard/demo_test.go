package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemo runs the README's main command in-process: it must tell the whole
// story and exit 0 with nothing else running.
func TestDemo(t *testing.T) {
	code, out, stderr := runCLI(t, "", "demo")
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", stderr, out)
	for _, want := range []string{
		"embedded NATS JetStream at nats://127.0.0.1:",
		"budget enforcement truncates turns [0, 8)",
		"-> transcript.spilled  seamguard-spills/ops-agent-42/1.jsonl: 55 events",
		"-> compaction.refused  coverage_hole at [0, 8)",
		"next: retry",
		"-> compaction.allowed  summary covers [8, 40); cured [coverage_hole] by ops-agent-42/1.jsonl",
		"the spill reads back whole (digest verified)",
		"Do not touch anything under /etc.",
		"seamguard spill get ops-agent-42/1.jsonl",
		// The same story with the rule pinned.
		"recoverable is not remembered",
		`Do not touch anything under /etc."  (pinned)`,
		"-> compaction.refused  pin_dropped at [0, 1)",
		"spill: ops-agent-43/1.jsonl, next: carry_pins",
		"the spill cures the hole, not the pin",
		"spill: none, next: carry_pins",
		`"carried_pins": [{"start": 0, "end": 1}]`,
		"-> compaction.allowed  summary covers [8, 40); cured [coverage_hole] by ops-agent-43/1.jsonl",
	} {
		assert.Contains(t, out, want)
	}
	assert.Less(t, strings.Index(out, "transcript.spilled"), strings.Index(out, "compaction.allowed"))
	pinned := out[strings.Index(out, "recoverable is not remembered"):]
	assert.Less(t, strings.Index(pinned, "spill: none, next: carry_pins"), strings.Index(pinned, "compaction.allowed"),
		"refused until the rule is carried, then allowed")
	// The retry lists pin_dropped alone and the hole as cured.
	retry := pinned[strings.Index(pinned, "the spill cures the hole, not the pin"):strings.Index(pinned, "spill: none, next: carry_pins")]
	assert.Contains(t, retry, "-> compaction.refused  pin_dropped at [0, 1)")
	assert.Contains(t, retry, "cured [coverage_hole]")
	assert.NotContains(t, retry, "coverage_hole at")
}
