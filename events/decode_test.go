package events

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the child's zone, also where the system has no zoneinfo

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type mode int

const (
	both mode = iota
	structuredOnly
	binaryOnly
)

type rejectCase struct {
	name     string
	typ      string         // default TypeTurnAppended
	attrs    map[string]any // overrides of baseAttrs
	data     any            // nil: valid data; absent; or a raw JSON string
	natsSubj string         // default testNATSSubject
	mode     mode
	code     Code
	field    string
	binCode  Code // when binary mode gives another code, always with field "data"
}

func (c rejectCase) spec() spec {
	typ := c.typ
	if typ == "" {
		typ = TypeTurnAppended
	}
	return newSpec(typ, c.attrs, c.data)
}

func TestDecodeRejections(t *testing.T) {
	long := strings.Repeat("a", 129)
	cases := []rejectCase{
		// envelope
		{name: "specversion missing", attrs: map[string]any{"specversion": absent}, mode: structuredOnly, code: CodeMissingAttribute, field: "specversion"},
		{name: "specversion 0.3", attrs: map[string]any{"specversion": "0.3"}, code: CodeBadSpecversion, field: "specversion"},
		{name: "specversion number", attrs: map[string]any{"specversion": json.RawMessage(`1.0`)}, mode: structuredOnly, code: CodeBadSpecversion, field: "specversion"},
		{name: "specversion empty", attrs: map[string]any{"specversion": ""}, code: CodeBadSpecversion, field: "specversion"},
		{name: "id missing", attrs: map[string]any{"id": absent}, code: CodeMissingAttribute, field: "id"},
		{name: "id empty", attrs: map[string]any{"id": ""}, code: CodeMissingAttribute, field: "id"},
		{name: "id null", attrs: map[string]any{"id": json.RawMessage(`null`)}, mode: structuredOnly, code: CodeMissingAttribute, field: "id"},
		{name: "id number", attrs: map[string]any{"id": json.RawMessage(`7`)}, mode: structuredOnly, code: CodeMalformed, field: "id"},
		{name: "source missing", attrs: map[string]any{"source": absent}, code: CodeMissingAttribute, field: "source"},
		{name: "source object", attrs: map[string]any{"source": json.RawMessage(`{}`)}, mode: structuredOnly, code: CodeMalformed, field: "source"},
		{name: "type missing", attrs: map[string]any{"type": absent}, code: CodeMissingAttribute, field: "type"},
		{name: "type bool", attrs: map[string]any{"type": json.RawMessage(`true`)}, mode: structuredOnly, code: CodeMalformed, field: "type"},
		{name: "subject missing", attrs: map[string]any{"subject": absent}, code: CodeMissingAttribute, field: "subject"},
		{name: "subject empty", attrs: map[string]any{"subject": ""}, code: CodeMissingAttribute, field: "subject"},
		{name: "subject array", attrs: map[string]any{"subject": json.RawMessage(`["s1"]`)}, mode: structuredOnly, code: CodeMalformed, field: "subject"},
		{name: "subject with dot", attrs: map[string]any{"subject": "s1.x"}, code: CodeBadSessionID, field: "subject"},
		{name: "subject with space", attrs: map[string]any{"subject": "s 1"}, code: CodeBadSessionID, field: "subject"},
		{name: "subject too long", attrs: map[string]any{"subject": long}, code: CodeBadSessionID, field: "subject"},
		{name: "subject other session", attrs: map[string]any{"subject": "s2"}, natsSubj: testNATSSubject, code: CodeSubjectMismatch, field: "subject"},
		{name: "nats subject extra token", natsSubj: "seamguard.events.s1.x", code: CodeBadSessionID, field: "subject"},
		{name: "nats subject bad token", natsSubj: "seamguard.events.s$1", code: CodeBadSessionID, field: "subject"},
		{name: "nats subject elsewhere", natsSubj: "other.events.s1", code: CodeBadSessionID, field: "subject"},
		{name: "partitionkey other", attrs: map[string]any{"partitionkey": "s2"}, code: CodeSubjectMismatch, field: "partitionkey"},
		{name: "partitionkey number", attrs: map[string]any{"partitionkey": json.RawMessage(`1`)}, mode: structuredOnly, code: CodeMalformed, field: "partitionkey"},
		{name: "time not rfc3339", attrs: map[string]any{"time": "yesterday"}, code: CodeMalformed, field: "time"},
		{name: "time without zone", attrs: map[string]any{"time": "2025-01-02T15:04:05"}, code: CodeMalformed, field: "time"},
		{name: "time number", attrs: map[string]any{"time": json.RawMessage(`1700000000`)}, mode: structuredOnly, code: CodeMalformed, field: "time"},
		{name: "datacontenttype text", attrs: map[string]any{"datacontenttype": "text/plain"}, code: CodeBadData, field: "datacontenttype"},
		{name: "datacontenttype cloudevents", attrs: map[string]any{"datacontenttype": "application/cloudevents+json"}, code: CodeBadData, field: "datacontenttype"},
		{name: "datacontenttype number", attrs: map[string]any{"datacontenttype": json.RawMessage(`3`)}, mode: structuredOnly, code: CodeMalformed, field: "datacontenttype"},
		{name: "type unknown", attrs: map[string]any{"type": "io.seamguard.turn.deleted"}, code: CodeUnknownType, field: "type"},
		{name: "type output", attrs: map[string]any{"type": TypeCompactionAllowed}, code: CodeUnknownType, field: "type"},
		{name: "extension object", attrs: map[string]any{"traceparent": json.RawMessage(`{"a":1}`)}, mode: structuredOnly, code: CodeMalformed, field: "traceparent"},
		{name: "extension upper case", attrs: map[string]any{"ID": "x"}, mode: structuredOnly, code: CodeMalformed, field: "ID"},
		{name: "extension underscore", attrs: map[string]any{"trace_id": "x"}, code: CodeMalformed, field: "trace_id"},
		{name: "dataschema number", attrs: map[string]any{"dataschema": json.RawMessage(`1`)}, mode: structuredOnly, code: CodeMalformed, field: "dataschema"},
		{name: "data_base64", attrs: map[string]any{"data_base64": "e30="}, data: absent, mode: structuredOnly, code: CodeBadData, field: "data"},

		// data, whole
		{name: "data missing", data: absent, code: CodeMissingAttribute, field: "data"},
		{name: "data array", data: `[1]`, code: CodeBadData, field: "data"},
		{name: "data string", data: `"x"`, code: CodeBadData, field: "data"},
		{name: "data null", data: `null`, code: CodeBadData, field: "data"},
		{name: "data number", data: `3`, code: CodeBadData, field: "data"},
		{name: "data not json", data: `{"offset":`, mode: binaryOnly, code: CodeBadData, field: "data"},
		{name: "data duplicate field", data: `{"offset":0,"size":1,"offset":5}`, code: CodeBadData, field: "data.offset"},

		// session.opened
		{name: "opened unit missing", typ: TypeSessionOpened, data: `{"recovery_floor":{"span":3,"unit":"turns"}}`, code: CodeBadData, field: "data.unit"},
		{name: "opened unit unknown", typ: TypeSessionOpened, data: `{"unit":"bytes","recovery_floor":{"span":3,"unit":"turns"}}`, code: CodeBadData, field: "data.unit"},
		{name: "opened unit number", typ: TypeSessionOpened, data: `{"unit":1,"recovery_floor":{"span":3,"unit":"turns"}}`, code: CodeBadData, field: "data.unit"},
		{name: "opened floor missing", typ: TypeSessionOpened, data: `{"unit":"turns"}`, code: CodeBadData, field: "data.recovery_floor"},
		{name: "opened floor null", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":null}`, code: CodeBadData, field: "data.recovery_floor"},
		{name: "opened floor number", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":3}`, code: CodeBadData, field: "data.recovery_floor"},
		{name: "opened span missing", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span negative", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":-1,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span negative zero", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":-0,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span fraction", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":1.5,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span integral fraction", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":2.0,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span exponent", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":1e3,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span string", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":"3","unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span over 2^53", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":9007199254740993,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened span over uint64", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":99999999999999999999999999,"unit":"turns"}}`, code: CodeBadData, field: "data.recovery_floor.span"},
		{name: "opened floor unit missing", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":3}}`, code: CodeBadData, field: "data.recovery_floor.unit"},
		{name: "opened floor unit unknown", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":3,"unit":"Turns"}}`, code: CodeBadData, field: "data.recovery_floor.unit"},
		{name: "opened window negative", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":3,"unit":"turns"},"window":-5}`, code: CodeBadData, field: "data.window"},
		{name: "opened trigger string", typ: TypeSessionOpened, data: `{"unit":"turns","recovery_floor":{"span":3,"unit":"turns"},"trigger":"x"}`, code: CodeBadData, field: "data.trigger"},

		// turn.appended
		{name: "turn offset missing", data: `{"size":1}`, code: CodeBadData, field: "data.offset"},
		{name: "turn offset negative", data: `{"offset":-1,"size":1}`, code: CodeBadData, field: "data.offset"},
		{name: "turn offset plus sign", data: `{"offset":+1,"size":1}`, mode: structuredOnly, code: CodeMalformed, field: "", binCode: CodeBadData},
		{name: "turn offset fraction", data: `{"offset":0.5,"size":1}`, code: CodeBadData, field: "data.offset"},
		{name: "turn offset bool", data: `{"offset":true,"size":1}`, code: CodeBadData, field: "data.offset"},
		{name: "turn offset over 2^53", data: `{"offset":9007199254740993,"size":1}`, code: CodeBadData, field: "data.offset"},
		{name: "turn size missing", data: `{"offset":0}`, code: CodeBadData, field: "data.size"},
		{name: "turn size zero", data: `{"offset":0,"size":0}`, code: CodeBadData, field: "data.size"},
		{name: "turn size null", data: `{"offset":0,"size":null}`, code: CodeBadData, field: "data.size"},
		{name: "turn offset+size overflow", data: `{"offset":9007199254740992,"size":1}`, code: CodeBadData, field: "data.size"},
		{name: "turn role number", data: `{"offset":0,"size":1,"role":5}`, code: CodeBadData, field: "data.role"},
		{name: "turn tokens fraction", data: `{"offset":0,"size":1,"tokens":1.25}`, code: CodeBadData, field: "data.tokens"},

		// context.truncated
		{name: "truncated range missing", typ: TypeContextTruncated, data: `{"stage":"budget"}`, code: CodeBadData, field: "data.range"},
		{name: "truncated range array", typ: TypeContextTruncated, data: `{"range":[0,8]}`, code: CodeBadData, field: "data.range"},
		{name: "truncated start missing", typ: TypeContextTruncated, data: `{"range":{"end":8}}`, code: CodeBadData, field: "data.range.start"},
		{name: "truncated end missing", typ: TypeContextTruncated, data: `{"range":{"start":0}}`, code: CodeBadData, field: "data.range.end"},
		{name: "truncated end string", typ: TypeContextTruncated, data: `{"range":{"start":0,"end":"8"}}`, code: CodeBadData, field: "data.range.end"},
		{name: "truncated start negative", typ: TypeContextTruncated, data: `{"range":{"start":-2,"end":8}}`, code: CodeBadData, field: "data.range.start"},
		{name: "truncated reversed", typ: TypeContextTruncated, data: `{"range":{"start":9,"end":8}}`, code: CodeBadData, field: "data.range"},
		{name: "truncated duplicate end", typ: TypeContextTruncated, data: `{"range":{"start":0,"end":8,"end":9}}`, code: CodeBadData, field: "data.range.end"},
		{name: "truncated stage number", typ: TypeContextTruncated, data: `{"range":{"start":0,"end":8},"stage":1}`, code: CodeBadData, field: "data.stage"},
		// pins (CONTRACT.md section 8)
		{name: "turn pinned string", typ: TypeTurnAppended, data: `{"offset":0,"size":1,"pinned":"yes"}`, code: CodeBadData, field: "data.pinned"},
		{name: "turn pinned number", typ: TypeTurnAppended, data: `{"offset":0,"size":1,"pinned":1}`, code: CodeBadData, field: "data.pinned"},
		{name: "pinned range missing", typ: TypeContextPinned, data: `{}`, code: CodeBadData, field: "data.range"},
		{name: "pinned reversed", typ: TypeContextPinned, data: `{"range":{"start":2,"end":1}}`, code: CodeBadData, field: "data.range"},
		{name: "unpinned end string", typ: TypeContextUnpinned, data: `{"range":{"start":0,"end":"1"}}`, code: CodeBadData, field: "data.range.end"},
		{name: "unpinned reversed", typ: TypeContextUnpinned, data: `{"range":{"start":2,"end":1}}`, code: CodeBadData, field: "data.range"},

		// compaction.requested
		{name: "requested request_id number", typ: TypeCompactionRequested, data: `{"request_id":5,"summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1}`, code: CodeBadData, field: "data.request_id"},
		{name: "requested input missing", typ: TypeCompactionRequested, data: `{"request_id":"r","summary_range":{"start":0,"end":1},"tail_start":1}`, code: CodeBadData, field: "data.summarizer_input"},
		{name: "requested input end missing", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0},"summary_range":{"start":0,"end":1},"tail_start":1}`, code: CodeBadData, field: "data.summarizer_input.end"},
		{name: "requested summary missing", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"tail_start":1}`, code: CodeBadData, field: "data.summary_range"},
		{name: "requested summary start negative", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":-1,"end":1},"tail_start":1}`, code: CodeBadData, field: "data.summary_range.start"},
		{name: "requested tail missing", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1}}`, code: CodeBadData, field: "data.tail_start"},
		{name: "requested tail exponent", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1E1}`, code: CodeBadData, field: "data.tail_start"},
		{name: "requested carries string", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1,"carries_prior_summary":"yes"}`, code: CodeBadData, field: "data.carries_prior_summary"},
		{name: "requested occupancy fraction", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1,"occupancy":0.9}`, code: CodeBadData, field: "data.occupancy"},
		{name: "requested threshold negative", typ: TypeCompactionRequested, data: `{"request_id":"r","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1,"threshold":-1}`, code: CodeBadData, field: "data.threshold"},

		// compaction.committed, session.resumed, session.closed
		{name: "committed request_id missing", typ: TypeCompactionCommitted, data: `{}`, code: CodeBadData, field: "data.request_id"},
		{name: "committed request_id empty", typ: TypeCompactionCommitted, data: `{"request_id":""}`, code: CodeBadData, field: "data.request_id"},
		{name: "committed request_id number", typ: TypeCompactionCommitted, data: `{"request_id":1}`, code: CodeBadData, field: "data.request_id"},
		{name: "committed data missing", typ: TypeCompactionCommitted, data: absent, code: CodeMissingAttribute, field: "data"},
		{name: "resumed note missing", typ: TypeSessionResumed, data: `{}`, code: CodeBadData, field: "data.note"},
		{name: "resumed note empty", typ: TypeSessionResumed, data: `{"note":""}`, code: CodeBadData, field: "data.note"},
		{name: "resumed note array", typ: TypeSessionResumed, data: `{"note":["x"]}`, code: CodeBadData, field: "data.note"},
		{name: "closed data array", typ: TypeSessionClosed, data: `[]`, code: CodeBadData, field: "data"},
		{name: "closed data string", typ: TypeSessionClosed, data: `"bye"`, code: CodeBadData, field: "data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.spec()
			subj := c.natsSubj
			if subj == "" {
				subj = testNATSSubject
			}
			viaNATS := c.natsSubj != ""
			if c.mode != binaryOnly {
				body := s.structured(t)
				_, err := DecodeMsg(subj, nil, body, Subjects{})
				requireCode(t, err, c.code, c.field)
				if !viaNATS {
					_, err = DecodeJSON(body, Meta{})
					requireCode(t, err, c.code, c.field)
				}
			}
			if c.mode != structuredOnly || c.binCode != "" {
				hdr, body, ok := s.binary()
				require.True(t, ok, "case cannot be sent in binary mode")
				code, field := c.code, c.field
				if c.binCode != "" {
					code, field = c.binCode, "data"
				}
				_, err := DecodeMsg(subj, hdr, body, Subjects{})
				requireCode(t, err, code, field)
			}
		})
	}
}

func TestDecodeStructuredOnlyRejections(t *testing.T) {
	cases := []struct {
		name  string
		body  string
		code  Code
		field string
	}{
		{"empty", ``, CodeMalformed, ""},
		{"white space", " \n\t", CodeMalformed, ""},
		{"not json", `hello`, CodeMalformed, ""},
		{"truncated json", `{"specversion":"1.0"`, CodeMalformed, ""},
		{"array", `[{"specversion":"1.0"}]`, CodeMalformed, ""},
		{"string", `"x"`, CodeMalformed, ""},
		{"two objects", `{} {}`, CodeMalformed, ""},
		{"trailing garbage", `{}x`, CodeMalformed, ""},
		{"invalid utf-8", "{\"id\":\"\xff\"}", CodeMalformed, ""},
		{"duplicate attribute", `{"specversion":"1.0","id":"a","id":"b"}`, CodeMalformed, "id"},
		{"duplicate via escape", `{"specversion":"1.0","id":"a","\u0069d":"b"}`, CodeMalformed, "id"},
		{"empty member name", `{"":1}`, CodeMalformed, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeJSON([]byte(c.body), Meta{})
			requireCode(t, err, c.code, c.field)
			_, err = DecodeMsg(testNATSSubject, nil, []byte(c.body), Subjects{})
			requireCode(t, err, c.code, c.field)
		})
	}
}

