package events

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

const testNATSSubject = "seamguard.events.s1"

// validData is a valid data object for every input type.
var validData = map[string]string{
	TypeSessionOpened:       `{"unit":"turns","recovery_floor":{"span":32,"unit":"turns"},"window":200000,"trigger":150000}`,
	TypeTurnAppended:        `{"offset":0,"size":1,"role":"user","tokens":12,"content":{"text":"hello <world> & co"},"pinned":true}`,
	TypeContextTruncated:    `{"range":{"start":0,"end":8},"stage":"budget"}`,
	TypeContextPinned:       `{"range":{"start":0,"end":1}}`,
	TypeContextUnpinned:     `{"range":{"start":0,"end":1}}`,
	TypeCompactionRequested: `{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":0,"end":40},"tail_start":40,"carries_prior_summary":true,"occupancy":9,"threshold":10}`,
	TypeCompactionCommitted: `{"request_id":"r1"}`,
	TypeSessionResumed:      `{"note":"operator accepts the loss of turns 0-8"}`,
	TypeSessionClosed:       `{}`,
}

// carriedPinsData are compaction requests with carried_pins of every shape,
// valid or not: the decoder reads them all, for the ledger to
// refuse what is not a list of ranges.
var carriedPinsData = []string{
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":[{"start":0,"end":1}]}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":[]}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":null}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":[{"start":3,"end":1}]}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":"all"}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":[[0,1]]}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":{"start":0,"end":1}}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":[{"start":0}]}`,
	`{"request_id":"r1","summarizer_input":{"start":8,"end":40},"summary_range":{"start":8,"end":40},"tail_start":40,"carried_pins":[{"start":-1,"end":2}]}`,
}

// absent marks an attribute to remove, or data to leave out.
type absentT struct{}

var absent = absentT{}

// spec describes one test event. Attribute values are strings, json.RawMessage
// (structured mode only) or absent. Data is raw JSON, or nil for no data.
type spec struct {
	attrs map[string]any
	data  json.RawMessage
}

func baseAttrs(typ string) map[string]any {
	return map[string]any{
		"specversion":     "1.0",
		"id":              "ev-1",
		"source":          "urn:agent:a",
		"type":            typ,
		"subject":         "s1",
		"time":            "2025-01-02T15:04:05Z",
		"datacontenttype": "application/json",
	}
}

// newSpec returns a valid event of type typ with overrides applied. A data
// override of absent removes data; a string sets raw data.
func newSpec(typ string, overrides map[string]any, data any) spec {
	s := spec{attrs: baseAttrs(typ), data: json.RawMessage(validData[typ])}
	for k, v := range overrides {
		s.attrs[k] = v
	}
	switch d := data.(type) {
	case nil:
	case absentT:
		s.data = nil
	case string:
		s.data = json.RawMessage(d)
	}
	return s
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// structured renders s as a structured-mode body.
func (s spec) structured(t testing.TB) []byte {
	t.Helper()
	b := []byte{'{'}
	first := true
	add := func(k string, raw []byte) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, k)
		b = append(b, ':')
		b = append(b, raw...)
	}
	for _, k := range sortedKeys(s.attrs) {
		switch v := s.attrs[k].(type) {
		case absentT:
		case string:
			add(k, jsonString(v))
		case json.RawMessage:
			add(k, v)
		default:
			t.Fatalf("bad attribute value %T", v)
		}
	}
	if s.data != nil {
		add("data", s.data)
	}
	return append(b, '}')
}

// binary renders s in binary mode; ok is false when s cannot be (raw values).
func (s spec) binary() (header map[string][]string, body []byte, ok bool) {
	header = map[string][]string{}
	for k, v := range s.attrs {
		switch v := v.(type) {
		case absentT:
		case string:
			header["ce-"+k] = []string{v}
		default:
			return nil, nil, false
		}
	}
	return header, s.data, true
}

// requireCode checks that err is an *Error with the given code and field and
// a message.
func requireCode(t testing.TB, err error, code Code, field string) {
	t.Helper()
	require.Error(t, err)
	var e *Error
	require.True(t, errors.As(err, &e), "error %v (%T) is not an *Error", err, err)
	require.Equal(t, code, e.Code, "code; error: %v", err)
	require.Equal(t, field, e.Field, "field; error: %v", err)
	require.NotEmpty(t, e.Message)
}

var knownCodes = map[Code]bool{
	CodeMalformed: true, CodeMissingAttribute: true, CodeBadSpecversion: true,
	CodeBadSessionID: true, CodeSubjectMismatch: true, CodeUnknownType: true,
	CodeBadData: true, CodeTooLarge: true,
}

// requireRoundTrip checks that ev survives MarshalStructured and DecodeJSON.
func requireRoundTrip(t testing.TB, ev *Event) {
	t.Helper()
	line, err := MarshalStructured(ev)
	require.NoError(t, err)
	require.NotContains(t, string(line), "\n")
	back, err := DecodeJSON(line, Meta{})
	require.NoError(t, err, "re-decoding %s", line)
	want := *ev
	want.Meta = Meta{}
	require.Equal(t, &want, back, "round trip of %s", line)
}
