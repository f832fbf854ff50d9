package events

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var outputIDPattern = regexp.MustCompile(`^sg-[0-9a-f]{32}$`)

func TestOutputID(t *testing.T) {
	c := Cause{ID: "ev-1", Source: "urn:agent:a", Meta: Meta{Subject: testNATSSubject, Seq: 7}}
	id := OutputID(c, TypeCompactionAllowed)
	assert.Regexp(t, outputIDPattern, id)
	assert.Equal(t, id, OutputID(c, TypeCompactionAllowed), "deterministic")

	// Meta does not matter when the input has an id: a redelivery is the same input.
	redelivered := c
	redelivered.Meta.Seq = 99
	assert.Equal(t, id, OutputID(redelivered, TypeCompactionAllowed))

	seen := map[string]string{id: "base"}
	distinct := map[string]string{
		"other type":         OutputID(c, TypeCompactionRefused),
		"other id":           OutputID(Cause{ID: "ev-2", Source: c.Source}, TypeCompactionAllowed),
		"other source":       OutputID(Cause{ID: "ev-1", Source: "urn:agent:b"}, TypeCompactionAllowed),
		"shifted boundary":   OutputID(Cause{ID: "-1", Source: "urn:agent:aev"}, TypeCompactionAllowed),
		"no id":              OutputID(Cause{Meta: Meta{Subject: testNATSSubject, Seq: 7}}, TypeCompactionAllowed),
		"no id, other seq":   OutputID(Cause{Meta: Meta{Subject: testNATSSubject, Seq: 8}}, TypeCompactionAllowed),
		"no id, other subj":  OutputID(Cause{Meta: Meta{Subject: "seamguard.events.s2", Seq: 7}}, TypeCompactionAllowed),
		"no id, other type":  OutputID(Cause{Meta: Meta{Subject: testNATSSubject, Seq: 7}}, TypeEventRejected),
		"id looks like meta": OutputID(Cause{ID: testNATSSubject, Source: ""}, TypeCompactionAllowed),
	}
	for name, id := range distinct {
		assert.Regexp(t, outputIDPattern, id, name)
		prev, dup := seen[id]
		assert.False(t, dup, "%s collides with %s", name, prev)
		seen[id] = name
	}
	noID := Cause{Meta: Meta{Subject: testNATSSubject, Seq: 7, Headers: map[string][]string{"x": {"y"}}}}
	assert.Equal(t, distinct["no id"], OutputID(noID, TypeCompactionAllowed), "headers do not matter")
}

func sampleOutputs() []Output {
	cause := Cause{ID: "ev-1", Source: "urn:agent:a", Meta: Meta{Subject: testNATSSubject, Seq: 7}}
	spill := SpillHandle{Bucket: "seamguard-spills", Name: "s1/1.jsonl", Digest: "SHA-256=abc", Size: 1024,
		Range: Range{0, 48}, Events: 50, FirstSeq: 1, LastSeq: 50}
	return []Output{
		{Type: TypeCompactionAllowed, Session: "s1", Cause: cause, Data: &CompactionAllowed{
			RequestID: "r1", Head: 48, SummaryCoverage: []Range{{0, 40}}, TailStart: 40,
			RecoveredBy: []SpillHandle{spill}, Cured: []ReasonCode{ReasonSeamGap}}},
		{Type: TypeCompactionRefused, Session: "s1", Cause: cause, Data: &CompactionRefused{
			RequestID: "r1", Reasons: []Reason{{Code: ReasonCoverageHole, Message: "offsets 0-8 <lost> & gone", AtRisk: []Range{{0, 8}}}},
			Spill: &spill, Next: NextRetry}},
		{Type: TypeTranscriptSpilled, Session: "s1", Cause: cause, Data: &spill},
		{Type: TypeSessionHalted, Session: "s1", Cause: cause, Data: &SessionHalted{RequestID: "r1", Unrecoverable: []Range{{0, 8}}, Message: "halted"}},
		{Type: TypeEventRejected, Session: "s1", Cause: cause, Data: &EventRejected{Code: CodeBadData, Field: "data.offset", Message: "bad",
			Input: Meta{Subject: testNATSSubject, Seq: 7, Headers: map[string][]string{"ce-id": {"ev-1"}}}}},
		{Type: TypeCompactionViolation, Session: "s1", Cause: cause, Data: &CompactionViolation{RequestID: "r1", Message: "committed anyway"}},
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 600, time.FixedZone("", 3600))
	enc := Encoder{Source: "urn:seamguard:p1", Subjects: Subjects{Prefix: "acme"}, Now: func() time.Time { return now }}
	for _, o := range sampleOutputs() {
		t.Run(o.Type, func(t *testing.T) {
			id, subject, body, err := enc.Encode(o)
			require.NoError(t, err)
			assert.Equal(t, OutputID(o.Cause, o.Type), id)
			assert.Equal(t, "acme.verdicts.s1."+o.Kind(), subject)
			assert.NotContains(t, string(body), "\n")

			members, dup, err := parseObject(body)
			require.NoError(t, err)
			require.Empty(t, dup)
			var names []string
			for _, m := range members {
				names = append(names, m.name)
			}
			assert.Equal(t, []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "causationid", "data"}, names)

			v, err := DecodeVerdict(body)
			require.NoError(t, err)
			assert.Equal(t, id, v.ID)
			assert.Equal(t, "urn:seamguard:p1", v.Source)
			assert.True(t, now.Equal(v.Time))
			assert.Equal(t, o.Type, v.Type)
			assert.Equal(t, "s1", v.Session)
			assert.Equal(t, Cause{ID: "ev-1"}, v.Cause)
			assert.Equal(t, o.Data, v.Data)

			if o.Type == TypeCompactionRefused {
				assert.Contains(t, string(body), `"offsets 0-8 <lost> & gone"`, "no HTML escaping")
			}
			_, _, again, err := enc.Encode(o)
			require.NoError(t, err)
			assert.Equal(t, body, again, "same output, same bytes")
		})
	}
}

