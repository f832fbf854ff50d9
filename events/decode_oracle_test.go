package events

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The oracle of decoding: what DecodeMsg, DecodeMsgOwned and DecodeJSON
// must give for every deterministic input (decodeInputs), and the promises
// they keep on any input (checkDecode, checkDecodeJSON, which the fuzz
// targets run too).
//
//   - headerCases, subjectCases and bodyCases are hand-written tables of
//     inputs with the expected rejection code and field, or acceptance.
//   - testdata/decode-outcomes.txt records the outcome of every
//     deterministic input on every entry point: the rejection code, field
//     and a digest of the message, or the event's type and a digest of the
//     whole event. TestDecodeOutcomes holds the decoder to it; after a
//     deliberate change, rewrite it with
//
//	go test ./events -run TestDecodeOutcomes -update-outcomes
//
//     and review the difference.

// decodeSubjects are the deployments each input is decoded under.
var decodeSubjects = []Subjects{{}, {Prefix: DefaultPrefix, Partitions: 16}}

// checkDecode decodes one message with DecodeMsg and DecodeMsgOwned and
// holds the outcome to the decoder's promises (see checkOutcomeOf): the
// same outcome from both, one that depends on neither argument once
// returned, and the same *Error whatever order the header's names are read
// in. It returns DecodeMsg's outcome.
func checkDecode(t testing.TB, subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, error) {
	t.Helper()
	want, werr := DecodeMsg(subject, header, body, subjects)
	checkOutcomeOf(t, want, werr)
	if werr == nil {
		checkMsgEvent(t, want, subject, header, subjects)
	}

	// DecodeMsg on copies of the arguments, which are then scribbled over:
	// the event must not depend on them afterwards. Map order differs from
	// one decoding to the next, and so must nothing else.
	h, b := cloneHeader(header), slices.Clone(body)
	got, gerr := DecodeMsg(subject, h, b, subjects)
	scribble(h, b)
	require.Equal(t, werr, gerr, "DecodeMsg error of %q %q %q", subject, header, body)
	require.Equal(t, want, got, "DecodeMsg event of %q %q %q", subject, header, body)

	// DecodeMsgOwned may keep the header and the body, which its caller
	// leaves alone.
	got, gerr = DecodeMsgOwned(subject, cloneHeader(header), slices.Clone(body), subjects)
	require.Equal(t, werr, gerr, "DecodeMsgOwned error of %q %q %q", subject, header, body)
	require.Equal(t, want, got, "DecodeMsgOwned event of %q %q %q", subject, header, body)
	return want, werr
}

// checkMsgEvent checks what DecodeMsg promises of an event it accepted:
// its Meta, and that its session is the one of the NATS subject.
func checkMsgEvent(t testing.TB, ev *Event, subject string, header map[string][]string, subjects Subjects) {
	t.Helper()
	wantHeader := header
	if len(header) == 0 {
		wantHeader = nil
	}
	require.Equal(t, Meta{Subject: subject, Headers: wantHeader, Control: subjects.IsControl(subject)}, ev.Meta)
	tok, err := subjects.SessionOf(subject)
	require.NoError(t, err, "accepted on subject %q", subject)
	require.Equal(t, tok, ev.Subject, "accepted on subject %q", subject)
}

// checkDecodeJSON does the same for DecodeJSON, and requires DecodeMsg to
// accept, on its session's subject, a structured event DecodeJSON accepts.
func checkDecodeJSON(t testing.TB, line []byte) (*Event, error) {
	t.Helper()
	meta := Meta{Subject: "x", Seq: 7, Headers: map[string][]string{"a": {"b"}}}
	want, werr := DecodeJSON(line, meta)
	checkOutcomeOf(t, want, werr)
	b := slices.Clone(line)
	got, gerr := DecodeJSON(b, meta)
	clear(b)
	require.Equal(t, werr, gerr, "DecodeJSON error of %q", line)
	require.Equal(t, want, got, "DecodeJSON event of %q", line)
	if werr == nil {
		require.Equal(t, meta, want.Meta)
		ev, err := DecodeMsg(Subjects{}.Events(want.Subject), nil, line, Subjects{})
		require.NoError(t, err, "DecodeMsg of what DecodeJSON accepts: %q", line)
		ev.Meta = meta
		require.Equal(t, want, ev, "DecodeMsg of %q", line)
	}
	return want, werr
}