func binaryHeader(overrides map[string][]string) map[string][]string {
	h := map[string][]string{
		"ce-specversion":     {"1.0"},
		"ce-id":              {"ev-1"},
		"ce-source":          {"urn:agent:a"},
		"ce-type":            {TypeTurnAppended},
		"ce-subject":         {"s1"},
		"ce-time":            {"2025-01-02T15:04:05Z"},
		"ce-datacontenttype": {"application/json"},
	}
	for k, v := range overrides {
		if v == nil {
			delete(h, k)
			continue
		}
		h[k] = v
	}
	return h
}

func TestDecodeBinaryHeaders(t *testing.T) {
	body := []byte(validData[TypeTurnAppended])
	bad := []struct {
		name  string
		hdr   map[string][]string
		code  Code
		field string
	}{
		{"bad escape", binaryHeader(map[string][]string{"ce-source": {"urn:a%zz"}}), CodeMalformed, "source"},
		{"trailing percent", binaryHeader(map[string][]string{"ce-source": {"urn:a%"}}), CodeMalformed, "source"},
		{"half escape", binaryHeader(map[string][]string{"ce-id": {"a%4"}}), CodeMalformed, "id"},
		{"escape to invalid utf-8", binaryHeader(map[string][]string{"ce-id": {"a%ff"}}), CodeMalformed, "id"},
		{"raw invalid utf-8", binaryHeader(map[string][]string{"ce-id": {"a\xff"}}), CodeMalformed, "id"},
		{"twice, different", binaryHeader(map[string][]string{"ce-id": {"a", "b"}}), CodeMalformed, "id"},
		{"twice, different case", binaryHeader(map[string][]string{"Ce-Id": {"a"}, "ce-id": {"b"}}), CodeMalformed, "id"},
		{"ce-data header", binaryHeader(map[string][]string{"ce-data": {"{}"}}), CodeMalformed, "data"},
		{"empty attribute name", binaryHeader(map[string][]string{"ce-": {"x"}}), CodeMalformed, ""},
		{"content type fallback text", binaryHeader(map[string][]string{"ce-datacontenttype": nil, "Content-Type": {"text/plain"}}), CodeBadData, "datacontenttype"},
		{"content type twice", binaryHeader(map[string][]string{"Content-Type": {"application/json", "text/plain"}}), CodeMalformed, ""},
		{"empty specversion", binaryHeader(map[string][]string{"ce-specversion": {""}}), CodeBadSpecversion, "specversion"},
		{"encoded subject mismatch", binaryHeader(map[string][]string{"ce-subject": {"s%32"}}), CodeSubjectMismatch, "subject"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeMsg(testNATSSubject, c.hdr, body, Subjects{})
			requireCode(t, err, c.code, c.field)
		})
	}

	good := []struct {
		name  string
		hdr   map[string][]string
		check func(t *testing.T, ev *Event)
	}{
		{"percent-encoded values", binaryHeader(map[string][]string{"ce-subject": {"s%31"}, "ce-source": {"urn:agent:a%20b%25"}, "ce-note": {"caf%C3%A9"}}),
			func(t *testing.T, ev *Event) {
				assert.Equal(t, "s1", ev.Subject)
				assert.Equal(t, "urn:agent:a b%", ev.Source)
				assert.Equal(t, json.RawMessage(`"café"`), ev.Extensions["note"])
			}},
		{"header names in any case", binaryHeader(map[string][]string{"ce-id": nil, "CE-ID": {"ev-9"}, "ce-subject": nil, "Ce-Subject": {"s1"}}),
			func(t *testing.T, ev *Event) { assert.Equal(t, "ev-9", ev.ID) }},
		{"repeated equal values", binaryHeader(map[string][]string{"ce-id": {"ev-1", "ev-1"}, "Ce-Id": {"ev%2D1"}}),
			func(t *testing.T, ev *Event) { assert.Equal(t, "ev-1", ev.ID) }},
		{"content type fallback", binaryHeader(map[string][]string{"ce-datacontenttype": nil, "content-type": {"application/json; charset=utf-8"}}),
			func(t *testing.T, ev *Event) { assert.Equal(t, "application/json; charset=utf-8", ev.DataContentType) }},
		{"no content type at all", binaryHeader(map[string][]string{"ce-datacontenttype": nil}),
			func(t *testing.T, ev *Event) { assert.Empty(t, ev.DataContentType) }},
		{"other headers ignored", binaryHeader(map[string][]string{"Nats-Msg-Id": {"ev-1"}, "X-Trace": {"%zz"}}),
			func(t *testing.T, ev *Event) { assert.Equal(t, "ev-1", ev.ID) }},
		{"extensions", binaryHeader(map[string][]string{"ce-partitionkey": {"s1"}, "ce-traceparent": {"00-abc-01"}, "ce-dataschema": {"urn:schema"}}),
			func(t *testing.T, ev *Event) {
				assert.Equal(t, map[string]json.RawMessage{
					"partitionkey": json.RawMessage(`"s1"`),
					"traceparent":  json.RawMessage(`"00-abc-01"`),
					"dataschema":   json.RawMessage(`"urn:schema"`),
				}, ev.Extensions)
			}},
	}
	for _, c := range good {
		t.Run(c.name, func(t *testing.T) {
			ev, err := DecodeMsg(testNATSSubject, c.hdr, body, Subjects{})
			require.NoError(t, err)
			c.check(t, ev)
			requireRoundTrip(t, ev)
		})
	}
}

