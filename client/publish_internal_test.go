package client

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// TestPublishIsIdempotent publishes one built event twice, as a retry after
// a lost ack does: the stream stores it once and says the second is a
// duplicate.
func TestPublishIsIdempotent(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := processor.Provision(ctx, srv.JS, processor.Config{Partitions: 1})
	require.NoError(t, err)
	c, err := New(srv.NC, Config{})
	require.NoError(t, err)
	ev, err := c.build("s1", events.TypeSessionOpened, newID(), &events.SessionOpened{
		Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 1, Unit: events.UnitTurns},
	})
	require.NoError(t, err)
	first, err := c.publish(ctx, ev)
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	other, err := c.build("s1", events.TypeTurnAppended, newID(), &events.TurnAppended{Offset: 0, Size: 1})
	require.NoError(t, err)
	_, err = c.publish(ctx, other)
	require.NoError(t, err)
	again, err := c.publish(ctx, ev)
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, first.Sequence, again.Sequence, "a duplicate's ack names the stored message's sequence, not the stream's last")
	assert.Equal(t, "SEAMGUARD_EVENTS", again.Stream)
	assert.Equal(t, events.MsgID(c.cfg.Source, ev.id), ev.msg.Header.Get(jetstream.MsgIDHeader))
}

// TestPublishMsgIDTaken: when another publisher stored a message under an
// event's message id first, the event's first publish is answered as a
// duplicate; the client reports it as not published, never as stored.
func TestPublishMsgIDTaken(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := processor.Provision(ctx, srv.JS, processor.Config{Partitions: 1})
	require.NoError(t, err)
	c, err := New(srv.NC, Config{Source: "urn:agent:a"})
	require.NoError(t, err)
	ev, err := c.build("s1", events.TypeSessionOpened, "e-1", &events.SessionOpened{
		Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 1, Unit: events.UnitTurns},
	})
	require.NoError(t, err)
	squat := nats.NewMsg(c.subjects.Events("elsewhere"))
	squat.Data = []byte(`{}`)
	_, err = srv.JS.PublishMsg(ctx, squat, jetstream.WithMsgID(events.MsgID("urn:agent:a", "e-1")))
	require.NoError(t, err)

	_, err = c.publish(ctx, ev)
	require.ErrorIs(t, err, ErrMsgIDTaken)
	assert.ErrorIs(t, err, ErrNotPublished)
	assert.Contains(t, err.Error(), "e-1")
	assert.Contains(t, err.Error(), "urn:agent:a")
}

// TestTwoSourcesSameIDs: two agents that number their events alike (ids
// 1, 2, 3, 4) publish two sessions through the client; the events stream
// keeps every event and the processor decides both sessions.
func TestTwoSourcesSameIDs(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	proc, err := processor.New(ctx, srv.JS, processor.Config{Partitions: 1, LeaseTTL: 2 * time.Second})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- proc.Run(rctx) }()
	defer func() {
		stop()
		assert.NoError(t, <-done)
	}()

	verdicts := make(chan *nats.Msg, 64)
	sub, err := srv.NC.ChanSubscribe("seamguard.verdicts.>", verdicts)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, srv.NC.Flush())

	sessions := map[string]string{"urn:agent:a": "session-a", "urn:agent:b": "session-b"}
	for _, source := range []string{"urn:agent:a", "urn:agent:b"} {
		c, err := New(srv.NC, Config{Source: source})
		require.NoError(t, err)
		session := sessions[source]
		for _, e := range []struct {
			typ, id string
			data    any
		}{
			{events.TypeSessionOpened, "1", &events.SessionOpened{Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 1, Unit: events.UnitTurns}}},
			{events.TypeTurnAppended, "2", &events.TurnAppended{Offset: 0, Size: 1}},
			{events.TypeTurnAppended, "3", &events.TurnAppended{Offset: 1, Size: 1}},
			{events.TypeCompactionRequested, "4", &events.CompactionRequested{RequestID: "r", SummarizerInput: events.Range{Start: 0, End: 2},
				SummaryRange: events.Range{Start: 0, End: 1}, TailStart: 1}},
		} {
			ev, err := c.build(session, e.typ, e.id, e.data)
			require.NoError(t, err)
			ack, err := c.publish(ctx, ev)
			require.NoError(t, err, "%s %s", source, e.id)
			assert.False(t, ack.Duplicate, "%s %s", source, e.id)
		}
	}
	info, err := proc.Resources().Events.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(8), info.State.Msgs, "both sources' events stored")

	decided := map[string]string{}
	for len(decided) < 2 {
		select {
		case m := <-verdicts:
			v, err := events.DecodeVerdict(m.Data)
			require.NoError(t, err)
			require.NotEqual(t, events.TypeEventRejected, v.Type, "%s", m.Data)
			if v.Cause.ID == "4" {
				decided[v.Session] = v.Kind()
			}
		case <-ctx.Done():
			t.Fatalf("verdicts of both sessions did not come; got %v", decided)
		}
	}
	assert.Equal(t, map[string]string{"session-a": events.KindAllowed, "session-b": events.KindAllowed}, decided)
}