// checkOutcomeOf holds one outcome to what every entry point promises
// (checkOutcome), and to the bounds of a rejection: a field and a message
// of bounded size whatever the input.
func checkOutcomeOf(t testing.TB, ev *Event, err error) {
	t.Helper()
	checkOutcome(t, ev, err)
	if e := (*Error)(nil); errors.As(err, &e) {
		require.LessOrEqual(t, len(e.Field), MaxQuoteBytes+32, "field of %v", e)
		require.Less(t, len(e.Message), 4096, "message of %v", e)
	}
}

// cloneHeader copies h deeply, keeping nil maps and slices nil.
func cloneHeader(h map[string][]string) map[string][]string {
	if h == nil {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, v := range h {
		out[k] = slices.Clone(v)
	}
	return out
}

// scribble overwrites a header and a body in place.
func scribble(h map[string][]string, b []byte) {
	if h == nil {
		h = map[string][]string{}
	}
	for k, vs := range h {
		for i := range vs {
			vs[i] = "scribbled"
		}
		h[k] = append(vs, "more")
	}
	h["Ce-Id"] = []string{"scribbled"}
	for i := range b {
		b[i] = '#'
	}
}

// decodeInput is one deterministic input.
type decodeInput struct {
	subject string
	header  map[string][]string
	body    []byte
}

// benchLikeHeader is a binary-mode header as the bench and nats.go write it
// (canonical case), with the message id.
func benchLikeHeader(typ string) map[string][]string {
	h := map[string][]string{
		"Ce-Specversion": {"1.0"}, "Ce-Id": {"s1-0042"}, "Ce-Source": {"urn:agent:bench"},
		"Ce-Type": {typ}, "Ce-Subject": {"s1"}, "Ce-Time": {"2026-11-29T12:00:00.042Z"},
		"Content-Type": {ContentTypeJSON}, "Nats-Msg-Id": {"s1-0042"},
	}
	return h
}

// dataMutations are values each data field is replaced with: wrong types,
// numbers at and past the bounds, escapes, unicode, white space, nulls.
var dataMutations = []string{
	`null`, `""`, `"x"`, `"us\u0065r"`, `"turns"`, `"t\u0075rns"`, `"é\u2028\ud83d\ude00"`, `"a\"b\\c\/"`,
	`0`, `1`, `-0`, `-1`, `0.0`, `1.5`, `1e3`, `1E1`, `12`,
	`9007199254740991`, `9007199254740992`, `9007199254740993`, `10000000000000000`, `99999999999999999999`,
	`true`, `false`, `{}`, `[]`, `[1,2]`, `{"start":0,"end":8}`, `{"start":8,"end":0}`, `{"start":0}`,
	`{"start":0,"end":9007199254740992}`, `{"start":0,"end":8,"start":1}`, `{"span":3,"unit":"turns"}`,
	`{"span":3,"unit":"tokens"}`, `{"span":null,"unit":"turns"}`, ` { "start" : 1 , "end" : 2 } `,
	// strings at and past the bounds of request_id (256 bytes) and note (4 KiB)
	`"` + strings.Repeat("x", MaxIDBytes) + `"`, `"` + strings.Repeat("x", MaxIDBytes+1) + `"`,
	`"` + strings.Repeat("é", MaxIDBytes/2) + `"`, `"` + strings.Repeat("x", MaxIDBytes-1) + `\u00e9"`,
	`"` + strings.Repeat("x", MaxNoteBytes) + `"`, `"` + strings.Repeat("x", MaxNoteBytes+1) + `"`,
}

// mutateData returns variants of a valid data object: each field replaced
// by each mutation, removed, doubled; unknown fields, escaped names, white
// space.
func mutateData(data string) []string {
	var o map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &o); err != nil {
		panic(err)
	}
	names := slices.Sorted(maps.Keys(o))
	render := func(m map[string]json.RawMessage, extra string) string {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%q:%s", k, m[k]))
		}
		if extra != "" {
			parts = append(parts, extra)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	var many []string
	for i := range 20 {
		many = append(many, fmt.Sprintf(`"x%d":%d`, i, i))
	}
	out := []string{data, render(o, `"x":{"y":[1,"z",null]}`), render(o, strings.Join(many[:16-len(o)], ",")),
		render(o, strings.Join(many[:17-len(o)], ",")), render(o, strings.Join(many, ",")), render(o, `"x":null`), " \n" + data + "\t ",
		strings.ReplaceAll(data, ":", " : "), strings.ReplaceAll(data, ",", ", ")}
	for _, name := range names {
		for _, v := range dataMutations {
			m := maps.Clone(o)
			m[name] = json.RawMessage(v)
			out = append(out, render(m, ""))
		}
		m := maps.Clone(o)
		delete(m, name)
		out = append(out, render(m, ""))
		out = append(out, render(o, fmt.Sprintf("%q:%s", name, o[name]))) // doubled
		if len(name) > 1 {
			escaped := `"` + name[:1] + `\u00` + fmt.Sprintf("%x", name[1]) + name[2:] + `"`
			out = append(out, render(m, escaped+":"+string(o[name])))
		}
	}
	return out
}

// attrMutations are values each attribute is replaced with.
var attrMutations = []string{
	"", "1.0", "0.3", "s1", "s2", "s 1", "s1.x", strings.Repeat("s", 129), "é", "a\"b\\c\n", "\u2028", "\x7f",
	"2025-01-02T15:04:05Z", "2025-01-02T15:04:05.123456789+05:30", "2025-01-02T15:04:05-00:00",
	"2025-01-02t15:04:05z", "2025-01-02T15:04:05", "application/json", "Application/JSON; charset=utf-8",
	"text/plain", ContentTypeCloudEventsJSON, TypeTurnAppended, TypeSessionClosed, "io.seamguard.other",
	// at and past MaxIDBytes, counted in bytes
	strings.Repeat("x", MaxIDBytes), strings.Repeat("x", MaxIDBytes+1), strings.Repeat("é", MaxIDBytes/2),
	strings.Repeat("é", MaxIDBytes/2) + "x", strings.Repeat("%41", MaxIDBytes),
}

// inputAdder adds an input to a list.
type inputAdder func(subject string, h map[string][]string, body string)

// decodeInputs are the deterministic inputs: the fuzz seeds, every type
// valid in both modes, mutations of them, and the hand-written cases.
func decodeInputs(t testing.TB) []decodeInput {
	var in []decodeInput
	add := func(subject string, h map[string][]string, body string) {
		in = append(in, decodeInput{subject, h, []byte(body)})
	}
	for _, s := range fuzzSeeds(t) {
		add(testNATSSubject, nil, s)
		add(testNATSSubject, map[string][]string{"Content-Type": {ContentTypeCloudEventsJSON}}, s)
	}
	for _, typ := range slices.Sorted(maps.Keys(validData)) {
		typeInputs(t, typ, add)
		for _, attr := range []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "partitionkey", "traceparent", "dataschema"} {
			attrInputs(t, typ, attr, add)
		}
	}
	for _, c := range headerCases {
		add(testNATSSubject, c.header(), validData[TypeTurnAppended])
	}
	for _, c := range subjectCases {
		add(c.subject, benchLikeHeader(TypeTurnAppended), validData[TypeTurnAppended])
		add(c.subject, nil, string(newSpec(TypeTurnAppended, nil, nil).structured(t)))
	}
	for _, c := range bodyCases {
		add(testNATSSubject, c.header, c.body)
	}
	return in
}