func TestDecodeContentMode(t *testing.T) {
	structured := newSpec(TypeTurnAppended, nil, nil).structured(t)
	binBody := []byte(validData[TypeTurnAppended])

	t.Run("no headers is structured", func(t *testing.T) {
		ev, err := DecodeMsg(testNATSSubject, nil, structured, Subjects{})
		require.NoError(t, err)
		assert.Equal(t, "ev-1", ev.ID)
	})
	t.Run("content type without specversion header is structured", func(t *testing.T) {
		ev, err := DecodeMsg(testNATSSubject, map[string][]string{"Content-Type": {"application/json"}}, structured, Subjects{})
		require.NoError(t, err)
		assert.Equal(t, "application/json", ev.DataContentType)
	})
	t.Run("cloudevents content type wins over ce-specversion", func(t *testing.T) {
		h := map[string][]string{"content-type": {"Application/CloudEvents+JSON; charset=utf-8"}, "ce-specversion": {"1.0"}, "ce-id": {"ev-1"}, "ce-subject": {"s1"}}
		ev, err := DecodeMsg(testNATSSubject, h, structured, Subjects{})
		require.NoError(t, err)
		assert.Equal(t, "ev-1", ev.ID)
	})
	t.Run("ce-specversion means binary", func(t *testing.T) {
		ev, err := DecodeMsg(testNATSSubject, binaryHeader(nil), binBody, Subjects{})
		require.NoError(t, err)
		assert.Equal(t, json.RawMessage(validData[TypeTurnAppended]), ev.Data)
		// the structured body sent in binary mode is data, not an event
		_, err = DecodeMsg(testNATSSubject, binaryHeader(nil), structured, Subjects{})
		requireCode(t, err, CodeBadData, "data.offset")
	})
	ct := []string{ContentTypeCloudEventsJSON}
	contradictions := []struct {
		name  string
		hdr   map[string][]string
		field string
	}{
		{"id differs", map[string][]string{"Content-Type": ct, "ce-id": {"ev-2"}}, "id"},
		{"subject differs", map[string][]string{"Content-Type": ct, "ce-subject": {"s2"}}, "subject"},
		{"specversion differs", map[string][]string{"Content-Type": ct, "ce-specversion": {"0.3"}}, "specversion"},
		{"header-only attribute", map[string][]string{"Content-Type": ct, "ce-partitionkey": {"s1"}}, "partitionkey"},
		{"time differs", map[string][]string{"Content-Type": ct, "ce-time": {"2025-01-02T15:04:06Z"}}, "time"},
	}
	for _, c := range contradictions {
		t.Run("structured with "+c.name, func(t *testing.T) {
			_, err := DecodeMsg(testNATSSubject, c.hdr, structured, Subjects{})
			requireCode(t, err, CodeMalformed, c.field)
		})
	}
	t.Run("structured with agreeing headers", func(t *testing.T) {
		h := map[string][]string{"Content-Type": ct, "ce-id": {"ev-1"}, "ce-time": {"2025-01-02T16:04:05+01:00"}, "ce-type": {TypeTurnAppended}}
		_, err := DecodeMsg(testNATSSubject, h, structured, Subjects{})
		require.NoError(t, err)
	})
}

