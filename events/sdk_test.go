package events

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	nats_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var sdkTime = time.Date(2025, 1, 2, 15, 4, 5, 123456789, time.UTC)

// sdkEvent builds an input event with the CloudEvents SDK, as an agent would.
func sdkEvent(t testing.TB, typ, session string, data any) event.Event {
	t.Helper()
	e := event.New()
	e.SetID("ev-" + typ)
	e.SetSource("urn:agent:sdk")
	e.SetType(typ)
	e.SetSubject(session)
	e.SetTime(sdkTime)
	e.SetExtension("partitionkey", session)
	e.SetExtension("attempt", 2)
	if data != nil {
		require.NoError(t, e.SetData(event.ApplicationJSON, data))
	}
	require.NoError(t, e.Validate())
	return e
}

// sdkWrite writes e as the SDK's nats_jetstream binding does: binary mode by
// default, structured mode when forced through the context.
func sdkWrite(t testing.TB, e event.Event, structured bool) (nats.Header, []byte) {
	t.Helper()
	ctx := context.Background()
	if structured {
		ctx = binding.WithForceStructured(ctx)
	}
	var body bytes.Buffer
	hdr, err := nats_jetstream.WriteMsg(ctx, binding.ToMessage(&e), &body)
	require.NoError(t, err)
	return hdr, body.Bytes()
}

var sdkInputs = []struct {
	typ  string
	data any
	want any
}{
	{TypeSessionOpened, map[string]any{"unit": "turns", "recovery_floor": map[string]any{"span": 32, "unit": "turns"}},
		&SessionOpened{Unit: UnitTurns, RecoveryFloor: Floor{Span: 32, Unit: UnitTurns}}},
	{TypeTurnAppended, map[string]any{"offset": 5, "size": 2, "role": "assistant", "content": []any{"a", map[string]any{"b": nil}}},
		&TurnAppended{Offset: 5, Size: 2, Role: "assistant", Content: json.RawMessage(`["a",{"b":null}]`)}},
	{TypeContextTruncated, map[string]any{"range": map[string]any{"start": 0, "end": 8}},
		&ContextTruncated{Range: Range{0, 8}}},
	{TypeCompactionRequested, map[string]any{"request_id": "r1", "summarizer_input": Range{8, 40}, "summary_range": Range{0, 40}, "tail_start": 40},
		&CompactionRequested{RequestID: "r1", SummarizerInput: Range{8, 40}, SummaryRange: Range{0, 40}, TailStart: 40}},
	{TypeCompactionCommitted, map[string]any{"request_id": "r1"}, &CompactionCommitted{RequestID: "r1"}},
	{TypeSessionResumed, map[string]any{"note": "accepted"}, &SessionResumed{Note: "accepted"}},
	{TypeSessionClosed, nil, &SessionClosed{}},
}

func TestSDKWrittenMessagesDecode(t *testing.T) {
	for _, in := range sdkInputs {
		for _, structured := range []bool{false, true} {
			name := in.typ + "/binary"
			if structured {
				name = in.typ + "/structured"
			}
			t.Run(name, func(t *testing.T) {
				e := sdkEvent(t, in.typ, "sess-1", in.data)
				hdr, body := sdkWrite(t, e, structured)
				if structured {
					require.Empty(t, hdr, "sdk-go writes structured mode without headers")
				} else {
					require.Equal(t, "1.0", hdr.Get("ce-specversion"))
				}
				ev, err := DecodeMsg(Subjects{}.Events("sess-1"), hdr, body, Subjects{})
				require.NoError(t, err)
				assert.Equal(t, in.want, ev.Body)
				assert.Equal(t, e.ID(), ev.ID)
				assert.Equal(t, "urn:agent:sdk", ev.Source)
				assert.Equal(t, in.typ, ev.Type)
				assert.Equal(t, "sess-1", ev.Subject)
				assert.True(t, sdkTime.Equal(ev.Time), "time %v", ev.Time)
				assert.Equal(t, json.RawMessage(`"sess-1"`), ev.Extensions["partitionkey"])
				attempt := json.RawMessage(`2`) // a JSON number in structured mode,
				if !structured {
					attempt = json.RawMessage(`"2"`) // a header string in binary mode
				}
				assert.Equal(t, attempt, ev.Extensions["attempt"])
				if in.data != nil {
					assert.Equal(t, event.ApplicationJSON, ev.DataContentType)
					assert.JSONEq(t, string(e.Data()), string(ev.Data))
				}
				requireRoundTrip(t, ev)

				// the spill line of the event is itself readable by the SDK
				line, err := MarshalStructured(ev)
				require.NoError(t, err)
				var back event.Event
				require.NoError(t, json.Unmarshal(line, &back))
				require.NoError(t, back.Validate())
				assert.Equal(t, e.ID(), back.ID())
				assert.Equal(t, e.Subject(), back.Subject())
				assert.True(t, e.Time().Equal(back.Time()))
			})
		}
	}
}

func TestSDKWrittenBadEventIsRejected(t *testing.T) {
	e := sdkEvent(t, TypeTurnAppended, "sess-1", map[string]any{"offset": -1, "size": 1})
	for _, structured := range []bool{false, true} {
		hdr, body := sdkWrite(t, e, structured)
		_, err := DecodeMsg(Subjects{}.Events("sess-1"), hdr, body, Subjects{})
		requireCode(t, err, CodeBadData, "data.offset")
		_, err = DecodeMsg(Subjects{}.Events("sess-2"), hdr, body, Subjects{})
		requireCode(t, err, CodeSubjectMismatch, "subject")
	}
}

func TestEncodedOutputsParseWithSDK(t *testing.T) {
	enc := Encoder{Source: "urn:seamguard:p1", Now: func() time.Time { return sdkTime }}
	for _, o := range sampleOutputs() {
		t.Run(o.Type, func(t *testing.T) {
			id, _, body, err := enc.Encode(o)
			require.NoError(t, err)
			var e event.Event
			require.NoError(t, json.Unmarshal(body, &e))
			require.NoError(t, e.Validate())
			assert.Equal(t, "1.0", e.SpecVersion())
			assert.Equal(t, id, e.ID())
			assert.Equal(t, "urn:seamguard:p1", e.Source())
			assert.Equal(t, o.Type, e.Type())
			assert.Equal(t, o.Session, e.Subject())
			assert.True(t, sdkTime.Equal(e.Time()))
			assert.Equal(t, event.ApplicationJSON, e.DataContentType())
			assert.Equal(t, map[string]any{"causationid": o.Cause.ID}, e.Extensions())
			want, err := json.Marshal(o.Data)
			require.NoError(t, err)
			assert.JSONEq(t, string(want), string(e.Data()))

			// and through the SDK's NATS binding, as a subscriber using it would read it
			msg := &nats.Msg{Subject: "x", Header: nats.Header{"Content-Type": {ContentTypeCloudEventsJSON}}, Data: body}
			viaBinding, err := binding.ToEvent(context.Background(), nats_jetstream.NewMessage(msg))
			require.NoError(t, err)
			assert.Equal(t, e.String(), viaBinding.String())
		})
	}
}