// typeInputs adds the inputs of type typ with its data mutated, in both
// modes.
func typeInputs(t testing.TB, typ string, add inputAdder) {
	// binary mode as the bench sends it, with every data mutation
	for _, d := range mutateData(validData[typ]) {
		add(testNATSSubject, benchLikeHeader(typ), d)
		add("seamguard.partitioned.3.s1", benchLikeHeader(typ), d)
	}
	if typ == TypeCompactionRequested {
		for _, d := range carriedPinsData {
			add(testNATSSubject, benchLikeHeader(typ), d)
			for _, m := range mutateData(d) {
				add(testNATSSubject, benchLikeHeader(typ), m)
			}
		}
	}
	add(testNATSSubject, benchLikeHeader(typ), "")
	// structured mode with every data mutation
	for _, d := range mutateData(validData[typ]) {
		add(testNATSSubject, nil, string(newSpec(typ, nil, d).structured(t)))
	}
	add(testNATSSubject, nil, string(newSpec(typ, nil, absent).structured(t)))
	add(testNATSSubject, nil, string(newSpec(typ, nil, "null").structured(t)))
}

// attrInputs adds the inputs of type typ with the attribute attr mutated,
// removed, doubled in another case, percent-encoded, in both modes.
func attrInputs(t testing.TB, typ, attr string, add inputAdder) {
	canonical := "Ce-" + strings.ToUpper(attr[:1]) + attr[1:]
	for _, v := range attrMutations {
		s := newSpec(typ, map[string]any{attr: v}, nil)
		add(testNATSSubject, nil, string(s.structured(t)))
		h, body, _ := s.binary()
		add(testNATSSubject, h, string(body))
		h = benchLikeHeader(typ)
		h[canonical] = []string{v}
		add(testNATSSubject, h, validData[typ])
	}
	s := newSpec(typ, map[string]any{attr: absent}, nil)
	add(testNATSSubject, nil, string(s.structured(t)))
	h, body, _ := s.binary()
	add(testNATSSubject, h, string(body))
	for _, raw := range []string{`null`, `1`, `1.0`, `true`, `{}`, `[]`, `"\u0073\u0031"`, `"s\u0031"`, `"a\nb"`, ` "s1" `} {
		add(testNATSSubject, nil, string(newSpec(typ, map[string]any{attr: json.RawMessage(raw)}, nil).structured(t)))
	}
	h = benchLikeHeader(typ)
	h["ce-"+attr] = []string{"x"}
	add(testNATSSubject, h, validData[typ])
	h = benchLikeHeader(typ)
	h["CE-"+strings.ToUpper(attr)] = h[canonical]
	add(testNATSSubject, h, validData[typ])
}