func TestEncodeDefaults(t *testing.T) {
	o := Output{Type: TypeEventRejected, Cause: Cause{Meta: Meta{Subject: "seamguard.events.a.b", Seq: 3}},
		Data: EventRejected{Code: CodeBadSessionID, Field: "subject", Message: "no", Input: Meta{Subject: "seamguard.events.a.b", Seq: 3}}}
	id, subject, body, err := Encoder{}.Encode(o)
	require.NoError(t, err)
	assert.Equal(t, "seamguard.verdicts._invalid.rejected", subject)
	assert.Equal(t, `{"specversion":"1.0","id":"`+id+`","source":"urn:seamguard:processor","type":"io.seamguard.event.rejected",`+
		`"datacontenttype":"application/json","data":{"code":"bad_session_id","field":"subject","message":"no",`+
		`"input":{"subject":"seamguard.events.a.b","stream_seq":3,"headers":{}}}}`, string(body))

	o.Session = "a.b" // not a session id: treated as none
	_, subject, body2, err := Encoder{}.Encode(o)
	require.NoError(t, err)
	assert.Equal(t, "seamguard.verdicts._invalid.rejected", subject)
	assert.Equal(t, body, body2)
}

func TestEncodeEmptySlices(t *testing.T) {
	outs := []Output{
		{Type: TypeCompactionAllowed, Session: "s1", Data: &CompactionAllowed{RequestID: "r"}},
		{Type: TypeCompactionRefused, Session: "s1", Data: &CompactionRefused{RequestID: "r", Reasons: []Reason{{Code: ReasonSeamGap}}, Next: NextNone}},
		{Type: TypeSessionHalted, Session: "s1", Data: &SessionHalted{RequestID: "r"}},
		{Type: TypeEventRejected, Session: "s1", Data: &EventRejected{Input: Meta{Headers: map[string][]string{"k": nil}}}},
	}
	for _, o := range outs {
		_, _, body, err := Encoder{}.Encode(o)
		require.NoError(t, err)
		// the contract's only null is a refusal without spill
		assert.NotContains(t, strings.Replace(string(body), `"spill":null`, "", 1), "null", o.Type)
		assert.NotContains(t, string(body), "causationid", "no cause id, no causationid")
	}
	_, _, body, err := Encoder{}.Encode(Output{Type: TypeCompactionRefused, Session: "s1", Data: &CompactionRefused{}})
	require.NoError(t, err)
	assert.Contains(t, string(body), `"reasons":[],"spill":null`)
	// Encode does not change its input.
	refused := &CompactionRefused{Reasons: []Reason{{Code: ReasonSeamGap}}}
	_, _, _, err = Encoder{}.Encode(Output{Type: TypeCompactionRefused, Data: refused})
	require.NoError(t, err)
	assert.Nil(t, refused.Reasons[0].AtRisk)
}

func TestEncodeErrors(t *testing.T) {
	_, _, _, err := Encoder{}.Encode(Output{Type: TypeTurnAppended, Data: &TurnAppended{}})
	assert.ErrorIs(t, err, ErrUnknownOutputType)
	_, _, _, err = Encoder{}.Encode(Output{Type: TypeCompactionAllowed, Data: &CompactionRefused{}})
	assert.ErrorIs(t, err, ErrOutputData)
	_, _, _, err = Encoder{}.Encode(Output{Type: TypeCompactionAllowed, Data: (*CompactionAllowed)(nil)})
	assert.ErrorIs(t, err, ErrOutputData)
	_, _, _, err = Encoder{}.Encode(Output{Type: TypeCompactionAllowed})
	assert.ErrorIs(t, err, ErrOutputData)
}

