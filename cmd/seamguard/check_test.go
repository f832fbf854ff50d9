package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/spill"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

const storiesDir = "../../testdata/stories"

// runCLI runs one seamguard command line in-process.
func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// TestCheckGolden runs `check` over every story under testdata/stories and
// compares its stdout and summary with the golden files; run with -update to
// rewrite them after a deliberate change. Every spill it writes must verify
// and hold exactly the story's accepted events.
func TestCheckGolden(t *testing.T) {
	stories, err := filepath.Glob(filepath.Join(storiesDir, "*.jsonl"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(stories), 6)
	for _, story := range stories {
		name := strings.TrimSuffix(filepath.Base(story), ".jsonl")
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			code, stdout, stderr := runCLI(t, "", "check", story, "--spill-dir", dir)
			require.Equal(t, 0, code, stderr)
			stderr = strings.ReplaceAll(stderr, dir, "SPILLDIR")
			golden(t, filepath.Join(storiesDir, "golden", name+".out.jsonl"), stdout)
			golden(t, filepath.Join(storiesDir, "golden", name+".summary.txt"), stderr)
			checkSpills(t, story, dir, stdout)
		})
	}
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./cmd/seamguard -run TestCheckGolden -update")
	assert.Equal(t, string(want), got, "output differs from %s; if the change is deliberate, rerun with -update", path)
}

// checkSpills verifies every transcript.spilled of out against the file in
// dir: the digest matches, and its lines are the story's accepted events.
func checkSpills(t *testing.T, story, dir, out string) {
	t.Helper()
	input := readLines(t, story)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		v, err := events.DecodeVerdict([]byte(line))
		require.NoError(t, err, line)
		if v.Type != events.TypeTranscriptSpilled {
			continue
		}
		h := v.Data.(*events.SpillHandle)
		var buf bytes.Buffer
		_, err = spill.Dir{Path: dir}.Get(h.Name, h.Digest, &buf)
		require.NoError(t, err)
		assert.Equal(t, uint64(buf.Len()), h.Size)
		lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		require.Len(t, lines, int(h.Events))
		for _, l := range lines {
			got, err := events.DecodeJSON([]byte(l), events.Meta{})
			require.NoError(t, err)
			assert.Equal(t, v.Session, got.Subject)
		}
		// The stories that spill have no rejected line before their spill,
		// so the spill holds input lines first_seq..last_seq.
		var want []string
		for n := h.FirstSeq; n <= h.LastSeq; n++ {
			want = append(want, input[n-1])
		}
		assert.Equal(t, canonical(t, want), canonical(t, lines), "spill %s holds the session's events %d..%d", h.Name, h.FirstSeq, h.LastSeq)
		// Its chain holds every event up to last_seq, oldest first.
		buf.Reset()
		chain, err := spill.Dir{Path: dir}.GetChain(h.Name, &buf)
		require.NoError(t, err)
		require.Equal(t, *h, chain[len(chain)-1])
		want = want[:0]
		for n := chain[0].FirstSeq; n <= h.LastSeq; n++ {
			want = append(want, input[n-1])
		}
		all := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		assert.Equal(t, canonical(t, want), canonical(t, all), "the chain of %s holds the session's events %d..%d", h.Name, chain[0].FirstSeq, h.LastSeq)
	}
}

func readLines(t *testing.T, path string) []string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	require.NoError(t, sc.Err())
	return out
}

// canonical decodes JSON lines so that key order and spacing do not matter.
func canonical(t *testing.T, lines []string) []any {
	out := make([]any, len(lines))
	for i, l := range lines {
		require.NoError(t, json.Unmarshal([]byte(l), &out[i]), l)
	}
	return out
}