// headerCase is a binary-mode turn.appended with some headers of
// benchLikeHeader replaced, added or (nil, but for Ce-Id) removed, and what
// decoding it gives: a rejection's code and field, or acceptance (code "").
type headerCase struct {
	set   map[string][]string
	code  Code
	field string
}

// header returns the case's header.
func (c headerCase) header() map[string][]string {
	h := benchLikeHeader(TypeTurnAppended)
	for k, v := range c.set {
		if v == nil && k != "Ce-Id" {
			delete(h, k)
			continue
		}
		h[k] = v
	}
	return h
}

// headerCases are the headers' escapes, repeats, odd names, content types.
var headerCases = []headerCase{
	{set: map[string][]string{"Ce-Id": {"s1%2D0042"}}},
	{set: map[string][]string{"Ce-Id": {"100%"}}, code: CodeMalformed, field: "id"},
	{set: map[string][]string{"Ce-Id": {"%zz"}}, code: CodeMalformed, field: "id"},
	{set: map[string][]string{"Ce-Id": {"a%ff"}}, code: CodeMalformed, field: "id"},
	{set: map[string][]string{"Ce-Id": {"\xff"}}, code: CodeMalformed, field: "id"},
	{set: map[string][]string{"Ce-Id": {"a", "a"}}},
	{set: map[string][]string{"Ce-Id": {"a", "b"}}, code: CodeMalformed, field: "id"},
	{set: map[string][]string{"Ce-Id": {}}, code: CodeMissingAttribute, field: "id"},
	{set: map[string][]string{"Ce-Id": nil}, code: CodeMissingAttribute, field: "id"},
	{set: map[string][]string{"ce-id": {"s1-0042"}}},
	{set: map[string][]string{"ce-data": {"{}"}}, code: CodeMalformed, field: "data"},
	{set: map[string][]string{"ce-data_base64": {"e30="}}, code: CodeMalformed, field: "data"},
	{set: map[string][]string{"ce-": {"x"}}, code: CodeMalformed, field: ""},
	{set: map[string][]string{"ce-Foo_Bar": {"x"}}, code: CodeMalformed, field: "foo_bar"},
	{set: map[string][]string{"ce-ß": {"x"}}, code: CodeMalformed, field: "ß"},
	// strings.ToLower maps U+0130 to "i", and the Kelvin sign to "k".
	{set: map[string][]string{"Ce-\u0130d": {"x"}}, code: CodeMalformed, field: "id"},
	{set: map[string][]string{"Ce-\u212aind": {"x"}}},
	{set: map[string][]string{"Ce-Partitionkey": {"s1"}}},
	{set: map[string][]string{"Ce-Partitionkey": {"s2"}}, code: CodeSubjectMismatch, field: "partitionkey"},
	{set: map[string][]string{"Ce-Partitionkey": {"s%31"}}},
	{set: map[string][]string{"ce-partitionkey": {"s1"}, "Ce-PartitionKey": {"s1"}}},
	{set: map[string][]string{"Ce-Traceparent": {"00-abc-01"}}},
	{set: map[string][]string{"Ce-Traceparent": {"a"}, "ce-traceparent": {"b"}}, code: CodeMalformed, field: "traceparent"},
	{set: map[string][]string{"Ce-Traceparent": {"a"}, "ce-traceparent": {"a"}}},
	{set: map[string][]string{"Ce-Attempt": {"2"}}},
	{set: map[string][]string{"Ce-Dataschema": {"urn:x"}}},
	{set: map[string][]string{"Content-Type": {"text/plain"}}, code: CodeBadData, field: "datacontenttype"},
	{set: map[string][]string{"Content-Type": nil}},
	{set: map[string][]string{"Content-Type": {"application/json", "application/json"}}},
	{set: map[string][]string{"content-type": {"application/json"}}},
	{set: map[string][]string{"content-type": {"text/plain"}}, code: CodeMalformed, field: ""},
	{set: map[string][]string{"content-type": {"application/json; charset=utf-8"}}, code: CodeMalformed, field: ""},
	{set: map[string][]string{"Content-Type": {"application/json; charset=\xff"}}},
	{set: map[string][]string{"Content-Type": {"application/json; x=\"\n\""}}},
	// structured mode: the data is the whole event, whose "content" is an
	// object, not an extension value
	{set: map[string][]string{"Content-Type": {"Application/CloudEvents+JSON"}}, code: CodeMalformed, field: "content"},
	{set: map[string][]string{"Content-Type": {"application/json\xff"}}, code: CodeBadData, field: "datacontenttype"},
	{set: map[string][]string{"Content-Type": {" application/json ; x=1"}}},
	{set: map[string][]string{"Ce-Datacontenttype": {"application/json"}, "Content-Type": {"text/plain"}}},
	{set: map[string][]string{"Ce-Specversion": nil}, code: CodeMalformed, field: "content"},
	{set: map[string][]string{"Nats-Msg-Id": nil, "X": {"%zz"}}},
	{set: map[string][]string{"Nats-Pin-Id": {"p"}}},
	{set: map[string][]string{"ce-type": {TypeSessionClosed}}, code: CodeMalformed, field: "type"},
}

