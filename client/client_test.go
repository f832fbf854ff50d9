package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	nats_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, client.Config{}.Validate())
	require.NoError(t, client.Config{Prefix: "acme.guard", Stream: "ACME_GUARD_EVENTS", Source: "urn:agent:x", AckTimeout: time.Second, PublishAttempts: 1}.Validate())

	err := client.Config{Prefix: "a..b", Stream: "X.Y", Source: "urn:\n", AckTimeout: -1, PublishAttempts: -2}.Validate()
	require.Error(t, err)
	for _, want := range []string{"Prefix", "Stream", "Source", "AckTimeout", "PublishAttempts"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = client.New(nil, client.Config{})
	assert.ErrorIs(t, err, client.ErrInvalid)

	assert.Equal(t, "SEAMGUARD_EVENTS", client.StreamName(""))
	assert.Equal(t, "ACME_GUARD_X_EVENTS", client.StreamName("acme.guard-x"))
	assert.Equal(t, processor.Config{Prefix: "acme.guard-x"}.Names().Events, client.StreamName("acme.guard-x"))
}

func TestSessionConfigValidate(t *testing.T) {
	require.NoError(t, client.SessionConfig{ID: "s-1", Span: 4}.Validate())
	err := client.SessionConfig{ID: "bad.id", Unit: "pages"}.Validate()
	require.ErrorIs(t, err, client.ErrInvalid)
	for _, want := range []string{`"bad.id"`, `"pages"`, "Span is 0"} {
		assert.Contains(t, err.Error(), want)
	}
}

// capture subscribes to every events subject and returns what arrives.
func capture(t *testing.T, nc *nats.Conn) func(n int) []*nats.Msg {
	t.Helper()
	sub, err := nc.SubscribeSync(events.Subjects{}.EventsWildcard())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func(n int) []*nats.Msg {
		var out []*nats.Msg
		for range n {
			m, err := sub.NextMsg(5 * time.Second)
			require.NoError(t, err)
			out = append(out, m)
		}
		return out
	}
}

// TestEventsAreCloudEvents checks what the client puts on the wire, in
// both content modes: events the codec and the CloudEvents SDK both read,
// with the offsets the session computed, Nats-Msg-Id =
// events.MsgID(source, id), and header values percent-encoded.
func TestEventsAreCloudEvents(t *testing.T) {
	sg := newSeamguard(t, false)
	const source = `urn:agent:tëst "100%"`
	for _, structured := range []bool{false, true} {
		name := map[bool]string{false: "binary", true: "structured"}[structured]
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			next := capture(t, sg.nc)
			c, err := client.New(sg.nc, client.Config{Source: source, Structured: structured})
			require.NoError(t, err)
			window := uint64(200000)
			s, err := c.Open(ctx, client.SessionConfig{ID: "wire-" + name, Unit: events.UnitTokens, Span: 300, Window: &window})
			require.NoError(t, err)
			r, err := s.Append(ctx, client.Turn{Size: 120, Role: "user", Content: map[string]any{"text": "héllo"}})
			require.NoError(t, err)
			assert.Equal(t, events.Range{Start: 0, End: 120}, r)
			r, err = s.Append(ctx, client.Turn{Size: 80, Content: json.RawMessage(`["raw",1]`)})
			require.NoError(t, err)
			assert.Equal(t, events.Range{Start: 120, End: 200}, r)
			require.NoError(t, s.Truncated(ctx, events.Range{Start: 0, End: 120}, "budget"))
			require.NoError(t, s.Commit(ctx, "c-1"))
			require.NoError(t, s.Close(ctx))

			want := []struct {
				typ  string
				body any
			}{
				{events.TypeSessionOpened, &events.SessionOpened{Unit: events.UnitTokens, RecoveryFloor: events.Floor{Span: 300, Unit: events.UnitTokens}, Window: &window}},
				{events.TypeTurnAppended, &events.TurnAppended{Offset: 0, Size: 120, Role: "user", Content: json.RawMessage(`{"text":"héllo"}`)}},
				{events.TypeTurnAppended, &events.TurnAppended{Offset: 120, Size: 80, Content: json.RawMessage(`["raw",1]`)}},
				{events.TypeContextTruncated, &events.ContextTruncated{Range: events.Range{Start: 0, End: 120}, Stage: "budget"}},
				{events.TypeCompactionCommitted, &events.CompactionCommitted{RequestID: "c-1"}},
				{events.TypeSessionClosed, &events.SessionClosed{}},
			}
			ids := map[string]bool{}
			for i, m := range next(len(want)) {
				ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, events.Subjects{})
				require.NoError(t, err, "event %d", i)
				assert.Equal(t, want[i].typ, ev.Type)
				assert.Equal(t, want[i].body, ev.Body, "event %d", i)
				assert.Equal(t, source, ev.Source)
				assert.Equal(t, "wire-"+name, ev.Subject)
				assert.WithinDuration(t, time.Now(), ev.Time, time.Minute)
				assert.Equal(t, events.MsgID(source, ev.ID), m.Header.Get(jetstream.MsgIDHeader))
				assert.False(t, ids[ev.ID], "id %s used twice", ev.ID)
				ids[ev.ID] = true
				if structured {
					assert.Equal(t, events.ContentTypeCloudEventsJSON, m.Header.Get("Content-Type"))
					assert.Empty(t, m.Header.Get("ce-specversion"))
				} else {
					assert.Equal(t, "1.0", m.Header.Get("ce-specversion"))
					assert.Equal(t, events.ContentTypeJSON, m.Header.Get("Content-Type"))
					assert.Equal(t, `urn:agent:t%C3%ABst%20%22100%25%22`, m.Header.Get("ce-source"))
				}

				// The CloudEvents SDK reads it as a valid event too.
				sdkEv, err := binding.ToEvent(context.Background(), nats_jetstream.NewMessage(m))
				require.NoError(t, err, "event %d", i)
				require.NoError(t, sdkEv.Validate())
				assert.Equal(t, ev.ID, sdkEv.ID())
				assert.Equal(t, want[i].typ, sdkEv.Type())
				assert.Equal(t, "wire-"+name, sdkEv.Subject())
			}
			assert.Equal(t, uint64(200), s.Head())
		})
	}
}

