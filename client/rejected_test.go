package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// rejections collects what OnRejected is given.
type rejections chan *client.RejectedError

func (r rejections) handler(e *client.RejectedError) { r <- e }

// next waits for the next rejection.
func (r rejections) next(t *testing.T, within time.Duration) *client.RejectedError {
	t.Helper()
	select {
	case e := <-r:
		return e
	case <-time.After(within):
		t.Fatalf("no rejection within %s", within)
		return nil
	}
}

// none checks that no rejection comes within d.
func (r rejections) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case e := <-r:
		t.Fatalf("unexpected rejection: %v", e)
	case <-time.After(d):
	}
}

// TestOnRejectedClosedSession: a session id that was closed is reused.
// Every publish succeeds (the events stream stores the events), and
// OnRejected hears seamguard reject the open and each turn with
// session_closed, naming the event ids, in both content modes.
func TestOnRejectedClosedSession(t *testing.T) {
	sg := newSeamguard(t, true)
	// The agent's own connection: the processor's subscriptions are not
	// counted with the session's.
	nc, err := nats.Connect(sg.srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	stored := 0 // rejections in the verdict stream
	for _, structured := range []bool{false, true} {
		name := map[bool]string{false: "binary", true: "structured"}[structured]
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			c, err := client.New(nc, client.Config{Structured: structured})
			require.NoError(t, err)
			id := "done-" + name
			first, err := c.Open(ctx, client.SessionConfig{ID: id, Span: 2})
			require.NoError(t, err)
			require.NoError(t, first.Close(ctx))

			subs := nc.NumSubscriptions()
			got := make(rejections, 16)
			s, err := c.Open(ctx, client.SessionConfig{ID: id, Span: 2, OnRejected: got.handler})
			require.NoError(t, err, "the open is stored: the publish succeeds")
			assert.Equal(t, subs+1, nc.NumSubscriptions(), "listening on the session's rejections")
			var ids []string
			for range 3 {
				_, err := s.Append(ctx, client.Turn{Content: "lost?"})
				require.NoError(t, err)
			}
			for i := range 4 { // the open and three turns, in order
				e := got.next(t, 10*time.Second)
				assert.Equal(t, events.CodeSessionClosed, e.Rejection.Code, "rejection %d", i)
				assert.Equal(t, "subject", e.Rejection.Field)
				assert.Equal(t, id, e.Session)
				assert.Equal(t, "seamguard.events."+id, e.Rejection.Input.Subject)
				assert.NotEmpty(t, e.Signer)
				assert.Contains(t, e.Error(), "session_closed")
				ids = append(ids, e.EventID)
			}
			assert.Len(t, ids, 4)
			for _, x := range ids {
				assert.Len(t, x, 22, "a NUID the session published")
			}

			require.NoError(t, s.Close(ctx))
			assert.Equal(t, subs, nc.NumSubscriptions(), "no longer listening once the close is stored")

			// The verdict stream holds the same four rejections, with the
			// same causationids, and a fifth: the close's, which the
			// session no longer listens for.
			stored += 5
			all, err := sg.verdicts(ctx, stored, 10*time.Second)
			require.NoError(t, err)
			var causes []string
			for _, v := range all {
				if v.Session == id && v.Kind() == events.KindRejected {
					causes = append(causes, v.Cause.ID)
				}
			}
			require.Len(t, causes, 5)
			assert.Equal(t, ids, causes[:4])
			got.none(t, 100*time.Millisecond)
		})
	}
}

