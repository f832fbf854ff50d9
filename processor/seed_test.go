package processor_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	nats_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/latepub"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

const (
	seedStory  = "testdata/stories/seed-story.jsonl"
	seedGolden = "testdata/stories/golden/seed-story.out.jsonl"
)

// readGolden reads a golden file of verdicts.
func readGolden(t *testing.T, rel string) []*events.Verdict {
	t.Helper()
	var golden []*events.Verdict
	for _, l := range readLines(t, rel) {
		v, err := events.DecodeVerdict(l)
		require.NoError(t, err)
		golden = append(golden, v)
	}
	return golden
}

// playStory runs a processor with cfg, publishes a story's lines (all of
// session) into JetStream in mode ("binary": ce-* headers; or
// "structured-sdk": through the CloudEvents SDK's own nats_jetstream
// sender, which writes structured mode without any header), and stops the
// processor once it has handled every event.
func (e *env) playStory(t *testing.T, cfg processor.Config, mode, session string, lines [][]byte) {
	t.Helper()
	r := e.start(t, cfg)
	subj := cfg.Subjects()
	switch mode {
	case "binary":
		msgs := make([]*nats.Msg, len(lines))
		for i, l := range lines {
			msgs[i] = binaryMsg(t, subj, l)
		}
		seqs := e.publishAll(t, msgs)
		require.Equal(t, uint64(len(lines)), seqs[len(seqs)-1])
	case "structured-sdk":
		sender, err := nats_jetstream.NewSenderFromConn(e.NC, cfg.Names().Events, subj.Events(session), nil)
		require.NoError(t, err)
		for _, l := range lines {
			var ev event.Event
			require.NoError(t, json.Unmarshal(l, &ev))
			require.NoError(t, sender.Send(binding.WithForceStructured(e.ctx), binding.ToMessage(&ev)))
		}
		raw := e.readStream(t, cfg.Names().Events)
		require.Len(t, raw, len(lines))
		require.Empty(t, raw[0].Header.Get("ce-specversion"))
	default:
		t.Fatalf("no content mode %q", mode)
	}
	e.waitIdle(t, cfg, 30*time.Second)
	require.NoError(t, r.stop(t))
}

// TestSeedStoryOverNATS plays the seed story into JetStream, once in binary
// content mode (ce-* headers) and once in structured mode through the
// CloudEvents SDK's own nats_jetstream sender, and holds the verdict stream
// and the spill to what the offline check decided.
func TestSeedStoryOverNATS(t *testing.T) {
	lines := readLines(t, seedStory)
	golden := readGolden(t, seedGolden)
	require.Len(t, golden, 3)

	for _, mode := range []string{"binary", "structured-sdk"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := baseConfig()
			cfg.Source = events.DefaultSource // as the offline check writes
			cfg.SpillVerify = true
			subj := cfg.Subjects()
			e.playStory(t, cfg, mode, "ops-agent-42", lines)

			got := e.verdicts(t, cfg)
			require.Len(t, got, len(golden), "verdicts: %v", got)
			bodies := verdictBodies(t, got)
			require.Len(t, bodies, len(golden))
			for i, want := range golden {
				g := got[i].v
				require.Equal(t, want.ID, g.ID, "verdict %d: %s", i, describe(g))
				assert.Equal(t, want.Type, g.Type)
				assert.Equal(t, want.Session, g.Session)
				assert.Equal(t, want.Cause.ID, g.Cause.ID)
				assert.Equal(t, want.Source, g.Source)
				assert.Equal(t, subj.Verdict(want.Session, want.Kind()), got[i].subject)
				assert.Equal(t, events.ContentTypeCloudEventsJSON, got[i].header.Get("Content-Type"))
				assert.True(t, fixedNow().Equal(g.Time), "time %v", g.Time)
				assertSameDecision(t, want, g)
			}

			// The spill exists, reads back with a verified digest, and
			// holds the session's accepted events in order.
			h := got[0].v.Data.(*events.SpillHandle)
			require.Equal(t, uint64(1), h.FirstSeq)
			require.Equal(t, uint64(55), h.LastSeq)
			store := &spill.Store{JS: e.JS, Stream: cfg.Names().Events, Subjects: subj, Bucket: cfg.Names().Spills}
			var buf bytes.Buffer
			info, err := store.Get(e.ctx, h.Name, &buf)
			require.NoError(t, err)
			require.Equal(t, h.Digest, info.Digest)
			require.Equal(t, h.Size, uint64(buf.Len()))
			sc := bufio.NewScanner(&buf)
			sc.Buffer(nil, 1<<20)
			n := 0
			for sc.Scan() {
				require.Less(t, n, 55, "more lines than events")
				gotEv, err := events.DecodeJSON(sc.Bytes(), events.Meta{})
				require.NoError(t, err, "spill line %d", n+1)
				wantEv, err := events.DecodeJSON(lines[n], events.Meta{})
				require.NoError(t, err)
				assert.Equal(t, wantEv.ID, gotEv.ID, "line %d", n+1)
				assert.Equal(t, wantEv.Source, gotEv.Source)
				assert.Equal(t, wantEv.Type, gotEv.Type)
				assert.Equal(t, wantEv.Subject, gotEv.Subject)
				assert.True(t, wantEv.Time.Equal(gotEv.Time), "line %d time", n+1)
				assert.JSONEq(t, string(wantEv.Data), string(gotEv.Data), "line %d data", n+1)
				assert.Equal(t, wantEv.Body, gotEv.Body, "line %d", n+1)
				n++
			}
			require.NoError(t, sc.Err())
			require.Equal(t, 55, n)
			require.Equal(t, uint64(55), h.Events)
		})
	}
}