// TestSessionFlowAndCommit runs the refuse-spill-retry flow in structured
// mode, commits, and checks in the verdict stream that the commit was
// accepted without a violation, while a commit of a request seamguard
// never saw is one.
func TestSessionFlowAndCommit(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{Structured: true})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "flow", Span: 4})
	require.NoError(t, err)
	for range 12 {
		_, err := s.Append(ctx, client.Turn{Content: "x"})
		require.NoError(t, err)
	}
	require.NoError(t, s.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget"))
	v, err := s.Compact(ctx, events.CompactionRequested{
		SummarizerInput: events.Range{Start: 3, End: 12},
		SummaryRange:    events.Range{Start: 3, End: 8},
		TailStart:       8,
	})
	require.NoError(t, err)
	require.NotNil(t, v.Allowed(), "%s", v.Type)
	require.Equal(t, events.KindAllowed, v.Kind())
	require.NotNil(t, v.Previous)
	require.Equal(t, events.KindRefused, v.Previous.Kind())
	ref := v.Previous.Refused()
	require.NotNil(t, ref)
	require.Equal(t, events.NextRetry, ref.Next)
	require.Len(t, ref.Reasons, 1)
	assert.Equal(t, events.ReasonCoverageHole, ref.Reasons[0].Code)
	assert.Equal(t, []events.Range{{Start: 0, End: 3}}, ref.Reasons[0].AtRisk)
	require.NotNil(t, ref.Spill)
	assert.Equal(t, v.Request.RequestID, v.Previous.Request.RequestID, "a retry keeps the request id")
	assert.NotEqual(t, v.EventID, v.Previous.EventID, "a retry is a new event")
	assert.Equal(t, v.EventID, v.Cause.ID)
	assert.Equal(t, []events.SpillHandle{*ref.Spill}, v.Allowed().RecoveredBy)
	assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, v.Allowed().Cured)

	_, err = s.Retry(ctx, v)
	assert.ErrorIs(t, err, client.ErrNotRetryable)

	require.NoError(t, s.Commit(ctx, v.Request.RequestID))
	require.NoError(t, s.Commit(ctx, "never-requested"))
	last, err := s.RequestCompaction(ctx, events.CompactionRequested{
		RequestID: "after", SummarizerInput: events.Range{Start: 3, End: 12}, SummaryRange: events.Range{Start: 0, End: 8},
		TailStart: 8, CarriesPriorSummary: true,
	})
	require.NoError(t, err)

	// The processor handles a session's events in order: every verdict of
	// the commits is in the stream before the last request's.
	got, err := sg.verdicts(ctx, 5, 30*time.Second)
	require.NoError(t, err)
	var kinds []string
	for _, g := range got {
		kinds = append(kinds, g.Kind())
	}
	require.Equal(t, []string{events.KindSpilled, events.KindRefused, events.KindAllowed, events.KindViolation, last.Kind()}, kinds)
	assert.Equal(t, "never-requested", got[3].Data.(*events.CompactionViolation).RequestID)
	assert.Equal(t, last.ID, got[4].ID)
}

