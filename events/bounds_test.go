package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExcerpt(t *testing.T) {
	long := strings.Repeat("a", 600_000)
	cases := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"short", "req-1", "req-1"},
		{"at the bound", strings.Repeat("x", MaxQuoteBytes), strings.Repeat("x", MaxQuoteBytes)},
		{"one over", strings.Repeat("x", MaxQuoteBytes+1), strings.Repeat("x", MaxQuoteBytes) + "…[1 more bytes]"},
		{"600 KB", long, long[:MaxQuoteBytes] + "…[599744 more bytes]"},
		// "é" is 2 bytes: 255 bytes of "x" then "é" would end at 257, so
		// the cut falls before it rather than inside it.
		{"rune across the bound", strings.Repeat("x", 255) + "é" + "yy", strings.Repeat("x", 255) + "…[4 more bytes]"},
		// "😀" is 4 bytes; starting at 254 it would end at 258.
		{"4-byte rune across the bound", strings.Repeat("x", 254) + "😀", strings.Repeat("x", 254) + "…[4 more bytes]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Excerpt(tc.in)
			assert.Equal(t, tc.want, got)
			kept, _, _ := strings.Cut(got, "…[")
			assert.LessOrEqual(t, len(kept), MaxQuoteBytes)
			assert.True(t, strings.HasPrefix(tc.in, kept))
			if utf8.ValidString(tc.in) {
				assert.True(t, utf8.ValidString(got), "a cut on a rune boundary keeps valid UTF-8")
			}
		})
	}
}

func TestEchoHeaders(t *testing.T) {
	t.Run("small headers are echoed as they are", func(t *testing.T) {
		h := map[string][]string{"Ce-Id": {"e1"}, "Nats-Msg-Id": {"e1"}, "X-Trace": {"a", "b"}}
		echo, omitted := EchoHeaders(h)
		assert.Equal(t, h, echo)
		assert.Zero(t, omitted)
		echo["Ce-Id"][0] = "changed"
		assert.Equal(t, "e1", h["Ce-Id"][0], "the echo shares no memory with the input")
	})
	t.Run("nil gives an empty map", func(t *testing.T) {
		echo, omitted := EchoHeaders(nil)
		assert.NotNil(t, echo)
		assert.Empty(t, echo)
		assert.Zero(t, omitted)
	})
	t.Run("a 600 KB value is cut", func(t *testing.T) {
		h := map[string][]string{"Ce-Id": {strings.Repeat("i", 600_000)}, "Ce-Source": {"urn:a"}}
		echo, omitted := EchoHeaders(h)
		assert.Zero(t, omitted)
		assert.Equal(t, Excerpt(h["Ce-Id"][0]), echo["Ce-Id"][0])
		assert.Contains(t, echo["Ce-Id"][0], "…[599744 more bytes]")
		assert.Equal(t, []string{"urn:a"}, echo["Ce-Source"])
	})
	t.Run("too many values of a name", func(t *testing.T) {
		h := map[string][]string{"X": {"1", "2", "3", "4", "5", "6"}}
		echo, omitted := EchoHeaders(h)
		assert.Equal(t, []string{"1", "2", "3", "4"}, echo["X"])
		assert.Equal(t, 2, omitted)
	})
	t.Run("too many names keeps the identifying ones", func(t *testing.T) {
		h := map[string][]string{}
		for i := range 100 {
			h[fmt.Sprintf("A-%03d", i)] = []string{"v"}
		}
		h["ce-id"] = []string{"e1"}
		h["NATS-MSG-ID"] = []string{"e1"}
		h["Empty"] = nil
		echo, omitted := EchoHeaders(h)
		assert.Len(t, echo, MaxEchoHeaders)
		assert.Equal(t, []string{"e1"}, echo["ce-id"])
		assert.Equal(t, []string{"e1"}, echo["NATS-MSG-ID"])
		assert.Contains(t, echo, "A-000")
		assert.NotContains(t, echo, "A-099")
		assert.Equal(t, 103-MaxEchoHeaders, omitted, "every value left out, and the empty header as one")
	})
	t.Run("long names that share an excerpt are merged", func(t *testing.T) {
		p := strings.Repeat("n", 300)
		h := map[string][]string{p + "a": {"1"}, p + "b": {"2"}}
		echo, omitted := EchoHeaders(h)
		assert.Zero(t, omitted)
		assert.Equal(t, map[string][]string{Excerpt(p + "a"): {"1", "2"}}, echo)
	})
	t.Run("the worst case stays within the budget", func(t *testing.T) {
		// Values that escape to six bytes a byte, and names too.
		bad := strings.Repeat("\x01", 10_000)
		h := map[string][]string{"Ce-Id": {"e1"}}
		for i := range 200 {
			h[fmt.Sprintf("%s%03d", bad[:300], i)] = []string{bad, bad, bad, bad, bad, bad}
		}
		echo, omitted := EchoHeaders(h)
		assert.Equal(t, []string{"e1"}, echo["Ce-Id"])
		assert.Positive(t, omitted)
		b, err := json.Marshal(echo)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(b), MaxEchoBytes+4*(MaxEchoHeaders*(MaxEchoValues+2)), "names and values within MaxEchoBytes, plus JSON punctuation")
		again, omitted2 := EchoHeaders(h)
		assert.Equal(t, echo, again, "deterministic")
		assert.Equal(t, omitted, omitted2)
	})
}