// assertSameDecision compares what a verdict decided, leaving out what
// depends on where the input was stored (stream sequences, and so the
// spill's bytes are compared by range and event count only).
func assertSameDecision(t *testing.T, want, got *events.Verdict) {
	t.Helper()
	sameHandle := func(w, g *events.SpillHandle) {
		t.Helper()
		require.NotNil(t, g)
		assert.Equal(t, w.Bucket, g.Bucket)
		assert.Equal(t, w.Name, g.Name)
		assert.Equal(t, w.Range, g.Range)
		assert.Equal(t, w.Events, g.Events)
		assert.NotEmpty(t, g.Digest)
	}
	switch w := want.Data.(type) {
	case *events.SpillHandle:
		sameHandle(w, got.Data.(*events.SpillHandle))
	case *events.CompactionRefused:
		g := got.Data.(*events.CompactionRefused)
		assert.Equal(t, w.RequestID, g.RequestID)
		assert.Equal(t, w.Reasons, g.Reasons)
		assert.Equal(t, w.Next, g.Next)
		if w.Spill == nil {
			assert.Nil(t, g.Spill)
		} else {
			sameHandle(w.Spill, g.Spill)
		}
	case *events.CompactionAllowed:
		g := got.Data.(*events.CompactionAllowed)
		assert.Equal(t, w.RequestID, g.RequestID)
		assert.Equal(t, w.Head, g.Head)
		assert.Equal(t, w.SummaryCoverage, g.SummaryCoverage)
		assert.Equal(t, w.TailStart, g.TailStart)
		assert.Equal(t, w.Cured, g.Cured)
		require.Len(t, g.RecoveredBy, len(w.RecoveredBy))
		for i := range w.RecoveredBy {
			sameHandle(&w.RecoveredBy[i], &g.RecoveredBy[i])
		}
	default:
		assert.Equal(t, want.Data, got.Data)
	}
}

// lateJS sends the publishes of spill announcements a while after they are
// asked for, as the NATS client does when it republishes one the server
// answered "no responders" (a stream leader moving).
type lateJS struct {
	jetstream.JetStream
	delay time.Duration
}

func (l lateJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if !strings.HasSuffix(m.Subject, ".spilled") {
		return l.JetStream.PublishMsgAsync(m, opts...)
	}
	f := latepub.New(m)
	time.AfterFunc(l.delay, func() { f.Follow(l.JetStream, opts...) })
	return f, nil
}

// TestSpillAnnouncedBeforeRefusal: the contract puts transcript.spilled
// before the refusal that names the spill. A spill announcement stored
// late (sent again after a leader moved) must still come first: the
// refusal waits for it.
func TestSpillAnnouncedBeforeRefusal(t *testing.T) {
	lines := readLines(t, seedStory)
	golden := readGolden(t, seedGolden)
	e := newEnv(t)
	late := &env{Test: &embedded.Test{Server: e.Server, NC: e.NC, JS: lateJS{e.JS, 300 * time.Millisecond}}, ctx: e.ctx}
	cfg := baseConfig()
	cfg.Source = events.DefaultSource
	late.playStory(t, cfg, "binary", "ops-agent-42", lines)
	got := e.verdicts(t, cfg)
	require.Len(t, got, len(golden))
	for i, want := range golden {
		require.Equal(t, want.Type, got[i].v.Type, "verdict %d in the stream: %s", i, describe(got[i].v))
	}
}