func TestDecodeValid(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	want := map[string]any{
		TypeSessionOpened:       &SessionOpened{Unit: UnitTurns, RecoveryFloor: Floor{Span: 32, Unit: UnitTurns}, Window: u(200000), Trigger: u(150000)},
		TypeTurnAppended:        &TurnAppended{Offset: 0, Size: 1, Role: "user", Tokens: u(12), Content: json.RawMessage(`{"text":"hello <world> & co"}`), Pinned: true},
		TypeContextTruncated:    &ContextTruncated{Range: Range{0, 8}, Stage: "budget"},
		TypeContextPinned:       &ContextPinned{Range: Range{0, 1}},
		TypeContextUnpinned:     &ContextUnpinned{Range: Range{0, 1}},
		TypeCompactionRequested: &CompactionRequested{RequestID: "r1", SummarizerInput: Range{8, 40}, SummaryRange: Range{0, 40}, TailStart: 40, CarriesPriorSummary: true, Occupancy: u(9), Threshold: u(10)},
		TypeCompactionCommitted: &CompactionCommitted{RequestID: "r1"},
		TypeSessionResumed:      &SessionResumed{Note: "operator accepts the loss of turns 0-8"},
		TypeSessionClosed:       &SessionClosed{},
	}
	for typ, body := range want {
		t.Run(typ, func(t *testing.T) {
			s := newSpec(typ, map[string]any{"partitionkey": "s1"}, nil)
			hdr, bin, _ := s.binary()
			for name, decode := range map[string]func() (*Event, error){
				"structured": func() (*Event, error) { return DecodeMsg(testNATSSubject, nil, s.structured(t), Subjects{}) },
				"binary":     func() (*Event, error) { return DecodeMsg(testNATSSubject, hdr, bin, Subjects{}) },
				"json":       func() (*Event, error) { return DecodeJSON(s.structured(t), Meta{Seq: 3}) },
			} {
				ev, err := decode()
				require.NoError(t, err, name)
				assert.Equal(t, body, ev.Body, name)
				assert.Equal(t, "ev-1", ev.ID, name)
				assert.Equal(t, "urn:agent:a", ev.Source, name)
				assert.Equal(t, typ, ev.Type, name)
				assert.Equal(t, "s1", ev.Subject, name)
				assert.True(t, ev.Time.Equal(time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC)), name)
				assert.Equal(t, "application/json", ev.DataContentType, name)
				assert.Equal(t, map[string]json.RawMessage{"partitionkey": json.RawMessage(`"s1"`)}, ev.Extensions, name)
				assert.JSONEq(t, validData[typ], string(ev.Data), name)
				switch name {
				case "json":
					assert.Equal(t, Meta{Seq: 3}, ev.Meta)
				case "binary":
					assert.Equal(t, Meta{Subject: testNATSSubject, Headers: hdr}, ev.Meta)
				default:
					assert.Equal(t, Meta{Subject: testNATSSubject}, ev.Meta)
				}
				requireRoundTrip(t, ev)
			}
		})
	}
}

