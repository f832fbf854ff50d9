package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/spill"
)

// refuseAndSpill opens a session (floor of 4 turns), appends turns with
// content, evicts the 3 oldest and compacts: seamguard refuses, spills and
// allows the retry. It returns the session and the refusal's spill.
func refuseAndSpill(t *testing.T, ctx context.Context, c *client.Client, id string, turns int, content func(i int) any) (*client.Session, events.SpillHandle) {
	t.Helper()
	s, err := c.Open(ctx, client.SessionConfig{ID: id, Span: 4})
	require.NoError(t, err)
	for i := range turns {
		_, err := s.Append(ctx, client.Turn{Role: "user", Content: content(i)})
		require.NoError(t, err)
	}
	require.NoError(t, s.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget"))
	head := uint64(turns)
	v, err := s.Compact(ctx, events.CompactionRequested{
		RequestID:       "c1",
		SummarizerInput: events.Range{Start: 3, End: head},
		SummaryRange:    events.Range{Start: 3, End: head - 4},
		TailStart:       head - 4,
	})
	require.NoError(t, err)
	require.NotNil(t, v.Allowed(), "%s", v.Type)
	require.NotNil(t, v.Previous)
	require.NotNil(t, v.Previous.Refused().Spill)
	require.NoError(t, s.Commit(ctx, "c1"))
	return s, *v.Previous.Refused().Spill
}

// chainOf reads a spill's chain as seamguard spill get does, with
// JetStream access.
func (sg *seamguard) chainOf(t *testing.T, ctx context.Context, name string) ([]events.SpillHandle, []byte) {
	t.Helper()
	store := &spill.Store{JS: sg.js, Stream: sg.cfg.Names().Events, Subjects: sg.cfg.Subjects(), Bucket: sg.cfg.Names().Spills}
	var buf bytes.Buffer
	hs, err := store.GetChain(ctx, name, &buf)
	require.NoError(t, err)
	return hs, buf.Bytes()
}

// TestRecover: an agent recovers the transcript of its refused compaction
// through the processor, exactly the bytes spill.Store reads with
// JetStream access, here a spill of three object chunks read in three
// replies; a raw client reads it in pieces that do not line up with the
// chunks, with and without cursors.
func TestRecover(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	big := func(i int) any { return strings.Repeat(string(rune('a'+i%26)), 64<<10) }
	s, h := refuseAndSpill(t, ctx, c, "recover-big", 20, big)
	require.Nil(t, h.Previous)
	require.Greater(t, h.Size, uint64(2*events.MaxRecoverChunk), "the spill spans three chunks")

	wantChain, want := sg.chainOf(t, ctx, h.Name)
	var got bytes.Buffer
	chain, err := s.Recover(ctx, h, &got)
	require.NoError(t, err)
	require.Equal(t, wantChain, chain)
	require.Equal(t, []events.SpillHandle{h}, chain)
	require.True(t, bytes.Equal(want, got.Bytes()), "recovered %d bytes, the bucket holds %d", got.Len(), len(want))
	lines := strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n")
	require.Len(t, lines, 1+20+1+1, "session.opened, 20 turns, the truncation, the request")
	require.EqualValues(t, len(lines), h.Events)
	for i, l := range lines {
		ev, err := events.DecodeJSON([]byte(l), events.Meta{})
		require.NoError(t, err, "line %d", i)
		require.Equal(t, "recover-big", ev.Subject)
	}

	// The Client form, for an agent without its Session.
	got.Reset()
	_, err = c.Recover(ctx, "recover-big", h, &got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got.Bytes()))

	// Into memory, from the Session and from the Client: the same bytes,
	// or an error and nothing.
	tr, err := s.RecoverTranscript(ctx, h)
	require.NoError(t, err)
	require.Equal(t, wantChain, tr.Chain)
	require.True(t, bytes.Equal(want, tr.Transcript), "recovered %d bytes, the bucket holds %d", len(tr.Transcript), len(want))
	tr, err = c.RecoverTranscript(ctx, "recover-big", h)
	require.NoError(t, err)
	require.Equal(t, wantChain, tr.Chain)
	require.True(t, bytes.Equal(want, tr.Transcript))
	tr, err = s.RecoverTranscript(ctx, events.SpillHandle{Name: "recover-big/99.jsonl"})
	require.ErrorIs(t, err, client.ErrSpillNotFound)
	require.Nil(t, tr)
	tr, err = c.RecoverTranscript(ctx, "recover-big", events.SpillHandle{Name: h.Name, Size: h.Size + 1, Digest: h.Digest})
	require.ErrorIs(t, err, client.ErrDigestMismatch)
	require.Nil(t, tr)

	// Raw reads of 100,000 bytes: every other one crosses a chunk's end;
	// one from the middle of the second chunk without a cursor.
	subject := events.Subjects{}.Recover("recover-big")
	read := func(rq events.RecoverRequest) *nats.Msg {
		t.Helper()
		body, _ := json.Marshal(rq)
		m, err := sg.nc.RequestWithContext(ctx, subject, body)
		require.NoError(t, err)
		require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
		return m
	}
	var raw []byte
	cursor := ""
	for uint64(len(raw)) < h.Size {
		m := read(events.RecoverRequest{Op: "read", Name: h.Name, Offset: uint64(len(raw)), Cursor: cursor, Max: 100_000})
		require.LessOrEqual(t, len(m.Data), 100_000)
		raw = append(raw, m.Data...)
		cursor = m.Header.Get(events.HeaderCursor)
	}
	require.True(t, bytes.Equal(want, raw))
	mid := uint64(events.MaxRecoverChunk + 12345)
	m := read(events.RecoverRequest{Op: "read", Name: h.Name, Offset: mid, Max: 1000})
	require.Equal(t, want[mid:mid+1000], m.Data)
	require.Equal(t, strconv.FormatUint(mid, 10), m.Header.Get(events.HeaderOffset))
}

