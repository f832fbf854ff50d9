package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// TestDemo runs the README's main command in-process: it must tell the whole
// story and exit 0 with nothing else running.
func TestDemo(t *testing.T) {
	code, out, stderr := runCLI(t, "", "demo")
	require.Equal(t, 0, code, "stderr: %s\nstdout: %s", stderr, out)
	// The spill of the story file, as `seamguard check` makes it (the
	// golden file) and as the walkthrough's publish does.
	var golden struct {
		Data events.SpillHandle `json:"data"`
	}
	b, err := os.ReadFile(filepath.Join(storiesDir, "golden", "seed-story.out.jsonl"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(b), "\n")
	require.NoError(t, json.Unmarshal([]byte(first), &golden))
	require.Equal(t, "ops-agent-42/1.jsonl", golden.Data.Name)

	for _, want := range []string{
		"embedded NATS JetStream at nats://127.0.0.1:",
		"the events of testdata/stories/seed-story.jsonl, one by one",
		"budget enforcement truncates turns [0, 8)",
		fmt.Sprintf("-> transcript.spilled  seamguard-spills/ops-agent-42/1.jsonl: 55 events, %d bytes, %s\n", golden.Data.Size, golden.Data.Digest),
		"the same bytes, so the same digest, as the spill that publishing testdata/stories/seed-story.jsonl makes",
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

	// Every term is explained, once, in one line, before or where it is
	// first used.
	for _, term := range []string{"offset", "recovery floor", "[0, 8)", "truncated", "summary, input, tail", "classic check",
		"spill", "coverage_hole", "retry", "cured", "commit", "digest", "pinned", "pin_dropped", "carry_pins"} {
		gloss := "(" + term + ": "
		assert.Equal(t, 1, strings.Count(out, gloss), "the term %q is explained once", term)
	}
	for _, use := range []struct{ term, first string }{
		{"offset", "offsets count turns"},
		{"recovery floor", "recovery floor = the last 12 turns"},
		{"classic check", "the classic check passes this"},
		{"spill", "-> transcript.spilled"},
		{"coverage_hole", "-> compaction.refused  coverage_hole"},
		{"pin_dropped", "-> compaction.refused  pin_dropped"},
		{"cured", "cured [coverage_hole]"},
		{"carry_pins", "next: carry_pins"},
	} {
		i, j := strings.Index(out, use.first), strings.Index(out, "("+use.term+": ")
		require.GreaterOrEqual(t, i, 0, use.first)
		require.GreaterOrEqual(t, j, 0, use.term)
		assert.Less(t, i, j, "%q is explained after its first use", use.term)
		assert.NotContains(t, out[i:j], "\n\n", "%q is explained right under its first use", use.term)
	}
	assert.NotContains(t, out, "seed's", "a term the demo never explains")
	// No line a terminal must wrap far: the processor's long messages are
	// not printed.
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		assert.LessOrEqual(t, len([]rune(sc.Text())), 160, "a line of the demo too long to read: %q", sc.Text())
	}
}

// TestDemoPlaysTheStoryFile: the events the demo publishes for its first
// session are the story file's: the same ids, times and data, byte for
// byte, so that its spill is the walkthrough's.
func TestDemoPlaysTheStoryFile(t *testing.T) {
	a := &agent{subj: processor.Config{}.Subjects(), session: demoSession}
	type ev struct {
		typ  string
		data any
	}
	var evs []ev
	evs = append(evs, ev{"session.opened", demoOpened})
	for _, turn := range demoTurns() {
		evs = append(evs, ev{"turn.appended", turn})
		if turn.Offset == 47 {
			evs = append(evs, ev{"context.truncated", demoTruncation})
		}
	}
	evs = append(evs, ev{"compaction.requested", demoRequest(nil)}, ev{"compaction.requested", demoRequest(nil)}, ev{"compaction.committed", demoCommit})

	f, err := os.Open(filepath.Join("..", "..", demoStoryFile))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	i := 0
	for ; sc.Scan(); i++ {
		require.Less(t, i, len(evs), "the story file has more events than the demo")
		var line struct {
			SpecVersion     string          `json:"specversion"`
			ID              string          `json:"id"`
			Source          string          `json:"source"`
			Type            string          `json:"type"`
			Subject         string          `json:"subject"`
			Time            string          `json:"time"`
			DataContentType string          `json:"datacontenttype"`
			Data            json.RawMessage `json:"data"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line))
		m, err := a.message(evs[i].typ, evs[i].data)
		require.NoError(t, err)
		for attr, want := range map[string]string{
			"ce-specversion": line.SpecVersion, "ce-id": line.ID, "ce-source": line.Source, "ce-type": line.Type,
			"ce-subject": line.Subject, "ce-time": line.Time, "Content-Type": line.DataContentType,
		} {
			assert.Equal(t, want, m.Header.Get(attr), "event %d: %s", i+1, attr)
		}
		assert.Equal(t, string(line.Data), string(m.Data), "event %d: data", i+1)
	}
	require.NoError(t, sc.Err())
	assert.Equal(t, len(evs), i, "the demo plays every event of the story file, and no more")
}