// TestCheckSeedStory states the seed story's end explicitly, apart from the
// golden file: spilled, refused with coverage_hole at [0, 8), retry allowed
// with the hole cured by the spill.
func TestCheckSeedStory(t *testing.T) {
	code, stdout, stderr := runCLI(t, "", "check", "--spill-dir", t.TempDir(), filepath.Join(storiesDir, "seed-story.jsonl"))
	require.Equal(t, 0, code, stderr)
	var vs []*events.Verdict
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		v, err := events.DecodeVerdict([]byte(l))
		require.NoError(t, err)
		vs = append(vs, v)
	}
	require.Len(t, vs, 3)
	assert.Equal(t, events.TypeTranscriptSpilled, vs[0].Type)
	assert.Equal(t, events.Range{Start: 0, End: 52}, vs[0].Data.(*events.SpillHandle).Range)
	ref := vs[1].Data.(*events.CompactionRefused)
	require.Len(t, ref.Reasons, 1)
	assert.Equal(t, events.ReasonCoverageHole, ref.Reasons[0].Code)
	assert.Equal(t, []events.Range{{Start: 0, End: 8}}, ref.Reasons[0].AtRisk)
	assert.Equal(t, vs[0].Data, ref.Spill)
	al := vs[2].Data.(*events.CompactionAllowed)
	assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, al.Cured)
	require.Len(t, al.RecoveredBy, 1)
	assert.Equal(t, *ref.Spill, al.RecoveredBy[0])
	assert.Equal(t, "ops-agent-42-0055", vs[1].Cause.ID)
	assert.Equal(t, "ops-agent-42-0056", vs[2].Cause.ID)
}

// TestCheckSharedScenarios holds check to the decision-relevant fields of the
// shared scenarios, when the shared folder sits beside the project.
// notBuiltYet names the shared scenarios of contract sections seamguard
// does not implement yet, and why each is skipped.
var notBuiltYet = map[string]string{}

func TestCheckSharedScenarios(t *testing.T) {
	inputs, _ := filepath.Glob("../../../shared/scenarios/*.jsonl")
	var ran int
	for _, in := range inputs {
		if strings.HasSuffix(in, ".expected.jsonl") {
			continue
		}
		exp := strings.TrimSuffix(in, ".jsonl") + ".expected.jsonl"
		if _, err := os.Stat(exp); err != nil {
			continue
		}
		ran++
		t.Run(filepath.Base(in), func(t *testing.T) {
			if why, ok := notBuiltYet[filepath.Base(in)]; ok {
				t.Skip(why)
			}
			code, stdout, stderr := runCLI(t, "", "check", "--spill-dir", t.TempDir(), in)
			require.Equal(t, 0, code, stderr)
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
				v, err := events.DecodeVerdict([]byte(l))
				require.NoError(t, err)
				got = append(got, relevant(t, v))
			}
			var want []string
			for _, l := range readLines(t, exp) {
				var m map[string]any
				require.NoError(t, json.Unmarshal([]byte(l), &m))
				b, _ := json.Marshal(m)
				want = append(want, string(b))
			}
			assert.Equal(t, want, got)
		})
	}
	if ran == 0 {
		t.Skip("no shared scenarios beside the project (../shared/scenarios)")
	}
}

