package events

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// MarshalStructured and appendString must write the bytes, and fail with
// the errors, that the reference code (encode_ref_test.go) does.

func checkMarshalRef(t testing.TB, ev *Event) {
	t.Helper()
	want, werr := marshalStructuredRef(ev)
	got, gerr := MarshalStructured(ev)
	if werr != nil || gerr != nil {
		require.Error(t, gerr, "MarshalStructured wrote %s; the reference failed: %v", got, werr)
		require.Error(t, werr, "MarshalStructured failed (%v); the reference wrote %s", gerr, want)
		require.Equal(t, werr.Error(), gerr.Error())
		require.True(t, errors.Is(gerr, ErrNotEncodable))
		return
	}
	require.Equal(t, string(want), string(got))
}

func TestMarshalStructuredMatchesRef(t *testing.T) {
	n := 0
	for _, m := range decodeInputs(t) {
		ev, err := DecodeMsg(m.subject, m.header, m.body, Subjects{})
		if err != nil {
			continue
		}
		n++
		checkMarshalRef(t, ev)
	}
	require.Greater(t, n, 1000)
	zone := time.FixedZone("", -(7*3600 + 30*60))
	for _, ev := range []*Event{
		nil,
		{},
		{ID: "a\"\\\n\r\t\x01\x7f<>&é\u2028\u2029\xff\xfe", Source: "s", Type: "t", Subject: "s1"},
		{ID: "e", Time: time.Date(2025, 1, 2, 3, 4, 5, 6, zone)},
		{ID: "e", Time: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{ID: "e", Time: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
		{ID: "e", Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{ID: "e", Time: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{ID: "e", Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("odd", 37))},
		{ID: "e", DataContentType: "application/json; charset=\"utf-8\""},
		{ID: "e", Data: json.RawMessage(` { "a" : [1, 2] } `)},
		{ID: "e", Data: json.RawMessage(`{"a":`)},
		{ID: "e", Data: json.RawMessage(``)},
		{ID: "e", Data: json.RawMessage(`null`)},
		{ID: "e", Body: &TurnAppended{Offset: 1, Size: 2, Content: json.RawMessage(` [ 1 ] `)}},
		{ID: "e", Body: &SessionClosed{}},
		{ID: "e", Body: &TurnAppended{Content: json.RawMessage(`{`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"b": json.RawMessage(`2`), "a": json.RawMessage(` "x y" `), "c": json.RawMessage(`null`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"a": json.RawMessage(`{}`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"a": json.RawMessage(`[`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"id": json.RawMessage(`"x"`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"data": json.RawMessage(`"x"`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"A": json.RawMessage(`"x"`)}},
		{ID: "e", Extensions: map[string]json.RawMessage{"a1": json.RawMessage(`1`), "a2": json.RawMessage(`2`), "a3": json.RawMessage(`3`),
			"a4": json.RawMessage(`4`), "a5": json.RawMessage(`5`), "a6": json.RawMessage(`6`), "a7": json.RawMessage(`7`), "a8": json.RawMessage(`8`),
			"a9": json.RawMessage(`9`), "b0": json.RawMessage(`true`)}},
	} {
		checkMarshalRef(t, ev)
	}
}

func FuzzMarshalStructured(f *testing.F) {
	f.Add("ev-1", "urn:a", TypeTurnAppended, "s1", int64(1735787045), int32(0), int16(0), "application/json", "partitionkey", []byte(`"s1"`), []byte(validData[TypeTurnAppended]))
	f.Add("a\"\\\n\x01\x7f\u2028é\xff", "", "", "", int64(0), int32(5), int16(-450), "", "", []byte(nil), []byte(` {"a" : 1} `))
	f.Add("e", "s", "t", "s1", int64(253402300800), int32(0), int16(60), "x", "ext", []byte(`{}`), []byte(`{"a":`))
	f.Add("e", "s", "t", "s1", int64(-62135596801), int32(999999999), int16(1), "x", "Ext", []byte(`1.5e3`), []byte(``))
	f.Fuzz(func(t *testing.T, id, source, typ, subject string, sec int64, nsec int32, offMin int16, dct, extName string, extVal, data []byte) {
		ev := &Event{ID: id, Source: source, Type: typ, Subject: subject, DataContentType: dct, Data: data}
		if sec != 0 || nsec != 0 {
			ev.Time = time.Unix(sec, int64(nsec)).In(time.FixedZone("", int(offMin)*60))
		}
		if extName != "" {
			ev.Extensions = map[string]json.RawMessage{extName: extVal, "zz": json.RawMessage(`"z"`)}
		}
		checkMarshalRef(t, ev)
		require.Equal(t, string(appendStringRef(nil, id)), string(appendString(nil, id)))
		require.Equal(t, string(appendStringRef([]byte("x"), source)), string(appendString([]byte("x"), source)))
	})
}