// TestDecodeHeaderCases decodes every header case under every deployment.
func TestDecodeHeaderCases(t *testing.T) {
	for _, c := range headerCases {
		for _, subj := range decodeSubjects {
			_, err := checkDecode(t, testNATSSubject, c.header(), []byte(validData[TypeTurnAppended]), subj)
			requireOutcome(t, err, c.code, c.field, "header %q", c.set)
		}
	}
}

// requireOutcome requires acceptance when code is "", else a rejection with
// code and field.
func requireOutcome(t testing.TB, err error, code Code, field string, what string, args ...any) {
	t.Helper()
	if code == "" {
		require.NoError(t, err, append([]any{what}, args...)...)
		return
	}
	var e *Error
	require.True(t, errors.As(err, &e), "%s: %v", fmt.Sprintf(what, args...), err)
	require.Equal(t, code, e.Code, "%s: %v", fmt.Sprintf(what, args...), err)
	require.Equal(t, field, e.Field, "%s: %v", fmt.Sprintf(what, args...), err)
}

// subjectCases are NATS subjects a valid turn.appended of session s1
// arrives on, in either mode and under either deployment, and the outcome.
var subjectCases = []struct {
	subject string
	code    Code // field "subject"
}{
	{"seamguard.events.s1", ""},
	{"seamguard.events.s2", CodeSubjectMismatch},
	{"seamguard.events.s1.x", CodeBadSessionID},
	{"seamguard.events.", CodeBadSessionID},
	{"seamguard.events", CodeBadSessionID},
	{"seamguard.partitioned.3.s1", ""},
	{"seamguard.partitioned..s1", CodeBadSessionID},
	{"seamguard.partitioned.x.s1", CodeBadSessionID},
	{"seamguard.partitioned.3.s1.x", CodeBadSessionID},
	{"seamguard.partitioned.3", CodeBadSessionID},
	{"other.events.s1", CodeBadSessionID},
	{"seamguardx.events.s1", CodeBadSessionID},
	{"", CodeBadSessionID},
}