// TestOnRejectedOnlyOwnEvents: a second open of an open session with
// another floor is rejected already_open, and reaches the OnRejected of
// the session that sent it; the first session's events, on the same
// subject, are not reported to it, and a rejected compaction request is
// returned by RequestCompaction, not given to OnRejected.
func TestOnRejectedOnlyOwnEvents(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	firstGot := make(rejections, 16)
	first, err := c.Open(ctx, client.SessionConfig{ID: "twice", Span: 4, OnRejected: firstGot.handler})
	require.NoError(t, err)
	_, err = first.Append(ctx, client.Turn{Content: "hello"})
	require.NoError(t, err)

	// Another process opens the same session with another recovery floor.
	got := make(rejections, 16)
	second, err := c.Open(ctx, client.SessionConfig{ID: "twice", Span: 8, Head: 1, OnRejected: got.handler})
	require.NoError(t, err)
	e := got.next(t, 10*time.Second)
	assert.Equal(t, events.CodeAlreadyOpen, e.Rejection.Code)
	assert.Equal(t, "twice", e.Session)
	assert.Contains(t, e.Rejection.Message, "recovery floor of 4 turns")

	// The first session's events are its own: accepted, nothing reported
	// to either. Its request with a request id over 256 bytes is rejected
	// too_large: returned to the caller, not given to OnRejected.
	_, err = first.Append(ctx, client.Turn{Content: "again"})
	require.NoError(t, err)
	v, err := first.RequestCompaction(ctx, events.CompactionRequested{SummarizerInput: events.Range{End: 2}, TailStart: 0})
	require.NoError(t, err)
	assert.Equal(t, events.KindAllowed, v.Kind(), "%s", v.Type)
	_, err = first.RequestCompaction(ctx, events.CompactionRequested{RequestID: strings.Repeat("r", 300), SummarizerInput: events.Range{End: 1}})
	var rej *client.RejectedError
	require.ErrorAs(t, err, &rej)
	assert.Equal(t, events.CodeTooLarge, rej.Rejection.Code)
	firstGot.none(t, 300*time.Millisecond)
	got.none(t, 0)

	// The second session resumed at a stale head: its turn at offset 1
	// overlaps the first session's, and is rejected offset_conflict to it
	// alone.
	r, err := second.Append(ctx, client.Turn{})
	require.NoError(t, err)
	assert.Equal(t, events.Range{Start: 1, End: 2}, r)
	e = got.next(t, 10*time.Second)
	assert.Equal(t, events.CodeOffsetConflict, e.Rejection.Code)
	assert.Equal(t, "data.offset", e.Rejection.Field)
	assert.Contains(t, e.Rejection.Message, "[1, 2)")
	firstGot.none(t, 300*time.Millisecond)
	require.NoError(t, second.Close(ctx))
	require.NoError(t, first.Close(ctx))
}

// TestSessionStateAndTypedErrors: Closed and Pending say where a session
// stands; a NotPublishedError says whether the call's own event is kept,
// and a NoVerdictError names the request it waited for.
func TestSessionStateAndTypedErrors(t *testing.T) {
	sg := newSeamguard(t, false)
	ctx := testContext(t)
	c, err := client.New(sg.nc, client.Config{AckTimeout: 500 * time.Millisecond, PublishAttempts: 1})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "state", Span: 2})
	require.NoError(t, err)
	assert.False(t, s.Closed())
	assert.False(t, s.Pending())

	wait, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = s.RequestCompaction(wait, events.CompactionRequested{RequestID: "r-1"})
	var nv *client.NoVerdictError
	require.ErrorAs(t, err, &nv)
	assert.Equal(t, "state", nv.Session)
	assert.Equal(t, "r-1", nv.RequestID)
	assert.Len(t, nv.EventID, 22)
	assert.Empty(t, nv.Unattributed)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "is the seamguard processor running?")

	require.NoError(t, sg.js.DeleteStream(ctx, sg.cfg.Names().Events))
	r, err := s.Append(ctx, client.Turn{})
	var np *client.NotPublishedError
	require.ErrorAs(t, err, &np)
	assert.True(t, np.Kept, "the call's own turn is kept")
	assert.Equal(t, events.TypeTurnAppended, np.EventType)
	assert.Equal(t, "state", np.Session)
	assert.Equal(t, "SEAMGUARD_EVENTS", np.Stream)
	assert.Equal(t, events.Range{Start: 0, End: 1}, r)
	assert.True(t, s.Pending())
	kept := np.EventID

	err = s.Pin(ctx, events.Range{End: 1})
	require.ErrorAs(t, err, &np)
	assert.False(t, np.Kept, "nothing of the call's own was sent")
	assert.Equal(t, kept, np.EventID, "the error names the earlier event")
	assert.True(t, strings.HasPrefix(err.Error(), "the earlier event is still unpublished"), err.Error())
	require.ErrorIs(t, err, client.ErrNotPublished)

	err = s.Close(ctx)
	require.ErrorAs(t, err, &np)
	assert.False(t, s.Closed(), "the close was not built: the turn before it is still pending")
	require.ErrorIs(t, s.Flush(ctx), client.ErrNotPublished)

	_, err = processor.Provision(ctx, sg.js, sg.cfg)
	require.NoError(t, err)
	require.NoError(t, s.Flush(ctx))
	assert.False(t, s.Pending())
	require.NoError(t, s.Close(ctx))
	assert.True(t, s.Closed())
	assert.False(t, s.Pending())
}