func TestDecodeLenientCases(t *testing.T) {
	cases := []struct {
		name  string
		typ   string
		attrs map[string]any
		data  any
		check func(t *testing.T, ev *Event)
	}{
		{"unknown data fields ignored", TypeTurnAppended, nil, `{"offset":3,"size":2,"future":{"x":[1,2]},"flag":true}`,
			func(t *testing.T, ev *Event) {
				assert.Equal(t, &TurnAppended{Offset: 3, Size: 2}, ev.Body)
				assert.Equal(t, json.RawMessage(`{"offset":3,"size":2,"future":{"x":[1,2]},"flag":true}`), ev.Data)
			}},
		{"data compacted", TypeTurnAppended, nil, "{ \"offset\" : 3,\n \"size\": 2 }",
			func(t *testing.T, ev *Event) { assert.Equal(t, json.RawMessage(`{"offset":3,"size":2}`), ev.Data) }},
		{"null optional fields are absent", TypeTurnAppended, nil, `{"offset":3,"size":2,"role":null,"tokens":null}`,
			func(t *testing.T, ev *Event) { assert.Equal(t, &TurnAppended{Offset: 3, Size: 2}, ev.Body) }},
		{"null content kept", TypeTurnAppended, nil, `{"offset":3,"size":2,"content":null}`,
			func(t *testing.T, ev *Event) {
				assert.Equal(t, &TurnAppended{Offset: 3, Size: 2, Content: json.RawMessage(`null`)}, ev.Body)
			}},
		{"largest offset", TypeTurnAppended, nil, `{"offset":9007199254740991,"size":1}`,
			func(t *testing.T, ev *Event) { assert.Equal(t, &TurnAppended{Offset: MaxOffset - 1, Size: 1}, ev.Body) }},
		{"requested reversed ranges and no request_id", TypeCompactionRequested, nil, `{"summarizer_input":{"start":9,"end":1},"summary_range":{"start":5,"end":2},"tail_start":3}`,
			func(t *testing.T, ev *Event) {
				assert.Equal(t, &CompactionRequested{SummarizerInput: Range{9, 1}, SummaryRange: Range{5, 2}, TailStart: 3}, ev.Body)
			}},
		{"requested empty request_id", TypeCompactionRequested, nil, `{"request_id":"","summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1,"carries_prior_summary":false}`,
			func(t *testing.T, ev *Event) { assert.Equal(t, "", ev.Body.(*CompactionRequested).RequestID) }},
		{"truncated empty range", TypeContextTruncated, nil, `{"range":{"start":4,"end":4}}`,
			func(t *testing.T, ev *Event) { assert.Equal(t, &ContextTruncated{Range: Range{4, 4}}, ev.Body) }},
		{"closed without data", TypeSessionClosed, nil, absent,
			func(t *testing.T, ev *Event) { assert.Nil(t, ev.Data); assert.Equal(t, &SessionClosed{}, ev.Body) }},
		{"closed with null", TypeSessionClosed, nil, `null`,
			func(t *testing.T, ev *Event) { assert.Equal(t, json.RawMessage(`null`), ev.Data) }},
		{"closed with anything", TypeSessionClosed, nil, `{"reason":"done","n":-1.5}`,
			func(t *testing.T, ev *Event) { assert.Equal(t, &SessionClosed{}, ev.Body) }},
		{"no time", TypeTurnAppended, map[string]any{"time": absent}, nil,
			func(t *testing.T, ev *Event) { assert.True(t, ev.Time.IsZero()) }},
		{"time with offset", TypeTurnAppended, map[string]any{"time": "2025-01-02T15:04:05.123456789+05:30"}, nil,
			func(t *testing.T, ev *Event) {
				_, off := ev.Time.Zone()
				assert.Equal(t, 5*3600+30*60, off)
				assert.Equal(t, "2025-01-02T15:04:05.123456789+05:30", ev.Time.Format(time.RFC3339Nano))
			}},
		{"no datacontenttype", TypeTurnAppended, map[string]any{"datacontenttype": absent}, nil,
			func(t *testing.T, ev *Event) { assert.Empty(t, ev.DataContentType) }},
		{"json with parameters", TypeTurnAppended, map[string]any{"datacontenttype": "Application/JSON; charset=utf-8"}, nil,
			func(t *testing.T, ev *Event) { assert.Equal(t, "Application/JSON; charset=utf-8", ev.DataContentType) }},
		{"longest session id", TypeTurnAppended, map[string]any{"subject": strings.Repeat("A-_9", 32)}, nil,
			func(t *testing.T, ev *Event) { assert.Len(t, ev.Subject, 128) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSpec(c.typ, c.attrs, c.data)
			ev, err := DecodeJSON(s.structured(t), Meta{})
			require.NoError(t, err)
			c.check(t, ev)
			requireRoundTrip(t, ev)
			hdr, body, _ := s.binary()
			ev, err = DecodeMsg(Subjects{}.Events(ev.Subject), hdr, body, Subjects{})
			require.NoError(t, err)
			c.check(t, ev)
			requireRoundTrip(t, ev)
		})
	}
}