// TestDecodeSubjectCases decodes a valid turn on every subject case.
func TestDecodeSubjectCases(t *testing.T) {
	st := newSpec(TypeTurnAppended, nil, nil).structured(t)
	for _, c := range subjectCases {
		field := "subject"
		if c.code == "" {
			field = ""
		}
		for _, subj := range decodeSubjects {
			_, err := checkDecode(t, c.subject, benchLikeHeader(TypeTurnAppended), []byte(validData[TypeTurnAppended]), subj)
			requireOutcome(t, err, c.code, field, "binary on %q", c.subject)
			_, err = checkDecode(t, c.subject, nil, st, subj)
			requireOutcome(t, err, c.code, field, "structured on %q", c.subject)
		}
	}
}

// bodyStructured is a valid structured turn.appended with two extensions,
// which bodyCases change.
var bodyStructured = `{"attempt":2,"datacontenttype":"application/json","id":"ev-1","partitionkey":"s1","source":"urn:agent:a","specversion":"1.0","subject":"s1","time":"2025-01-02T15:04:05Z","type":"io.seamguard.turn.appended","data":` + validData[TypeTurnAppended] + `}`

// bodyWith is bodyStructured with old replaced by new once.
func bodyWith(old, new string) string { return strings.Replace(bodyStructured, old, new, 1) }

// bodyCases are structured-mode messages: with headers, and odd bodies.
var bodyCases = []struct {
	header map[string][]string
	body   string
	code   Code
	field  string
}{
	{header: map[string][]string{"Content-Type": {ContentTypeCloudEventsJSON}, "ce-id": {"ev-1"}}, body: bodyStructured},
	{header: map[string][]string{"Content-Type": {ContentTypeCloudEventsJSON}, "ce-id": {"ev-2"}}, body: bodyStructured, code: CodeMalformed, field: "id"},
	{header: map[string][]string{"Content-Type": {ContentTypeJSON}}, body: bodyStructured},
	{header: map[string][]string{"Nats-Msg-Id": {"x"}}, body: bodyStructured},
	{header: map[string][]string{"ce-time": {"2025-01-02T15:04:05Z"}}, body: bodyStructured},
	{body: bodyStructured},
	{body: " " + bodyStructured + "\n"},
	{body: strings.ReplaceAll(bodyStructured, ",", " ,\n ")},
	{body: `{"specversion":"1.0","data_base64":null}`, code: CodeMissingAttribute, field: "id"},
	{body: bodyWith(`"id":"ev-1"`, `"id":"ev-1","id":"ev-1"`), code: CodeMalformed, field: "id"},
	{body: bodyWith(`"id"`, `"\u0069d"`)},
	{body: bodyWith(`"attempt":2`, `"attempt":null`)},
	{body: bodyWith(`"attempt":2`, `"attempt":"2"`)},
	{body: bodyWith(`"attempt":2`, `"attempt":[2]`), code: CodeMalformed, field: "attempt"},
	{body: bodyWith(`"attempt":2`, `"Attempt":2`), code: CodeMalformed, field: "Attempt"},
	{body: bodyWith(`"attempt":2`, `"attempt":1.5e-3`)},
	{body: bodyWith(`"attempt":2`, `"dataschema":2`), code: CodeMalformed, field: "dataschema"},
	{body: bodyWith(`"attempt":2`, `"dataschema":"urn:x"`)},
	{body: bodyWith(`"attempt":2`, `"x":"\u00e9\n"`)},
	{body: bodyWith(`"attempt":2`, `"data_base64":"e30="`), code: CodeBadData, field: "data"},
	{body: bodyStructured + "x", code: CodeMalformed, field: ""},
	{body: bodyStructured[:len(bodyStructured)-1], code: CodeMalformed, field: ""},
	{body: "\xff" + bodyStructured, code: CodeMalformed, field: ""},
	{body: "", code: CodeMalformed, field: ""},
	// A name "" given twice is a name given twice, in the event, in its
	// data, before a syntax error too. (The general decoder before this
	// one took "" for no name: it read such an event as having no
	// attributes, or such data as having no fields.)
	{body: bodyWith(`"attempt":2`, `"":1,"":2`), code: CodeMalformed, field: ""},
	{body: bodyWith(`"attempt":2`, `"":1,"":2,x`), code: CodeMalformed, field: ""},
	{body: bodyWith(`"offset":0`, `"offset":0,"":1,"":2`), code: CodeBadData, field: "data."},
}

