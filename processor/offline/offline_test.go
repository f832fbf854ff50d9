package offline

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

const story = `{"specversion":"1.0","id":"1","source":"s","type":"io.seamguard.session.opened","subject":"a","data":{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}}
{"specversion":"1.0","id":"2","source":"s","type":"io.seamguard.turn.appended","subject":"a","data":{"offset":0,"size":4}}
{"specversion":"1.0","id":"3","source":"s","type":"io.seamguard.turn.appended","subject":"a","data":{"offset":3,"size":1}}
{"specversion":"1.0","id":"4","source":"s","type":"io.seamguard.compaction.requested","subject":"a","data":{"request_id":"r","summarizer_input":{"start":1,"end":4},"summary_range":{"start":1,"end":2},"tail_start":2}}
`

func verdicts(t *testing.T, out string) []*events.Verdict {
	var vs []*events.Verdict
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		v, err := events.DecodeVerdict([]byte(l))
		require.NoError(t, err, l)
		vs = append(vs, v)
	}
	return vs
}

func TestSpillAndJournal(t *testing.T) {
	var out bytes.Buffer
	dir := t.TempDir()
	r := &Runner{SpillDir: dir, Out: &out}
	sum, err := r.Run(context.Background(), strings.NewReader(story))
	require.NoError(t, err)
	vs := verdicts(t, out.String())
	require.Len(t, vs, 3)
	assert.Equal(t, events.TypeEventRejected, vs[0].Type, "the overlapping turn")
	h := vs[1].Data.(*events.SpillHandle)
	assert.Equal(t, uint64(3), h.Events, "the rejected line is not in the spill")
	assert.Equal(t, uint64(4), h.LastSeq)
	b, err := os.ReadFile(filepath.Join(dir, "a", "1.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, 3, strings.Count(string(b), "\n"))
	assert.NotContains(t, string(b), `"id":"3"`)
	require.Len(t, sum.Sessions, 1)
	assert.Equal(t, 1, sum.Sessions[0].Rejected)
	assert.Equal(t, 3, sum.Sessions[0].Accepted)
}

// A second spill holds only the events after the first one's last_seq and
// names the first as its previous.
func TestSecondSpillIsIncremental(t *testing.T) {
	more := story + `{"specversion":"1.0","id":"5","source":"s","type":"io.seamguard.turn.appended","subject":"a","data":{"offset":4,"size":2}}
{"specversion":"1.0","id":"6","source":"s","type":"io.seamguard.context.truncated","subject":"a","data":{"range":{"start":4,"end":5}}}
{"specversion":"1.0","id":"7","source":"s","type":"io.seamguard.compaction.requested","subject":"a","data":{"request_id":"r2","summarizer_input":{"start":1,"end":6},"summary_range":{"start":1,"end":4},"tail_start":4}}
`
	var out bytes.Buffer
	dir := t.TempDir()
	r := &Runner{SpillDir: dir, Out: &out}
	_, err := r.Run(context.Background(), strings.NewReader(more))
	require.NoError(t, err)
	var handles []*events.SpillHandle
	for _, v := range verdicts(t, out.String()) {
		if h, ok := v.Data.(*events.SpillHandle); ok {
			handles = append(handles, h)
		}
	}
	require.Len(t, handles, 2, out.String())
	assert.Nil(t, handles[0].Previous)
	require.NotNil(t, handles[1].Previous)
	assert.Equal(t, "a/1.jsonl", *handles[1].Previous)
	assert.Equal(t, uint64(5), handles[1].FirstSeq)
	assert.Equal(t, uint64(3), handles[1].Events)
	b, err := os.ReadFile(filepath.Join(dir, "a", "2.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, 3, strings.Count(string(b), "\n"))
	assert.True(t, strings.HasPrefix(string(b), `{"specversion":"1.0","id":"5"`), string(b))
}

// A spill that cannot be written halts the session with the at-risk offsets.
func TestSpillFailureHalts(t *testing.T) {
	var out bytes.Buffer
	blocker := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	r := &Runner{SpillDir: blocker, Out: &out}
	_, err := r.Run(context.Background(), strings.NewReader(story))
	require.NoError(t, err)
	vs := verdicts(t, out.String())
	require.Len(t, vs, 2)
	h := vs[1].Data.(*events.SessionHalted)
	assert.Equal(t, []events.Range{{Start: 0, End: 1}}, h.Unrecoverable)
	assert.Contains(t, h.Message, "could not be spilled")
}

func TestPolicyHalt(t *testing.T) {
	var out bytes.Buffer
	r := &Runner{SpillDir: t.TempDir(), Out: &out, Config: ledger.Config{Policy: ledger.PolicyHalt}}
	_, err := r.Run(context.Background(), strings.NewReader(story))
	require.NoError(t, err)
	vs := verdicts(t, out.String())
	require.Len(t, vs, 2)
	assert.Equal(t, events.TypeSessionHalted, vs[1].Type)
}

func TestLongLineAndValidate(t *testing.T) {
	var out bytes.Buffer
	r := &Runner{SpillDir: t.TempDir(), Out: &out}
	long := `{"x":"` + strings.Repeat("a", MaxLine) + `"}` + "\n" + story
	sum, err := r.Run(context.Background(), strings.NewReader(long))
	require.NoError(t, err)
	vs := verdicts(t, out.String())
	assert.Equal(t, events.CodeMalformed, vs[0].Data.(*events.EventRejected).Code)
	assert.Contains(t, vs[0].Data.(*events.EventRejected).Message, "longer than")
	assert.Equal(t, 1, sum.Rejected)
	assert.Len(t, vs, 4, "the long line is skipped and the story after it still decided")

	err = (&Runner{}).Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SpillDir")
	assert.Contains(t, err.Error(), "Out")
}

// TestIncrementalSpill: a spill request that follows another (as the
// ledger asks once a session has spilled) copies only the session's
// events after the previous spill, and the chain in the spill directory
// reads back whole.
func TestIncrementalSpill(t *testing.T) {
	dir := t.TempDir()
	r := &Runner{SpillDir: dir, Out: &bytes.Buffer{}}
	journal, err := os.CreateTemp(t.TempDir(), "journal")
	require.NoError(t, err)
	defer journal.Close()
	s := &session{}
	var off int64
	for i, seq := range []uint64{1, 2, 4, 5, 7} {
		line := fmt.Sprintf(`{"n":%d}`+"\n", i)
		_, err := journal.WriteString(line)
		require.NoError(t, err)
		s.lines = append(s.lines, span{off: off, n: int64(len(line)), seq: seq})
		off += int64(len(line))
	}
	first := ledger.SpillRequest{Session: "a", Name: "a/1.jsonl", FirstSeq: 1, LastSeq: 2, Events: 2, Range: events.Range{End: 1}}
	res := r.spill(journal, s, &first)
	require.Empty(t, res.Failure)
	second := ledger.SpillRequest{Session: "a", Name: "a/2.jsonl", Previous: "a/1.jsonl", FirstSeq: 3, LastSeq: 5, Events: 2, Range: events.Range{End: 2}}
	res = r.spill(journal, s, &second)
	require.Empty(t, res.Failure)
	require.NotNil(t, res.Handle.Previous)
	assert.Equal(t, "a/1.jsonl", *res.Handle.Previous)
	assert.Equal(t, uint64(2), res.Handle.Events)
	b, err := os.ReadFile(filepath.Join(dir, "a", "2.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, "{\"n\":2}\n{\"n\":3}\n", string(b))
	var all bytes.Buffer
	_, err = spill.Dir{Path: dir}.GetChain("a/2.jsonl", &all)
	require.NoError(t, err)
	assert.Equal(t, "{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n", all.String())

	third := ledger.SpillRequest{Session: "a", Name: "a/3.jsonl", Previous: "a/2.jsonl", FirstSeq: 6, LastSeq: 7, Events: 2}
	res = r.spill(journal, s, &third)
	assert.Contains(t, res.Failure, "incomplete", "one event lies in 6..7")
}