// TestRecoverChain: after a second refusal, the second spill holds only
// what came after the first; recovering it returns both, oldest first,
// which together are the session's whole transcript.
func TestRecoverChain(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	s, first := refuseAndSpill(t, ctx, c, "chained", 12, func(i int) any { return "turn " + strconv.Itoa(i) })

	for i := range 12 {
		_, err := s.Append(ctx, client.Turn{Content: "later turn " + strconv.Itoa(i)})
		require.NoError(t, err)
	}
	require.NoError(t, s.Truncated(ctx, events.Range{Start: 8, End: 14}, "budget"))
	v, err := s.Compact(ctx, events.CompactionRequested{
		RequestID:       "c2",
		SummarizerInput: events.Range{Start: 14, End: 24},
		SummaryRange:    events.Range{Start: 14, End: 20},
		TailStart:       20,
	})
	require.NoError(t, err)
	require.NotNil(t, v.Allowed(), "%s", v.Type)
	require.NotNil(t, v.Previous, "the second compaction needed a second spill")
	second := v.Previous.Refused().Spill
	require.NotNil(t, second)
	require.NotNil(t, second.Previous)
	require.Equal(t, first.Name, *second.Previous)

	wantChain, want := sg.chainOf(t, ctx, second.Name)
	var got bytes.Buffer
	chain, err := s.Recover(ctx, *second, &got)
	require.NoError(t, err)
	require.Equal(t, wantChain, chain)
	require.Equal(t, []string{first.Name, second.Name}, []string{chain[0].Name, chain[1].Name})
	require.Equal(t, first, chain[0])
	require.True(t, bytes.Equal(want, got.Bytes()))
	lines := strings.Split(strings.TrimSuffix(got.String(), "\n"), "\n")
	require.EqualValues(t, first.Events+second.Events, len(lines))
	assert.Contains(t, lines[1], `"turn 0"`)
	assert.Contains(t, lines[len(lines)-1], `"c2"`)

	// The first spill alone is its own chain.
	got.Reset()
	chain, err = s.Recover(ctx, first, &got)
	require.NoError(t, err)
	require.Equal(t, []events.SpillHandle{first}, chain)
	require.EqualValues(t, first.Size, got.Len())
}