// TestDecodeBodyCases decodes every body case with DecodeMsg and, without
// headers, with DecodeJSON.
func TestDecodeBodyCases(t *testing.T) {
	for _, c := range bodyCases {
		for _, subj := range decodeSubjects {
			_, err := checkDecode(t, testNATSSubject, c.header, []byte(c.body), subj)
			requireOutcome(t, err, c.code, c.field, "%q %q", c.header, c.body)
		}
		if c.header == nil {
			_, err := checkDecodeJSON(t, []byte(c.body))
			requireOutcome(t, err, c.code, c.field, "DecodeJSON %q", c.body)
		}
	}
}

// TestDecodeEntryPoints runs every deterministic input through every entry
// point, holding each to its promises, and requires that many decode.
func TestDecodeEntryPoints(t *testing.T) {
	inputs := decodeInputs(t)
	ok := 0
	for _, m := range inputs {
		for _, subj := range decodeSubjects {
			if _, err := checkDecode(t, m.subject, m.header, m.body, subj); err == nil {
				ok++
			}
		}
		if len(m.header) == 0 {
			if _, err := checkDecodeJSON(t, m.body); err == nil {
				ok++
			}
		}
	}
	t.Logf("%d inputs, %d decoded", len(inputs), ok)
	require.Greater(t, ok, len(inputs)/10, "hardly anything decodes")
}

// TestDecodeUsualShapes decodes the shapes agents send: every type in
// binary mode as the bench and the SDK write it, and in structured mode.
func TestDecodeUsualShapes(t *testing.T) {
	for typ, data := range validData {
		for _, subj := range decodeSubjects {
			for _, on := range []string{testNATSSubject, "seamguard.partitioned.3.s1"} {
				_, err := checkDecode(t, on, benchLikeHeader(typ), []byte(data), subj)
				require.NoError(t, err, "binary %s on %s", typ, on)
			}
		}
		s := newSpec(typ, map[string]any{"partitionkey": "s1", "attempt": json.RawMessage(`2`)}, nil)
		_, err := checkDecode(t, testNATSSubject, nil, s.structured(t), Subjects{})
		require.NoError(t, err, "structured %s", typ)
		_, err = checkDecodeJSON(t, s.structured(t))
		require.NoError(t, err, "DecodeJSON %s", typ)
		h, body, ok := newSpec(typ, map[string]any{"partitionkey": "s1", "attempt": "2"}, nil).binary()
		require.True(t, ok)
		_, err = checkDecode(t, testNATSSubject, h, body, Subjects{})
		require.NoError(t, err, "binary with extensions %s", typ)
	}
	for _, in := range sdkInputs {
		for _, structured := range []bool{false, true} {
			h, body := sdkWrite(t, sdkEvent(t, in.typ, "s1", in.data), structured)
			_, err := checkDecode(t, testNATSSubject, h, body, Subjects{})
			require.NoError(t, err, "sdk %s structured=%v", in.typ, structured)
		}
	}
	for _, sz := range benchSizes {
		_, err := checkDecode(t, testNATSSubject, benchLikeHeader(TypeTurnAppended), benchTurn(sz.size), Subjects{})
		require.NoError(t, err)
	}
}