// relevant extracts the fields the shared expected files keep, as JSON with
// sorted keys.
func relevant(t *testing.T, v *events.Verdict) string {
	m := map[string]any{"type": strings.TrimPrefix(v.Type, events.TypePrefix), "session": v.Session}
	rng := func(r events.Range) map[string]any { return map[string]any{"start": r.Start, "end": r.End} }
	rngs := func(rs []events.Range) []any {
		out := []any{}
		for _, r := range rs {
			out = append(out, rng(r))
		}
		return out
	}
	switch d := v.Data.(type) {
	case *events.SpillHandle:
		m["range"] = rng(d.Range)
	case *events.CompactionRefused:
		m["request_id"] = d.RequestID
		var rs []any
		for _, r := range d.Reasons {
			rs = append(rs, map[string]any{"code": r.Code, "at_risk": rngs(r.AtRisk)})
		}
		m["reasons"] = rs
		m["spill"] = nil // the scenarios write a refusal without a spill as "spill": null
		if d.Spill != nil {
			m["spill"] = map[string]any{"range": rng(d.Spill.Range)}
		}
		if len(d.Cured) > 0 { // the scenarios leave cured out of a refusal that has none
			m["cured"] = d.Cured
		}
	case *events.CompactionAllowed:
		m["request_id"] = d.RequestID
		m["summary_coverage"] = rngs(d.SummaryCoverage)
		m["cured"] = d.Cured
		m["recovered"] = len(d.RecoveredBy) > 0
	case *events.SessionHalted:
		m["request_id"] = d.RequestID
		m["unrecoverable"] = rngs(d.Unrecoverable)
	case *events.CompactionViolation:
		m["request_id"] = d.RequestID
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(b, &back))
	b, _ = json.Marshal(back)
	return string(b)
}

func TestCheckUsageErrors(t *testing.T) {
	code, _, stderr := runCLI(t, "", "check", "--policy", "maybe")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--policy")
	assert.Contains(t, stderr, "spill or halt")

	code, _, stderr = runCLI(t, "", "check", "--spill-dir", t.TempDir(), "/nonexistent/story.jsonl")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "/nonexistent/story.jsonl")

	code, _, stderr = runCLI(t, "", "check", "a.jsonl", "b.jsonl")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "one input file")

	code, _, stderr = runCLI(t, "", "nope")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `unknown command "nope"`)

	code, _, _ = runCLI(t, "")
	assert.Equal(t, 2, code)
}

func TestCheckStdinAndBadLines(t *testing.T) {
	in := "not json\n\n" + `{"specversion":"1.0","id":"a","source":"s","type":"io.seamguard.session.opened","subject":"s1","data":{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}}` + "\n{\n"
	code, stdout, stderr := runCLI(t, in, "check", "--spill-dir", t.TempDir(), "-")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2, "one rejection per bad line, none for the blank line or the valid one")
	for i, l := range lines {
		v, err := events.DecodeVerdict([]byte(l))
		require.NoError(t, err)
		assert.Equal(t, events.TypeEventRejected, v.Type)
		assert.Equal(t, events.CodeMalformed, v.Data.(*events.EventRejected).Code)
		assert.Equal(t, []uint64{1, 4}[i], v.Data.(*events.EventRejected).Input.Seq, "line numbers count blank lines")
	}
	assert.Contains(t, stderr, "session s1: open")
}

// TestCheckTakesTheLimits: check decides with the limits it is given, as
// serve does: a third disjoint truncation past --max-ranges 2 is rejected
// with state_limit and halts the session; with the defaults it is not.
func TestCheckTakesTheLimits(t *testing.T) {
	ev := func(n int, typ, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"lim-%d","source":"urn:test","type":"io.seamguard.%s","subject":"lim","datacontenttype":"application/json","data":%s}`, n, typ, data)
	}
	lines := []string{ev(0, "session.opened", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`)}
	for i := range 10 {
		lines = append(lines, ev(1+i, "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1}`, i)))
	}
	for i := range 3 {
		lines = append(lines, ev(20+i, "context.truncated", fmt.Sprintf(`{"range":{"start":%d,"end":%d}}`, 2*i, 2*i+1)))
	}
	in := strings.Join(lines, "\n") + "\n"

	code, stdout, stderr := runCLI(t, in, "check", "--spill-dir", t.TempDir(), "--max-ranges", "2")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"code":"state_limit"`)
	require.Contains(t, stdout, "io.seamguard.session.halted")

	code, stdout, stderr = runCLI(t, in, "check", "--spill-dir", t.TempDir())
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stdout, "state_limit")

	code, _, stderr = runCLI(t, in, "check", "--max-requests", "5")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `invalid value "5" for flag -max-requests: out of range; use 256 to 1000000`)
}