func TestDecodeVerdictErrors(t *testing.T) {
	good := func(mod string) []byte {
		return []byte(`{"specversion":"1.0","id":"sg-1","source":"p","type":"io.seamguard.compaction.violation"` + mod + `}`)
	}
	cases := []struct {
		name  string
		body  []byte
		code  Code
		field string
	}{
		{"not json", []byte(`x`), CodeMalformed, ""},
		{"no data", good(``), CodeMissingAttribute, "data"},
		{"data array", good(`,"data":[]`), CodeBadData, "data"},
		{"data wrong field type", good(`,"data":{"request_id":5}`), CodeBadData, "data"},
		{"input type", []byte(`{"specversion":"1.0","id":"x","source":"p","type":"io.seamguard.turn.appended","data":{}}`), CodeUnknownType, "type"},
		{"no id", []byte(`{"specversion":"1.0","source":"p","type":"io.seamguard.compaction.violation","data":{}}`), CodeMissingAttribute, "id"},
		{"old specversion", []byte(`{"specversion":"0.3","id":"x","source":"p","type":"io.seamguard.compaction.violation","data":{}}`), CodeBadSpecversion, "specversion"},
		{"subject number", good(`,"subject":1,"data":{}`), CodeMalformed, "subject"},
		{"bad time", good(`,"time":"now","data":{}`), CodeMalformed, "time"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeVerdict(c.body)
			requireCode(t, err, c.code, c.field)
		})
	}
	v, err := DecodeVerdict(good(`,"data":{"request_id":"r","extra":1}`))
	require.NoError(t, err)
	assert.Equal(t, &CompactionViolation{RequestID: "r"}, v.Data)
	assert.Equal(t, "", v.Session)
	assert.Equal(t, KindViolation, v.Kind())
}

func TestMarshalStructured(t *testing.T) {
	ev := &Event{ID: "e", Source: "s", Type: TypeTurnAppended, Subject: "s1",
		Extensions: map[string]json.RawMessage{"b": json.RawMessage(` 2 `), "a": json.RawMessage(`"x<"`)},
		Data:       json.RawMessage("{ \"offset\": 0,\n \"size\": 1, \"content\": \"<b>\" }")}
	line, err := MarshalStructured(ev)
	require.NoError(t, err)
	assert.Equal(t, `{"specversion":"1.0","id":"e","source":"s","type":"io.seamguard.turn.appended","subject":"s1","a":"x<","b":2,"data":{"offset":0,"size":1,"content":"<b>"}}`, string(line))

	built := &Event{ID: "e", Source: "s", Type: TypeCompactionCommitted, Subject: "s1", Body: &CompactionCommitted{RequestID: "r"}}
	line, err = MarshalStructured(built)
	require.NoError(t, err)
	back, err := DecodeJSON(line, Meta{})
	require.NoError(t, err)
	assert.Equal(t, built.Body, back.Body)

	closed := &Event{ID: "e", Source: "s", Type: TypeSessionClosed, Subject: "s1", Body: &SessionClosed{}}
	line, err = MarshalStructured(closed)
	require.NoError(t, err)
	assert.NotContains(t, string(line), "data")

	for name, bad := range map[string]*Event{
		"nil":             nil,
		"core extension":  {Extensions: map[string]json.RawMessage{"id": json.RawMessage(`"x"`)}},
		"bad name":        {Extensions: map[string]json.RawMessage{"A": json.RawMessage(`"x"`)}},
		"object value":    {Extensions: map[string]json.RawMessage{"a": json.RawMessage(`{}`)}},
		"invalid value":   {Extensions: map[string]json.RawMessage{"a": json.RawMessage(`x`)}},
		"invalid data":    {Data: json.RawMessage(`{`)},
		"year out of RFC": {Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		_, err := MarshalStructured(bad)
		assert.ErrorIs(t, err, ErrNotEncodable, name)
	}
}

// TestAppendStructuredAppends: AppendStructured writes after what dst
// holds, exactly what MarshalStructured writes, and reuses dst's room.
func TestAppendStructuredAppends(t *testing.T) {
	ev, err := DecodeJSON([]byte(`{"specversion":"1.0","id":"e1","source":"urn:a","type":"io.seamguard.turn.appended","subject":"s1","x":1,"data":{"offset":3,"size":1}}`), Meta{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := MarshalStructured(ev)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 4096)
	buf = append(buf, "prefix:"...)
	got, err := AppendStructured(buf, ev)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "prefix:"+string(want) {
		t.Fatalf("AppendStructured wrote %q, want %q after the prefix", got, want)
	}
	if &got[0] != &buf[0] {
		t.Fatal("AppendStructured did not reuse the room in dst")
	}
	if out, err := AppendStructured(buf, nil); err == nil || out != nil {
		t.Fatalf("a nil event: %q, %v; want nil and an error", out, err)
	}
}
