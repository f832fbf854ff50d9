package events

import (
	"strings"
	"testing"
)

// The benchmarks decode what agents publish: binary-mode events with the
// headers the SDKs and the bench write, a turn with 1 KiB and 8 KiB of
// content, and every other input type. bytes/op against the input size is
// the allocation factor.

var benchSubjects = Subjects{Prefix: DefaultPrefix, Partitions: 16}

// benchTurn is the body of a turn with about size bytes of plain content.
func benchTurn(size int) []byte {
	return []byte(`{"offset":41,"size":1,"role":"user","tokens":256,"content":"` + strings.Repeat("lorem ipsum ", size/12) + `"}`)
}

// benchHeader is the header of a binary-mode event of type typ.
func benchHeader(typ string) map[string][]string {
	return map[string][]string{
		"Ce-Specversion": {"1.0"}, "Ce-Id": {"s1-0042"}, "Ce-Source": {"urn:agent:bench"},
		"Ce-Type": {typ}, "Ce-Subject": {"s1"}, "Ce-Time": {"2026-11-29T12:00:00.042Z"},
		"Content-Type": {ContentTypeJSON}, "Nats-Msg-Id": {"s1-0042"},
	}
}

// benchOthers are the bodies of the other input types, as agents send them.
var benchOthers = []struct{ name, typ, body string }{
	{"opened", TypeSessionOpened, `{"unit":"turns","recovery_floor":{"span":32,"unit":"turns"},"window":200000,"trigger":150000}`},
	{"truncated", TypeContextTruncated, `{"range":{"start":0,"end":8},"stage":"budget"}`},
	{"requested", TypeCompactionRequested, `{"request_id":"r-17","summarizer_input":{"start":8,"end":40},"summary_range":{"start":0,"end":40},"tail_start":40,"carries_prior_summary":true,"occupancy":190000,"threshold":150000}`},
	{"committed", TypeCompactionCommitted, `{"request_id":"r-17"}`},
	{"resumed", TypeSessionResumed, `{"note":"operator accepts the loss of turns 0-8"}`},
	{"closed", TypeSessionClosed, ``},
}

var benchSizes = []struct {
	name string
	size int
}{{"1KiB", 1 << 10}, {"8KiB", 8 << 10}}

// BenchmarkDecodeMsg decodes a binary-mode turn, as the processor does.
func BenchmarkDecodeMsg(b *testing.B) { benchDecodeTurns(b, DecodeMsg) }

// BenchmarkDecodeMsgOwned decodes a binary-mode turn as the processor
// does: it hands the header over, so that it is not copied.
func BenchmarkDecodeMsgOwned(b *testing.B) { benchDecodeTurns(b, DecodeMsgOwned) }

// benchDecodeTurns runs decode on a binary-mode turn of each size.
func benchDecodeTurns(b *testing.B, decode func(string, map[string][]string, []byte, Subjects) (*Event, error)) {
	subject := benchSubjects.Events("s1")
	for _, sz := range benchSizes {
		body, hdr := benchTurn(sz.size), benchHeader(TypeTurnAppended)
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decode(subject, hdr, body, benchSubjects); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeMsgTypes decodes a binary-mode event of every other type.
func BenchmarkDecodeMsgTypes(b *testing.B) {
	subject := benchSubjects.Events("s1")
	for _, o := range benchOthers {
		body, hdr := []byte(o.body), benchHeader(o.typ)
		b.Run(o.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeMsg(subject, hdr, body, benchSubjects); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeMsgStructured decodes a structured-mode turn as sdk-go's
// nats_jetstream binding sends it: no headers but the message id.
func BenchmarkDecodeMsgStructured(b *testing.B) {
	subject := benchSubjects.Events("s1")
	for _, sz := range benchSizes {
		ev, err := DecodeMsg(subject, benchHeader(TypeTurnAppended), benchTurn(sz.size), benchSubjects)
		if err != nil {
			b.Fatal(err)
		}
		body, err := MarshalStructured(ev)
		if err != nil {
			b.Fatal(err)
		}
		hdr := map[string][]string{"Nats-Msg-Id": {"s1-0042"}}
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeMsg(subject, hdr, body, benchSubjects); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMarshalStructured writes a decoded binary-mode turn as a spill
// line.
func BenchmarkMarshalStructured(b *testing.B) {
	subject := benchSubjects.Events("s1")
	for _, sz := range benchSizes {
		ev, err := DecodeMsg(subject, benchHeader(TypeTurnAppended), benchTurn(sz.size), benchSubjects)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(ev.Data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := MarshalStructured(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchRejected are inputs agents get wrong, in both modes: each is
// rejected, with the code the bench checks.
var benchRejected = []struct {
	name   string
	typ    string
	set    map[string][]string // binary mode: headers replaced
	body   string              // binary mode: the data; structured: the event
	binary bool
	code   Code
}{
	{"unknown_type", "io.seamguard.turn.deleted", nil, `{"offset":41,"size":1}`, true, CodeUnknownType},
	{"bad_data", TypeTurnAppended, nil, `{"offset":41,"size":"1","role":"user"}`, true, CodeBadData},
	{"not_json", TypeTurnAppended, nil, `{"offset":41,"size":1`, true, CodeBadData},
	{"bad_escape", TypeTurnAppended, map[string][]string{"Ce-Source": {"urn:%zz"}}, `{"offset":41,"size":1}`, true, CodeMalformed},
	{"mismatch", TypeTurnAppended, map[string][]string{"Ce-Subject": {"s2"}}, `{"offset":41,"size":1}`, true, CodeSubjectMismatch},
	{"structured_no_id", "", nil, `{"specversion":"1.0","source":"urn:agent:bench","type":"io.seamguard.turn.appended","subject":"s1","data":{"offset":41,"size":1}}`, false, CodeMissingAttribute},
	{"structured_bad_time", "", nil, `{"specversion":"1.0","id":"s1-0042","source":"urn:agent:bench","type":"io.seamguard.turn.appended","subject":"s1","time":"yesterday","data":{"offset":41,"size":1}}`, false, CodeMalformed},
}

// BenchmarkDecodeMsgRejected decodes inputs that are rejected.
func BenchmarkDecodeMsgRejected(b *testing.B) {
	subject := benchSubjects.Events("s1")
	for _, r := range benchRejected {
		var hdr map[string][]string
		if r.binary {
			hdr = benchHeader(r.typ)
			for k, v := range r.set {
				hdr[k] = v
			}
		}
		body := []byte(r.body)
		b.Run(r.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, err := DecodeMsg(subject, hdr, body, benchSubjects)
				if e, ok := err.(*Error); !ok || e.Code != r.code {
					b.Fatal(err)
				}
			}
		})
	}
}