func TestJSONLen(t *testing.T) {
	for _, s := range []string{"", "abc", "a\"b\\c", "\n\r\t\x01\x7f", "é😀", "\u2028\u2029", "\xff\xfe", strings.Repeat("\x00é", 50)} {
		assert.Equal(t, len(appendString(nil, s)), jsonLen(s), "%q", s)
		std, err := json.Marshal(s)
		require.NoError(t, err)
		assert.LessOrEqual(t, len(std), jsonLen(s), "encoding/json never writes more: %q", s)
	}
}

// TestDecodeBounds: id, source, every extension value and request_id are at
// most MaxIDBytes, a note at most MaxNoteBytes; one byte more is too_large,
// naming the field, in both content modes and on every entry point.
func TestDecodeBounds(t *testing.T) {
	at, over := strings.Repeat("x", MaxIDBytes), strings.Repeat("x", MaxIDBytes+1)
	// Multi-byte characters count in bytes: 128 "é" are 256 bytes.
	atWide, overWide := strings.Repeat("é", MaxIDBytes/2), strings.Repeat("é", MaxIDBytes/2)+"x"
	dataWith := func(typ, field, v string) string {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(validData[typ]), &m))
		m[field] = jsonString(v)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	cases := []struct {
		name  string
		typ   string
		attrs map[string]any
		data  any
		field string // "" when the event is valid
	}{
		{"id at the bound", TypeTurnAppended, map[string]any{"id": at}, nil, ""},
		{"id over", TypeTurnAppended, map[string]any{"id": over}, nil, "id"},
		{"id of wide runes at the bound", TypeTurnAppended, map[string]any{"id": atWide}, nil, ""},
		{"id of wide runes over", TypeTurnAppended, map[string]any{"id": overWide}, nil, "id"},
		{"source at the bound", TypeTurnAppended, map[string]any{"source": at}, nil, ""},
		{"source over", TypeTurnAppended, map[string]any{"source": over}, nil, "source"},
		{"partitionkey over", TypeTurnAppended, map[string]any{"partitionkey": over}, nil, "partitionkey"},
		{"causationid at the bound", TypeTurnAppended, map[string]any{"causationid": at}, nil, ""},
		{"causationid over", TypeTurnAppended, map[string]any{"causationid": over}, nil, "causationid"},
		{"dataschema over", TypeTurnAppended, map[string]any{"dataschema": over}, nil, "dataschema"},
		{"first extension over by name", TypeTurnAppended, map[string]any{"zz": over, "aa": over}, nil, "aa"},
		{"id before extensions", TypeTurnAppended, map[string]any{"id": over, "aa": over}, nil, "id"},
		{"request_id at the bound", TypeCompactionRequested, nil, dataWith(TypeCompactionRequested, "request_id", at), ""},
		{"request_id over", TypeCompactionRequested, nil, dataWith(TypeCompactionRequested, "request_id", over), "data.request_id"},
		{"committed request_id at the bound", TypeCompactionCommitted, nil, dataWith(TypeCompactionCommitted, "request_id", at), ""},
		{"committed request_id over", TypeCompactionCommitted, nil, dataWith(TypeCompactionCommitted, "request_id", over), "data.request_id"},
		{"note at the bound", TypeSessionResumed, nil, dataWith(TypeSessionResumed, "note", strings.Repeat("n", MaxNoteBytes)), ""},
		{"note over", TypeSessionResumed, nil, dataWith(TypeSessionResumed, "note", strings.Repeat("n", MaxNoteBytes+1)), "data.note"},
		{"role is not bounded", TypeTurnAppended, nil, dataWith(TypeTurnAppended, "role", strings.Repeat("r", 5000)), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSpec(tc.typ, tc.attrs, tc.data)
			check := func(mode string, ev *Event, err error) {
				t.Helper()
				if tc.field == "" {
					require.NoError(t, err, mode)
					require.NotNil(t, ev)
					return
				}
				requireCode(t, err, CodeTooLarge, tc.field)
				var e *Error
				require.True(t, errors.As(err, &e))
				assert.Contains(t, e.Message, "bytes, more than the", mode)
				assert.Less(t, len(e.Message), 600, "%s: the message quotes no value: %s", mode, e.Message)
			}
			body := s.structured(t)
			ev, err := DecodeMsg(testNATSSubject, nil, body, Subjects{})
			check("structured", ev, err)
			checkDecode(t, testNATSSubject, nil, body, Subjects{})
			ev, err = DecodeJSON(body, Meta{})
			check("DecodeJSON", ev, err)
			checkDecodeJSON(t, body)
			h, data, ok := s.binary()
			require.True(t, ok)
			ev, err = DecodeMsg(testNATSSubject, h, data, Subjects{})
			check("binary", ev, err)
			checkDecode(t, testNATSSubject, h, data, Subjects{})
			// Percent-encoded in a header, the decoded length counts.
			if v, ok := tc.attrs["id"].(string); ok && tc.field == "" {
				h["ce-id"] = []string{strings.Replace(v, "x", "%78", 1)}
				_, err := DecodeMsg(testNATSSubject, h, data, Subjects{})
				require.NoError(t, err)
			}
		})
	}
}