// TestRecoverRefused: a spill of another session, a name no spill has, and
// a handle whose digest the bucket's object does not have are each refused
// with an error saying so; nothing is written for them.
func TestRecoverRefused(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	_, theirs := refuseAndSpill(t, ctx, c, "victim", 12, func(i int) any { return "secret " + strconv.Itoa(i) })
	mine, err := c.Open(ctx, client.SessionConfig{ID: "intruder", Span: 4})
	require.NoError(t, err)

	var got bytes.Buffer
	_, err = mine.Recover(ctx, theirs, &got)
	require.ErrorIs(t, err, client.ErrSpillForbidden)
	require.ErrorIs(t, err, client.ErrNotRecovered)
	var re *client.RecoverError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 403, re.Code)
	assert.Equal(t, "intruder", re.Session)
	assert.Equal(t, theirs.Name, re.Name)
	assert.Contains(t, err.Error(), theirs.Name)
	assert.Zero(t, got.Len())

	missing := theirs
	missing.Name = "intruder/7.jsonl"
	_, err = mine.Recover(ctx, missing, &got)
	require.ErrorIs(t, err, client.ErrSpillNotFound)
	require.ErrorIs(t, err, client.ErrNotRecovered)
	require.NotErrorIs(t, err, client.ErrSpillForbidden)
	assert.Contains(t, err.Error(), "intruder/7.jsonl")
	assert.Zero(t, got.Len())

	stale := theirs
	stale.Digest = "SHA-256=" + strings.Repeat("A", 43) + "="
	_, err = c.Recover(ctx, "victim", stale, &got)
	require.ErrorIs(t, err, client.ErrDigestMismatch)
	assert.Contains(t, err.Error(), theirs.Name)
	assert.Zero(t, got.Len())

	_, err = mine.Recover(ctx, events.SpillHandle{}, &got)
	require.ErrorIs(t, err, client.ErrInvalid)
}

// TestRecoverCorrupted: a chunk of a stored spill is replaced by a copy
// with one byte changed (its object info, and so its digest, untouched),
// as a bit flip on a disk would leave it. Recover reads it all and reports
// the digest mismatch, naming the spill, as the spill package's own reader
// does.
func TestRecoverCorrupted(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	s, h := refuseAndSpill(t, ctx, c, "bitrot", 12, func(i int) any { return "turn " + strconv.Itoa(i) })

	obs, err := sg.js.ObjectStore(ctx, h.Bucket)
	require.NoError(t, err)
	info, err := obs.GetInfo(ctx, h.Name)
	require.NoError(t, err)
	require.EqualValues(t, 1, info.Chunks)
	str, err := sg.js.Stream(ctx, "OBJ_"+h.Bucket)
	require.NoError(t, err)
	subject := "$O." + h.Bucket + ".C." + info.NUID
	chunk, err := str.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject))
	require.NoError(t, err)
	bad := bytes.Clone(chunk.Data)
	bad[len(bad)/2] ^= 0x20
	require.NoError(t, str.DeleteMsg(ctx, chunk.Sequence))
	_, err = sg.js.Publish(ctx, subject, bad)
	require.NoError(t, err)

	var ref bytes.Buffer
	_, err = (&spill.Store{JS: sg.js, Stream: sg.cfg.Names().Events, Bucket: h.Bucket}).GetChain(ctx, h.Name, &ref)
	require.ErrorIs(t, err, spill.ErrDigestMismatch, "the corruption is real")

	var got bytes.Buffer
	_, err = s.Recover(ctx, h, &got)
	require.ErrorIs(t, err, client.ErrDigestMismatch)
	require.ErrorIs(t, err, client.ErrNotRecovered)
	assert.Contains(t, err.Error(), h.Name)
	assert.Contains(t, err.Error(), h.Digest)
	assert.Equal(t, bad, got.Bytes(), "the bytes came as stored, then the check failed")
}

// TestRecoverDeadline: with no processor running nothing answers; Recover
// asks again until its context ends and says what it waited for.
func TestRecoverDeadline(t *testing.T) {
	sg := newSeamguard(t, false)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	wait, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Recover(wait, "waiting", events.SpillHandle{Name: "waiting/1.jsonl"}, &bytes.Buffer{})
	require.ErrorIs(t, err, client.ErrNotRecovered)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, nats.ErrNoResponders)
	assert.Contains(t, err.Error(), "waiting/1.jsonl")
	assert.Contains(t, err.Error(), "seamguard.recover.waiting")
	assert.Less(t, time.Since(start), 5*time.Second)
}