func TestDecodeStructuredExtensions(t *testing.T) {
	body := `{"specversion":"1.0","id":"e","source":"s","type":"io.seamguard.session.closed","subject":"s1",` +
		`"partitionkey":"s1","num":42,"flag":true,"esc":"\u0041\/","gone":null,"data_base64":null}`
	ev, err := DecodeMsg(testNATSSubject, nil, []byte(body), Subjects{})
	require.NoError(t, err)
	assert.Equal(t, map[string]json.RawMessage{
		"partitionkey": json.RawMessage(`"s1"`),
		"num":          json.RawMessage(`42`),
		"flag":         json.RawMessage(`true`),
		"esc":          json.RawMessage(`"A/"`),
	}, ev.Extensions)
	requireRoundTrip(t, ev)
}

func TestDecodeHostileContent(t *testing.T) {
	turn := func(content string) []byte {
		return []byte(`{"specversion":"1.0","id":"e","source":"s","type":"io.seamguard.turn.appended","subject":"s1","data":{"offset":0,"size":1,"content":` + content + `}}`)
	}
	t.Run("deep but allowed nesting is kept raw", func(t *testing.T) {
		depth := 5000
		content := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		ev, err := DecodeJSON(turn(content), Meta{})
		require.NoError(t, err)
		assert.Equal(t, json.RawMessage(content), ev.Body.(*TurnAppended).Content)
		requireRoundTrip(t, ev)
	})
	t.Run("too deep nesting is rejected", func(t *testing.T) {
		for _, depth := range []int{20000, 1 << 20} {
			content := strings.Repeat(`{"a":[`, depth) + strings.Repeat("]}", depth)
			start := time.Now()
			_, err := DecodeJSON(turn(content), Meta{})
			requireCode(t, err, CodeMalformed, "")
			hdr := binaryHeader(nil)
			_, err = DecodeMsg(testNATSSubject, hdr, []byte(`{"offset":0,"size":1,"content":`+content+`}`), Subjects{})
			requireCode(t, err, CodeBadData, "data")
			assert.Less(t, time.Since(start), 5*time.Second)
		}
	})
	t.Run("unclosed nesting is rejected", func(t *testing.T) {
		_, err := DecodeJSON(turn(strings.Repeat("[", 1<<20)), Meta{})
		requireCode(t, err, CodeMalformed, "")
	})
	t.Run("big content is linear", func(t *testing.T) {
		big := `"` + strings.Repeat("x", 1<<20) + `"`
		start := time.Now()
		ev, err := DecodeJSON(turn(big), Meta{})
		require.NoError(t, err)
		assert.Len(t, ev.Body.(*TurnAppended).Content, len(big))
		assert.Less(t, time.Since(start), 5*time.Second)
		many := "[" + strings.Repeat("[1,{\"k\":2}],", 200000) + "0]"
		_, err = DecodeJSON(turn(many), Meta{})
		require.NoError(t, err)
	})
}