var updateOutcomes = flag.Bool("update-outcomes", false, "rewrite testdata/decode-outcomes.txt from the decoder")

// outcomesFile records the outcome of every deterministic input.
const outcomesFile = "testdata/decode-outcomes.txt"

// TestDecodeOutcomes holds DecodeMsg (under each deployment) and DecodeJSON
// to the outcome recorded for every deterministic input: the rejection's
// code and field, or the event's type, and, for each run of inputs with
// the same outcome, a digest of the inputs, the messages and causes of the
// rejections and the events.
func TestDecodeOutcomes(t *testing.T) {
	got := outcomeRuns(decodeInputs(t))
	if *updateOutcomes {
		require.NoError(t, os.WriteFile(outcomesFile, []byte(strings.Join(got, "\n")+"\n"), 0o644))
		return
	}
	f, err := os.Open(outcomesFile)
	require.NoError(t, err)
	defer f.Close()
	var want []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		want = append(want, sc.Text())
	}
	bad := 0
	for i := 0; i < max(len(want), len(got)) && bad < 20; i++ {
		w, g := "(none)", "(none)"
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			bad++
			t.Errorf("outcomes %s\n\twant %s", g, w)
		}
	}
}

// outcomeRuns decodes every input every way and returns a line for each
// run of consecutive inputs with the same outcome: "from-to outcome
// digest".
func outcomeRuns(inputs []decodeInput) []string {
	var lines []string
	from, key := 0, ""
	h := sha256.New()
	flush := func(to int) {
		if key != "" {
			lines = append(lines, fmt.Sprintf("%05d-%05d %s %s", from, to, key, hex.EncodeToString(h.Sum(nil)[:4])))
		}
		h.Reset()
	}
	for i, m := range inputs {
		k, digest := inputOutcome(m)
		if k != key {
			flush(i - 1)
			from, key = i, k
		}
		fmt.Fprintf(h, "%s\n", digest)
	}
	flush(len(inputs) - 1)
	return lines
}

// inputOutcome decodes m every way and returns its outcome (one when every
// way agrees, else each way's) and a digest of the input and of what
// decoding it gave.
func inputOutcome(m decodeInput) (key, digest string) {
	var keys, digests []string
	add := func(way string, ev *Event, err error) {
		k, d := outcome(ev, err)
		keys, digests = append(keys, way+": "+k), append(digests, d)
	}
	for k, subj := range decodeSubjects {
		ev, err := DecodeMsg(m.subject, m.header, m.body, subj)
		add(fmt.Sprintf("msg%d", k), ev, err)
	}
	if len(m.header) == 0 {
		ev, err := DecodeJSON(m.body, Meta{})
		add("json", ev, err)
	}
	key = strings.Join(keys, "; ")
	if first := keys[0][strings.Index(keys[0], " ")+1:]; !slices.ContainsFunc(keys, func(k string) bool { return !strings.HasSuffix(k, ": "+first) }) {
		key = first
	}
	h := sha256.New()
	fmt.Fprintf(h, "%q\n", m.subject)
	for _, k := range slices.Sorted(maps.Keys(m.header)) {
		fmt.Fprintf(h, "%q: %q\n", k, m.header[k])
	}
	fmt.Fprintf(h, "%q\n%q", m.body, digests)
	return key, hex.EncodeToString(h.Sum(nil))
}

// outcome is a decoding's outcome: the rejection's code and field, or the
// event's type; and the message and cause of the rejection, or the event
// (its structured form, its body, its time's zone).
func outcome(ev *Event, err error) (key, detail string) {
	if err != nil {
		e := err.(*Error)
		return fmt.Sprintf("%s %q", e.Code, e.Field), fmt.Sprintf("%s\n%v", e.Message, e.Err)
	}
	line, merr := MarshalStructured(ev)
	body, berr := json.Marshal(ev.Body)
	name, offset := ev.Time.Zone()
	var extra any
	if r, ok := ev.Body.(*CompactionRequested); ok {
		extra = []any{r.CarriedPins == nil, r.CarriedPinsInvalid}
	}
	return "ok " + strings.TrimPrefix(ev.Type, TypePrefix), fmt.Sprintf("%s %v\n%s %v\n%q %d %v", line, merr, body, berr, name, offset, extra)
}