// TestHugeInputsGiveSmallErrors: whatever the size of the offending input, an
// error's field and message stay small.
func TestHugeInputsGiveSmallErrors(t *testing.T) {
	huge := strings.Repeat("h", 600_000)
	hugeName := strings.Repeat("n", 600_000)
	valid := func(typ string) []byte { return newSpec(typ, nil, nil).structured(t) }
	st := string(valid(TypeTurnAppended))
	cases := []struct {
		name   string
		header map[string][]string
		body   string
		code   Code
	}{
		{"600 KB ce-id", map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {huge}, "ce-source": {"s"}, "ce-type": {TypeTurnAppended}, "ce-subject": {"s1"}}, validData[TypeTurnAppended], CodeTooLarge},
		{"600 KB id in structured mode", nil, strings.Replace(st, `"id":"ev-1"`, `"id":"`+huge+`"`, 1), CodeTooLarge},
		{"600 KB attribute name", nil, strings.Replace(st, `"id":"ev-1"`, `"id":"ev-1","`+strings.ToUpper(hugeName[:300000])+`":1`, 1), CodeMalformed},
		{"600 KB extension name, value too long", nil, strings.Replace(st, `"id":"ev-1"`, `"id":"ev-1","`+hugeName+`":"`+huge+`"`, 1), CodeTooLarge},
		{"600 KB member twice", nil, strings.Replace(st, `"id":"ev-1"`, `"id":"ev-1","`+hugeName+`":1,"`+hugeName+`":1`, 1), CodeMalformed},
		{"600 KB header name not an attribute", map[string][]string{"ce-x_" + hugeName: {"x"}, "ce-specversion": {"1.0"}}, "{}", CodeMalformed},
		{"600 KB header twice", map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {huge, huge + "x"}}, "{}", CodeMalformed},
		{"600 KB header against the body", map[string][]string{"Content-Type": {ContentTypeCloudEventsJSON}, "ce-id": {huge}}, st, CodeMalformed},
		{"600 KB content types", map[string][]string{"Content-Type": {huge, huge + "x"}}, st, CodeMalformed},
		{"600 KB number", nil, strings.Replace(st, `"offset":0`, `"offset":1.`+strings.Repeat("0", 600_000), 1), CodeBadData},
		{"600 KB negative number", nil, strings.Replace(st, `"offset":0`, `"offset":-`+strings.Repeat("1", 600_000), 1), CodeBadData},
		{"600 KB data field twice", nil, strings.Replace(st, `"offset":0`, `"offset":0,"`+hugeName+`":1,"`+hugeName+`":2`, 1), CodeBadData},
		{"600 KB session token", nil, st, CodeBadSessionID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			subject := testNATSSubject
			if tc.code == CodeBadSessionID {
				subject = "seamguard.events." + huge
			}
			_, err := DecodeMsg(subject, tc.header, []byte(tc.body), Subjects{})
			var e *Error
			require.True(t, errors.As(err, &e), "%v", err)
			assert.Equal(t, tc.code, e.Code, e.Message)
			assert.LessOrEqual(t, len(e.Field), MaxQuoteBytes+32)
			assert.Less(t, len(e.Message), 2048, "message: %.300s", e.Message)
		})
	}
	// The same through every entry point's checks.
	for _, m := range []decodeInput{
		{testNATSSubject, map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {huge}, "ce-source": {"s"}, "ce-type": {TypeTurnAppended}, "ce-subject": {"s1"}}, []byte(validData[TypeTurnAppended])},
		{testNATSSubject, nil, []byte(strings.Replace(st, `"id":"ev-1"`, `"id":"`+huge+`"`, 1))},
	} {
		checkDecode(t, m.subject, m.header, m.body, Subjects{})
	}
}