func TestDecodeMsgDoesNotAliasInput(t *testing.T) {
	hdr := binaryHeader(nil)
	body := []byte(validData[TypeTurnAppended])
	ev, err := DecodeMsg(testNATSSubject, hdr, body, Subjects{})
	require.NoError(t, err)
	hdr["ce-id"][0] = "changed"
	for i := range body {
		body[i] = ' '
	}
	assert.Equal(t, "ev-1", ev.Meta.Headers["ce-id"][0])
	assert.JSONEq(t, validData[TypeTurnAppended], string(ev.Data))
	assert.Equal(t, json.RawMessage(`{"text":"hello <world> & co"}`), ev.Body.(*TurnAppended).Content)
}

func TestDecodeCustomPrefix(t *testing.T) {
	subj := Subjects{Prefix: "acme.guard"}
	body := newSpec(TypeTurnAppended, nil, nil).structured(t)
	_, err := DecodeMsg("acme.guard.events.s1", nil, body, subj)
	require.NoError(t, err)
	_, err = DecodeMsg(testNATSSubject, nil, body, subj)
	requireCode(t, err, CodeBadSessionID, "subject")
}

// Decoded times must not depend on the local time zone: a process in another
// zone must decode (and spill) the same event to equal values.
//
// The local zone is the process's, set from TZ once at start: the test runs
// itself again in a child whose zone has the event's offset (Europe/Paris,
// +01:00 in January), rather than change time.Local here, which every
// goroutine reading the clock (an embedded server's, from another test)
// would race with.
func TestDecodeTimeIgnoresLocalZone(t *testing.T) {
	decode := func(ts string) time.Time {
		t.Helper()
		ev, err := DecodeJSON(newSpec(TypeSessionClosed, map[string]any{"time": ts}, nil).structured(t), Meta{})
		require.NoError(t, err)
		requireRoundTrip(t, ev)
		return ev.Time
	}
	utc := decode("2025-01-02T15:04:05Z")
	if os.Getenv(localZoneChild) == "" {
		assert.Equal(t, utc, decode("2025-01-02T15:04:05+00:00"))
		assert.Equal(t, time.UTC, decode("2025-01-02T15:04:05-00:00").Location())
		cmd := exec.Command(os.Args[0], "-test.run=^TestDecodeTimeIgnoresLocalZone$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), localZoneChild+"=1", "TZ=Europe/Paris")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the child in zone Europe/Paris:\n%s", out)
		require.Contains(t, string(out), "--- PASS: TestDecodeTimeIgnoresLocalZone", "the child ran the test:\n%s", out)
		return
	}
	_, offset := time.Date(2025, 1, 2, 16, 4, 5, 0, time.Local).Zone()
	require.Equal(t, 3600, offset, "the child's local zone has the event's offset")
	ts := decode("2025-01-02T16:04:05+01:00")
	assert.Equal(t, "", ts.Location().String(), "an unnamed fixed zone, not the local one")
	assert.True(t, ts.Equal(utc))
	assert.Equal(t, "2025-01-02T16:04:05+01:00", ts.Format(time.RFC3339))
}