// TestConcurrentUse appends from one goroutine while two others request
// compactions: each request gets its own verdict, and the turns are stored
// in order with contiguous offsets.
func TestConcurrentUse(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "busy", Span: 4})
	require.NoError(t, err)
	for range 10 {
		_, err := s.Append(ctx, client.Turn{})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	verdicts := make([]*client.Verdict, 2)
	errs := make([]error, 3)
	for i := range 2 {
		wg.Go(func() {
			verdicts[i], errs[i] = s.RequestCompaction(ctx, events.CompactionRequested{
				RequestID:       []string{"left", "right"}[i],
				SummarizerInput: events.Range{Start: 0, End: 10},
				SummaryRange:    events.Range{Start: 0, End: 6},
				TailStart:       6,
			})
		})
	}
	wg.Go(func() {
		for range 20 {
			if _, err := s.Append(ctx, client.Turn{Content: "more"}); err != nil {
				errs[2] = err
				return
			}
		}
	})
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for i, v := range verdicts {
		assert.Equal(t, []string{"left", "right"}[i], v.Request.RequestID)
		assert.Equal(t, v.EventID, v.Cause.ID)
		assert.Equal(t, "busy", v.Session)
	}
	assert.NotEqual(t, verdicts[0].ID, verdicts[1].ID)
	require.Equal(t, uint64(30), s.Head())

	// Stream order is offset order.
	cons, err := sg.js.OrderedConsumer(ctx, sg.cfg.Names().Events, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	n, err := sg.eventsInStream(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1+30+2), n)
	next := uint64(0)
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		require.NoError(t, err)
		ev, err := events.DecodeMsg(events.Subjects{}.Events("busy"), m.Headers(), m.Data(), events.Subjects{})
		require.NoError(t, err)
		if turn, ok := ev.Body.(*events.TurnAppended); ok {
			require.Equal(t, next, turn.Offset)
			next += turn.Size
		}
	}
	require.Equal(t, uint64(30), next)
}

// TestRejectedRequest: a request seamguard cannot read (a tail_start beyond
// 2^53) comes back as a *RejectedError naming the field, not as a wait
// until the deadline.
func TestRejectedRequest(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "odd", Span: 4})
	require.NoError(t, err)
	_, err = s.RequestCompaction(ctx, events.CompactionRequested{RequestID: "huge", TailStart: 1 << 60})
	var rej *client.RejectedError
	require.ErrorAs(t, err, &rej)
	assert.Equal(t, events.CodeBadData, rej.Rejection.Code)
	assert.Equal(t, "data.tail_start", rej.Rejection.Field)
	assert.Contains(t, err.Error(), "data.tail_start")
}

// TestNoVerdictUntilTheProcessorRuns: the deadline error names the request;
// once the processor runs, the verdict is in the verdict stream.
func TestNoVerdictUntilTheProcessorRuns(t *testing.T) {
	sg := newSeamguard(t, false)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "late", Span: 1})
	require.NoError(t, err)
	_, err = s.Append(ctx, client.Turn{})
	require.NoError(t, err)
	wait, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = s.RequestCompaction(wait, events.CompactionRequested{RequestID: "r-late", SummarizerInput: events.Range{End: 1}, TailStart: 0, SummaryRange: events.Range{End: 1}})
	require.ErrorIs(t, err, client.ErrNoVerdict)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), `"r-late"`)
	assert.Contains(t, err.Error(), "late")

	sg.Run()
	got, err := sg.verdicts(ctx, 1, 30*time.Second)
	require.NoError(t, err)
	assert.Equal(t, events.KindAllowed, got[0].Kind())
	assert.Equal(t, "r-late", got[0].Data.(*events.CompactionAllowed).RequestID)
}

