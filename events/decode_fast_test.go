package events

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// DecodeMsg, DecodeMsgOwned and DecodeJSON try a fast path first and fall
// back on the general decoder (decodeMsgSlow, decodeJSONSlow). These tests
// hold every entry point to the general decoder's result on every input:
// the same event, field by field (deep equality: Data bytes, Body, Time with
// its location, Extensions, Meta), or the same *Error (code, field,
// message, cause).

// fastSlowSubjects are the deployments each input is decoded under.
var fastSlowSubjects = []Subjects{{}, {Prefix: DefaultPrefix, Partitions: 16}}

// checkFastSlow decodes one message every way and requires the same
// outcome. It reports whether the fast path decoded it.
func checkFastSlow(t testing.TB, subject string, header map[string][]string, body []byte, subjects Subjects) bool {
	t.Helper()
	want, werr := decodeMsgSlow(subject, header, body, subjects)

	// DecodeMsg on copies of the arguments, which are then scribbled over:
	// the event must not depend on them afterwards.
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

	fast := decodeMsgFast(subject, header, body, subjects, false)
	if fast != nil {
		require.NoError(t, werr, "the fast path decoded what the general decoder rejects: %q %q %q", subject, header, body)
	}
	return fast != nil
}

// checkFastSlowJSON does the same for DecodeJSON.
func checkFastSlowJSON(t testing.TB, line []byte) bool {
	t.Helper()
	meta := Meta{Subject: "x", Seq: 7, Headers: map[string][]string{"a": {"b"}}}
	want, werr := decodeJSONSlow(line, meta)
	b := slices.Clone(line)
	got, gerr := DecodeJSON(b, meta)
	clear(b)
	require.Equal(t, werr, gerr, "DecodeJSON error of %q", line)
	require.Equal(t, want, got, "DecodeJSON event of %q", line)
	return decodeJSONFast(line) != nil
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

// fastSlowMsg is one input of the differential tests.
type fastSlowMsg struct {
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

// fastSlowInputs are the deterministic inputs: the fuzz seeds, every type
// valid in both modes, and mutations of them.
func fastSlowInputs(t testing.TB) []fastSlowMsg {
	var in []fastSlowMsg
	add := func(subject string, h map[string][]string, body string) {
		in = append(in, fastSlowMsg{subject, h, []byte(body)})
	}
	for _, s := range fuzzSeeds(t) {
		add(testNATSSubject, nil, s)
		add(testNATSSubject, map[string][]string{"Content-Type": {ContentTypeCloudEventsJSON}}, s)
	}
	for _, typ := range slices.Sorted(maps.Keys(validData)) {
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
		// every attribute mutated, removed, doubled in another case,
		// percent-encoded, in both modes
		for _, attr := range []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "partitionkey", "traceparent", "dataschema"} {
			for _, v := range attrMutations {
				s := newSpec(typ, map[string]any{attr: v}, nil)
				add(testNATSSubject, nil, string(s.structured(t)))
				h, body, _ := s.binary()
				add(testNATSSubject, h, string(body))
				h = benchLikeHeader(typ)
				h["Ce-"+strings.ToUpper(attr[:1])+attr[1:]] = []string{v}
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
			h["CE-"+strings.ToUpper(attr)] = h["Ce-"+strings.ToUpper(attr[:1])+attr[1:]]
			add(testNATSSubject, h, validData[typ])
		}
	}
	// headers: escapes, repeats, odd names, content types, subjects
	hdrCases := []map[string][]string{
		{"Ce-Id": {"s1%2D0042"}}, {"Ce-Id": {"100%"}}, {"Ce-Id": {"%zz"}}, {"Ce-Id": {"a%ff"}}, {"Ce-Id": {"\xff"}},
		{"Ce-Id": {"a", "a"}}, {"Ce-Id": {"a", "b"}}, {"Ce-Id": {}}, {"Ce-Id": nil}, {"ce-id": {"s1-0042"}},
		{"ce-data": {"{}"}}, {"ce-data_base64": {"e30="}}, {"ce-": {"x"}}, {"ce-Foo_Bar": {"x"}}, {"ce-ß": {"x"}},
		{"Ce-\u0130d": {"x"}}, {"Ce-\u212aind": {"x"}}, {"Ce-Partitionkey": {"s1"}}, {"Ce-Partitionkey": {"s2"}},
		{"Ce-Partitionkey": {"s%31"}}, {"ce-partitionkey": {"s1"}, "Ce-PartitionKey": {"s1"}}, {"Ce-Traceparent": {"00-abc-01"}},
		{"Ce-Traceparent": {"a"}, "ce-traceparent": {"b"}}, {"Ce-Traceparent": {"a"}, "ce-traceparent": {"a"}}, {"Ce-Attempt": {"2"}}, {"Ce-Dataschema": {"urn:x"}}, {"Content-Type": {"text/plain"}}, {"Content-Type": nil},
		{"Content-Type": {"application/json", "application/json"}}, {"content-type": {"application/json"}},
		{"content-type": {"text/plain"}}, {"content-type": {"application/json; charset=utf-8"}},
		{"Content-Type": {"application/json; charset=\xff"}}, {"Content-Type": {"application/json; x=\"\n\""}},
		{"Content-Type": {"Application/CloudEvents+JSON"}}, {"Content-Type": {"application/json\xff"}},
		{"Content-Type": {" application/json ; x=1"}}, {"Ce-Datacontenttype": {"application/json"}, "Content-Type": {"text/plain"}},
		{"Ce-Specversion": nil}, {"Nats-Msg-Id": nil, "X": {"%zz"}}, {"Nats-Pin-Id": {"p"}}, {"ce-type": {TypeSessionClosed}},
	}
	for _, hc := range hdrCases {
		h := benchLikeHeader(TypeTurnAppended)
		for k, v := range hc {
			if v == nil && k != "Ce-Id" {
				delete(h, k)
				continue
			}
			h[k] = v
		}
		add(testNATSSubject, h, validData[TypeTurnAppended])
	}
	for _, subj := range []string{"seamguard.events.s1", "seamguard.events.s2", "seamguard.events.s1.x", "seamguard.events.", "seamguard.events",
		"seamguard.partitioned.3.s1", "seamguard.partitioned..s1", "seamguard.partitioned.x.s1", "seamguard.partitioned.3.s1.x",
		"seamguard.partitioned.3", "other.events.s1", "seamguardx.events.s1", ""} {
		add(subj, benchLikeHeader(TypeTurnAppended), validData[TypeTurnAppended])
		add(subj, nil, string(newSpec(TypeTurnAppended, nil, nil).structured(t)))
	}
	// structured mode with headers, odd bodies
	st := string(newSpec(TypeTurnAppended, map[string]any{"partitionkey": "s1", "attempt": json.RawMessage(`2`)}, nil).structured(t))
	for _, h := range []map[string][]string{
		{"Content-Type": {ContentTypeCloudEventsJSON}, "ce-id": {"ev-1"}},
		{"Content-Type": {ContentTypeCloudEventsJSON}, "ce-id": {"ev-2"}},
		{"Content-Type": {ContentTypeJSON}}, {"Nats-Msg-Id": {"x"}}, {"ce-time": {"2025-01-02T15:04:05Z"}},
	} {
		add(testNATSSubject, h, st)
	}
	for _, body := range []string{st, " " + st + "\n", strings.ReplaceAll(st, ",", " ,\n "), `{"specversion":"1.0","data_base64":null}`,
		strings.Replace(st, `"id":"ev-1"`, `"id":"ev-1","id":"ev-1"`, 1), strings.Replace(st, `"id"`, `"\u0069d"`, 1),
		strings.Replace(st, `"attempt":2`, `"attempt":null`, 1), strings.Replace(st, `"attempt":2`, `"attempt":"2"`, 1),
		strings.Replace(st, `"attempt":2`, `"attempt":[2]`, 1), strings.Replace(st, `"attempt":2`, `"Attempt":2`, 1),
		strings.Replace(st, `"attempt":2`, `"attempt":1.5e-3`, 1), strings.Replace(st, `"attempt":2`, `"dataschema":2`, 1),
		strings.Replace(st, `"attempt":2`, `"dataschema":"urn:x"`, 1), strings.Replace(st, `"attempt":2`, `"x":"\u00e9\n"`, 1),
		strings.Replace(st, `"attempt":2`, `"data_base64":"e30="`, 1), st + "x", st[:len(st)-1], "\xff" + st, "",
	} {
		add(testNATSSubject, nil, body)
	}
	return in
}

// TestDecodeFastSlow runs every deterministic input through every entry
// point, and checks that the usual shapes do take the fast path.
func TestDecodeFastSlow(t *testing.T) {
	inputs := fastSlowInputs(t)
	fast := 0
	for _, m := range inputs {
		for _, subj := range fastSlowSubjects {
			if checkFastSlow(t, m.subject, m.header, m.body, subj) {
				fast++
			}
		}
		if len(m.header) == 0 && checkFastSlowJSON(t, m.body) {
			fast++
		}
	}
	t.Logf("%d inputs, %d fast decodes", len(inputs), fast)
	require.Greater(t, fast, len(inputs)/10, "the fast path hardly ever decodes")
}

// TestDecodeFastPathTaken requires the fast path for the shapes agents send:
// every type in binary mode as the bench and the SDK write it, and in
// structured mode.
func TestDecodeFastPathTaken(t *testing.T) {
	for typ, data := range validData {
		for _, subj := range fastSlowSubjects {
			require.NotNil(t, decodeMsgFast(testNATSSubject, benchLikeHeader(typ), []byte(data), subj, false), "binary %s", typ)
			require.NotNil(t, decodeMsgFast("seamguard.partitioned.3.s1", benchLikeHeader(typ), []byte(data), subj, false), "partitioned binary %s", typ)
		}
		s := newSpec(typ, map[string]any{"partitionkey": "s1", "attempt": json.RawMessage(`2`)}, nil)
		require.NotNil(t, decodeMsgFast(testNATSSubject, nil, s.structured(t), Subjects{}, false), "structured %s", typ)
		require.NotNil(t, decodeJSONFast(s.structured(t)), "DecodeJSON %s", typ)
		h, body, ok := newSpec(typ, map[string]any{"partitionkey": "s1", "attempt": "2"}, nil).binary()
		require.True(t, ok)
		require.NotNil(t, decodeMsgFast(testNATSSubject, h, body, Subjects{}, false), "binary with extensions %s", typ)
	}
	for _, in := range sdkInputs {
		for _, structured := range []bool{false, true} {
			h, body := sdkWrite(t, sdkEvent(t, in.typ, "s1", in.data), structured)
			require.NotNil(t, decodeMsgFast(testNATSSubject, h, body, Subjects{}, false), "sdk %s structured=%v", in.typ, structured)
			checkFastSlow(t, testNATSSubject, h, body, Subjects{})
		}
	}
	for _, sz := range benchSizes {
		require.NotNil(t, decodeMsgFast(testNATSSubject, benchLikeHeader(TypeTurnAppended), benchTurn(sz.size), Subjects{}, false))
	}
}

// FuzzDecodeFastSlow holds the fast path to the general decoder on any
// input. Run it with, for example,
//
//	go test ./events -run XXX -fuzz FuzzDecodeFastSlow -fuzztime 2m -fuzzminimizetime 3s -parallel 1
//
// (with one worker, the default minimization of up to a minute per new
// input stops the fuzzing meanwhile).
func FuzzDecodeFastSlow(f *testing.F) {
	headerText := func(h map[string][]string) string {
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(h)) {
			for _, v := range h[k] {
				lines = append(lines, k+": "+v)
			}
		}
		return strings.Join(lines, "\n")
	}
	// TestDecodeFastSlow runs every input; a quarter of them seed the
	// fuzzer, so that plain go test does not run them all twice.
	for i, m := range fastSlowInputs(f) {
		if i%4 == 0 {
			f.Add(m.subject, headerText(m.header), m.body)
		}
	}
	f.Fuzz(func(t *testing.T, subject, header string, body []byte) {
		h := parseHeaderText(header)
		for _, subj := range fastSlowSubjects {
			checkFastSlow(t, subject, h, body, subj)
		}
		if h == nil {
			checkFastSlowJSON(t, body)
		}
	})
}
