package events

import (
	"context"
	"testing"
	"time"

	nats_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
)

// TestSDKPublishThroughJetStream publishes events with the SDK's own
// nats_jetstream sender, in both content modes, and decodes what a JetStream
// consumer receives.
func TestSDKPublishThroughJetStream(t *testing.T) {
	srv := embedded.StartTest(t)
	nc, js := srv.NC, srv.JS
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subjects := Subjects{}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "SEAMGUARD_EVENTS",
		Subjects: []string{subjects.EventsWildcard()},
		Storage:  jetstream.FileStorage,
	})
	require.NoError(t, err)

	sender, err := nats_jetstream.NewSenderFromConn(nc, "SEAMGUARD_EVENTS", subjects.Events("sess-1"), nil)
	require.NoError(t, err)
	for i, in := range sdkInputs {
		e := sdkEvent(t, in.typ, "sess-1", in.data)
		sendCtx := ctx
		if i%2 == 1 {
			sendCtx = binding.WithForceStructured(ctx)
		}
		require.NoError(t, sender.Send(sendCtx, binding.ToMessage(&e)))
	}

	cons, err := js.OrderedConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subjects.EventsWildcard()},
	})
	require.NoError(t, err)
	for i, in := range sdkInputs {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		require.NoError(t, err, "message %d", i)
		md, err := msg.Metadata()
		require.NoError(t, err)
		_, binaryMode := msg.Headers()["ce-specversion"]
		assert.Equal(t, i%2 == 0, binaryMode, "message %d content mode", i)

		ev, err := DecodeMsg(msg.Subject(), msg.Headers(), msg.Data(), subjects)
		require.NoError(t, err, "message %d", i)
		ev.Meta.Seq = md.Sequence.Stream
		assert.Equal(t, in.want, ev.Body)
		assert.Equal(t, in.typ, ev.Type)
		assert.Equal(t, "sess-1", ev.Subject)
		assert.Equal(t, uint64(i+1), ev.Meta.Seq)
		assert.Equal(t, subjects.Events("sess-1"), ev.Meta.Subject)
		assert.True(t, sdkTime.Equal(ev.Time))
		requireRoundTrip(t, ev)
	}
}

// TestPublishedOnWrongSubject publishes an SDK-written event for one session
// on another session's subject: it must be rejected as subject_mismatch.
func TestPublishedOnWrongSubject(t *testing.T) {
	nc := embedded.StartTest(t).NC
	sub, err := nc.SubscribeSync(Subjects{}.EventsWildcard())
	require.NoError(t, err)
	e := sdkEvent(t, TypeSessionResumed, "sess-1", map[string]any{"note": "x"})
	hdr, body := sdkWrite(t, e, false)
	require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: Subjects{}.Events("sess-2"), Header: hdr, Data: body}))
	msg, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	_, err = DecodeMsg(msg.Subject, msg.Header, msg.Data, Subjects{})
	requireCode(t, err, CodeSubjectMismatch, "subject")
}