// localZoneChild marks the child process of TestDecodeTimeIgnoresLocalZone.
const localZoneChild = "SEAMGUARD_TEST_LOCAL_ZONE_CHILD"

// TestDecodeCarriedPins: carried_pins decodes into ranges (reversed ones
// too), and anything but a list of ranges decodes with the problem named
// for the ledger's invalid_request, never as a rejection.
func TestDecodeCarriedPins(t *testing.T) {
	want := []struct {
		pins    []Range
		invalid string
	}{
		{pins: []Range{{0, 1}}},
		{pins: []Range{}},
		{},
		{pins: []Range{{3, 1}}},
		{invalid: "carried_pins is a string"},
		{invalid: "carried_pins[0] is an array"},
		{invalid: "carried_pins is an object"},
		{invalid: "carried_pins[0] needs start and end"},
		{invalid: "carried_pins[0] needs start and end"},
	}
	require.Len(t, want, len(carriedPinsData))
	for i, data := range carriedPinsData {
		s := newSpec(TypeCompactionRequested, nil, data)
		ev, err := DecodeJSON(s.structured(t), Meta{})
		require.NoError(t, err, data)
		b := ev.Body.(*CompactionRequested)
		assert.Equal(t, want[i].pins, b.CarriedPins, data)
		if want[i].invalid == "" {
			assert.Empty(t, b.CarriedPinsInvalid, data)
		} else {
			assert.Contains(t, b.CarriedPinsInvalid, want[i].invalid, data)
		}
		checkDecodeJSON(t, s.structured(t))
	}
}

// TestAttrByHeader holds the header fast path to the matching of any
// spelling (addOther): it knows the spellings publishers use, and never
// names an attribute the folded match would not.
func TestAttrByHeader(t *testing.T) {
	for k := range attrTable {
		a := &attrTable[k]
		for _, h := range []string{"ce-" + a.name, a.header} {
			got, ok := attrByHeader(h)
			require.True(t, ok, h)
			require.Equal(t, a.kind, got, h)
		}
	}
	names := []string{"", "c", "ce", "ce-", "Ce-", "ce-x", "ce-ID", "CE-id", "cE-id", "Ce-id", "ce-Id", "ce_id", "ce-idd",
		"Ce-Datacontenttype", "ce-datacontenttype", "Ce-DataContentType", "ce-specversion", "Ce-SpecVersion", "Content-Type", "Nats-Msg-Id",
		"ce-time", "ce-tim", "ce-timex", "Ce-Time", "ce-subject", "Ce-Subject", "ce-partitionkey"}
	for _, h := range names {
		got, ok := attrByHeader(h)
		if !ok {
			continue
		}
		require.True(t, len(h) > 3 && asciiEqualFold(h[:3], "ce-"), h)
		want, wok := attrFolded(h[3:])
		require.True(t, wok, h)
		require.Equal(t, want, got, h)
	}
}