// TestUnpublishedEventStaysFirst: while no stream takes the session's
// events, a turn that could not be stored still counts, nothing later is
// sent past it, and Flush stores it once the stream is back, before the
// next turn.
func TestUnpublishedEventStaysFirst(t *testing.T) {
	sg := newSeamguard(t, false)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{AckTimeout: time.Second, PublishAttempts: 2})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "flaky", Span: 2})
	require.NoError(t, err)
	_, err = s.Append(ctx, client.Turn{Content: 0})
	require.NoError(t, err)

	require.NoError(t, sg.js.DeleteStream(ctx, sg.cfg.Names().Events))
	r, err := s.Append(ctx, client.Turn{Content: 1})
	require.ErrorIs(t, err, client.ErrNotPublished)
	assert.Contains(t, err.Error(), "flaky")
	assert.Equal(t, events.Range{Start: 1, End: 2}, r, "the turn counts as appended")
	_, err = s.Append(ctx, client.Turn{Content: 2})
	require.ErrorIs(t, err, client.ErrNotPublished)
	require.ErrorIs(t, s.Truncated(ctx, events.Range{End: 1}, ""), client.ErrNotPublished)
	assert.Equal(t, uint64(2), s.Head(), "nothing past the pending turn")

	_, err = processor.Provision(ctx, sg.js, sg.cfg)
	require.NoError(t, err)
	require.NoError(t, s.Flush(ctx))
	require.NoError(t, s.Flush(ctx), "nothing pending")
	r, err = s.Append(ctx, client.Turn{Content: 2})
	require.NoError(t, err)
	assert.Equal(t, events.Range{Start: 2, End: 3}, r)

	stream, err := sg.js.Stream(ctx, sg.cfg.Names().Events)
	require.NoError(t, err)
	var offsets []uint64
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		require.NoError(t, err)
		ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, events.Subjects{})
		require.NoError(t, err)
		offsets = append(offsets, ev.Body.(*events.TurnAppended).Offset)
	}
	assert.Equal(t, []uint64{1, 2}, offsets)
	n, err := sg.eventsInStream(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), n)

	// A close that could not be published is sent by the next Close.
	require.NoError(t, sg.js.DeleteStream(ctx, sg.cfg.Names().Events))
	require.ErrorIs(t, s.Close(ctx), client.ErrNotPublished)
	_, err = s.Append(ctx, client.Turn{})
	require.ErrorIs(t, err, client.ErrClosed)
	_, err = processor.Provision(ctx, sg.js, sg.cfg)
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	stream, err = sg.js.Stream(ctx, sg.cfg.Names().Events)
	require.NoError(t, err)
	m, err := stream.GetMsg(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, events.TypeSessionClosed, m.Header.Get("ce-type"))
}

// TestWrongStreamIsAnError: a publish that lands in another stream than
// the configured one fails at once instead of going missing.
func TestWrongStreamIsAnError(t *testing.T) {
	sg := newSeamguard(t, false)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{Stream: "SOMEONE_ELSES"})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.Open(ctx, client.SessionConfig{ID: "lost", Span: 2})
	require.ErrorIs(t, err, client.ErrNotPublished)
	assert.Contains(t, err.Error(), "SOMEONE_ELSES")
	assert.Less(t, time.Since(start), 2*time.Second, "not retried")
}

func TestArgumentsAndClosedSession(t *testing.T) {
	sg := newSeamguard(t, false)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	_, err = c.Open(ctx, client.SessionConfig{ID: "no spaces allowed", Span: 2})
	require.ErrorIs(t, err, client.ErrInvalid)
	s, err := c.Open(ctx, client.SessionConfig{ID: "short", Span: 2})
	require.NoError(t, err)
	_, err = s.Append(ctx, client.Turn{Size: 3})
	require.NoError(t, err)

	err = s.Truncated(ctx, events.Range{Start: 1, End: 4}, "")
	require.ErrorIs(t, err, client.ErrInvalid)
	assert.Contains(t, err.Error(), "[0, 3)")
	require.ErrorIs(t, s.Commit(ctx, ""), client.ErrInvalid)
	_, err = s.Append(ctx, client.Turn{Content: func() {}})
	require.ErrorIs(t, err, client.ErrInvalid)
	_, err = s.Retry(ctx, nil)
	require.ErrorIs(t, err, client.ErrNotRetryable)

	require.NoError(t, s.Close(ctx))
	require.NoError(t, s.Close(ctx))
	_, err = s.Append(ctx, client.Turn{})
	require.ErrorIs(t, err, client.ErrClosed)
	_, err = s.RequestCompaction(ctx, events.CompactionRequested{})
	require.ErrorIs(t, err, client.ErrClosed)
	assert.True(t, strings.Contains(err.Error(), "short"))

	n, err := sg.eventsInStream(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), n, "open, one turn, close: nothing invalid was published")
}

// TestResumeAtHead: a process that restarts resumes its session with
// SessionConfig.Head; the re-open is accepted and turns continue there.
func TestResumeAtHead(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "resumed", Span: 2})
	require.NoError(t, err)
	for range 3 {
		_, err := s.Append(ctx, client.Turn{})
		require.NoError(t, err)
	}

	again, err := c.Open(ctx, client.SessionConfig{ID: "resumed", Span: 2, Head: 3})
	require.NoError(t, err)
	r, err := again.Append(ctx, client.Turn{})
	require.NoError(t, err)
	assert.Equal(t, events.Range{Start: 3, End: 4}, r)
	v, err := again.RequestCompaction(ctx, events.CompactionRequested{
		SummarizerInput: events.Range{End: 4}, SummaryRange: events.Range{End: 2}, TailStart: 2,
	})
	require.NoError(t, err)
	require.NotNil(t, v.Allowed(), "%s", v.Type)
	assert.Equal(t, uint64(4), v.Allowed().Head)
	got, err := sg.verdicts(ctx, 1, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, v.ID, got[0].ID, "no rejection before the verdict")
}
