package events

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

// checkOutcome holds decoding to its promises: an error is an *Error with a
// known code, and a decoded event survives MarshalStructured + DecodeJSON.
func checkOutcome(t testing.TB, ev *Event, err error) {
	t.Helper()
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error %v is a %T, not an *Error", err, err)
		}
		if !knownCodes[e.Code] || e.Message == "" {
			t.Fatalf("error %#v has an unknown code or no message", e)
		}
		if ev != nil {
			t.Fatalf("an event and an error")
		}
		return
	}
	if ev == nil || ev.Body == nil {
		t.Fatalf("no error and no event")
	}
	requireRoundTrip(t, ev)
}

func fuzzSeeds(tb testing.TB) []string {
	var seeds []string
	for _, typ := range slices.Sorted(maps.Keys(validData)) {
		s := newSpec(typ, map[string]any{"partitionkey": "s1"}, nil)
		seeds = append(seeds, string(s.structured(tb)))
	}
	return append(seeds,
		`{"specversion":"1.0","id":"e","source":"s","type":"io.seamguard.session.closed","subject":"s1"}`,
		`{"specversion":"1.0","id":"e","source":"s","type":"io.seamguard.turn.appended","subject":"s1","time":"2025-01-02T15:04:05.5-07:00","x":1.5e3,"data":{"offset":1,"size":2,"content":[[[{"a":"\u2028<"}]]]}}`,
		`{"specversion":"1.0","id":"e","source":"s","type":"io.seamguard.context.truncated","subject":"s1","data":{"range":{"start":9007199254740991,"end":9007199254740992}}}`,
		`{"specversion":"1.0","data_base64":"e30="}`,
		`[`+strings.Repeat("[", 100)+`]`,
		``,
	)
}

func FuzzDecodeJSON(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := DecodeJSON(line, Meta{Seq: 1})
		checkOutcome(t, ev, err)
	})
}

// parseHeaderText turns "name: value" lines into a header map.
func parseHeaderText(text string) map[string][]string {
	if text == "" {
		return nil
	}
	h := map[string][]string{}
	for _, line := range strings.Split(text, "\n") {
		name, value, _ := strings.Cut(line, ":")
		h[name] = append(h[name], strings.TrimPrefix(value, " "))
	}
	return h
}

func FuzzDecodeMsg(f *testing.F) {
	binHdr := "ce-specversion: 1.0\nce-id: ev-1\nce-source: urn:agent:a\nce-type: " + TypeTurnAppended + "\nce-subject: s1"
	f.Add(testNATSSubject, binHdr, []byte(validData[TypeTurnAppended]))
	f.Add(testNATSSubject, binHdr+"\nce-time: 2025-01-02T15:04:05Z\nce-partitionkey: s%31", []byte(validData[TypeTurnAppended]))
	f.Add(testNATSSubject, binHdr+"\nCe-Id: ev-2", []byte(validData[TypeTurnAppended]))
	f.Add(testNATSSubject, binHdr+"\nce-traceparent: 100%", []byte(validData[TypeTurnAppended]))
	f.Add(testNATSSubject, "ce-specversion: 1.0\nce-id: e\nce-source: s\nce-type: "+TypeSessionClosed+"\nce-subject: s1\ncontent-type: application/json", []byte{})
	f.Add("seamguard.events.s1.x", "", []byte(fuzzSeeds(f)[0]))
	for _, s := range fuzzSeeds(f) {
		f.Add(testNATSSubject, "", []byte(s))
		f.Add(testNATSSubject, "Content-Type: application/cloudevents+json\nce-specversion: 1.0\nce-id: ev-1", []byte(s))
	}
	f.Fuzz(func(t *testing.T, subject, headerText string, body []byte) {
		ev, err := DecodeMsg(subject, parseHeaderText(headerText), body, Subjects{})
		checkOutcome(t, ev, err)
		if err == nil {
			if ev.Meta.Subject != subject {
				t.Fatalf("Meta.Subject %q, want %q", ev.Meta.Subject, subject)
			}
			if tok, err := (Subjects{}).SessionOf(subject); err != nil || tok != ev.Subject {
				t.Fatalf("accepted event of session %q on subject %q", ev.Subject, subject)
			}
		}
	})
}

// FuzzDecodeEntryPoints holds DecodeMsg, DecodeMsgOwned (under each
// deployment) and DecodeJSON to their promises on any input (checkDecode,
// checkDecodeJSON). Run it with, for example,
//
//	go test ./events -run XXX -fuzz FuzzDecodeEntryPoints -fuzztime 2m -fuzzminimizetime 3s -parallel 1
//
// (with one worker, the default minimization of up to a minute per new
// input stops the fuzzing meanwhile).
func FuzzDecodeEntryPoints(f *testing.F) {
	headerText := func(h map[string][]string) string {
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(h)) {
			for _, v := range h[k] {
				lines = append(lines, k+": "+v)
			}
		}
		return strings.Join(lines, "\n")
	}
	// TestDecodeEntryPoints runs every input; a quarter of them seed the
	// fuzzer, so that plain go test does not run them all twice.
	for i, m := range decodeInputs(f) {
		if i%4 == 0 {
			f.Add(m.subject, headerText(m.header), m.body)
		}
	}
	f.Fuzz(func(t *testing.T, subject, header string, body []byte) {
		h := parseHeaderText(header)
		for _, subj := range decodeSubjects {
			checkDecode(t, subject, h, body, subj)
		}
		if h == nil {
			checkDecodeJSON(t, body)
		}
	})
}
