package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"slices"
	"time"
)

// DefaultSource is the source of outputs when Encoder.Source is empty.
const DefaultSource = "urn:seamguard:processor"

// Errors of encoding. They are programming errors of the caller, not input
// rejections.
var (
	ErrUnknownOutputType = errors.New("events: unknown output type")
	ErrOutputData        = errors.New("events: output data does not match the output type")
	ErrNotEncodable      = errors.New("events: event cannot be encoded")
)

// OutputID is the deterministic CloudEvents id of the output of type
// outputType that answers the input c: "sg-" and 32 lower-case hex digits of
// a SHA-256 over the input's (source, id) and outputType, or, when the input
// had no id, over its NATS subject and stream sequence. The same input always
// gets the same id; different output types of one input get different ids.
func OutputID(c Cause, outputType string) string {
	h := sha256.New()
	if c.ID != "" {
		writeField(h, []byte("event"))
		writeField(h, []byte(c.Source))
		writeField(h, []byte(c.ID))
	} else {
		writeField(h, []byte("message"))
		writeField(h, []byte(c.Meta.Subject))
		writeField(h, binary.BigEndian.AppendUint64(nil, c.Meta.Seq))
	}
	writeField(h, []byte(outputType))
	sum := h.Sum(nil)
	return "sg-" + hex.EncodeToString(sum[:16])
}

// writeField writes b with its length, so that no two field lists hash alike.
func writeField(h hash.Hash, b []byte) {
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
	h.Write(b)
}

// Encoder writes outputs as structured CloudEvents. The zero value is ready:
// source DefaultSource, subjects under DefaultPrefix, and no time attribute
// (so that offline output is byte-for-byte deterministic). An Encoder is a
// plain value; Encode is safe for concurrent use if Now is.
type Encoder struct {
	Source   string           // the processor instance; empty means DefaultSource
	Subjects Subjects         // where verdicts go
	Now      func() time.Time // the time attribute; nil means none
}

// Encode returns the output's id (also its Nats-Msg-Id), the verdict subject
// to publish it on, and its body: one structured CloudEvent in JSON with a
// fixed member order. An output whose Session is empty or not a valid session
// id has no subject attribute and goes to the InvalidSession subject. o.Data
// must be the data type (value or pointer) of o.Type; nil slices are written
// as []. Encode does not modify o.
func (e Encoder) Encode(o Output) (id, subject string, body []byte, err error) {
	kind := o.Kind()
	if kind == "" {
		return "", "", nil, fmt.Errorf("%w: %q", ErrUnknownOutputType, o.Type)
	}
	data, err := outputData(o.Type, o.Data)
	if err != nil {
		return "", "", nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(data); err != nil {
		return "", "", nil, fmt.Errorf("events: encoding %s data: %w", o.Type, err)
	}
	raw := bytes.TrimRight(buf.Bytes(), "\n")

	session := o.Session
	if !ValidSessionID(session) {
		session = ""
	}
	source := e.Source
	if source == "" {
		source = DefaultSource
	}
	id = OutputID(o.Cause, o.Type)

	b := make([]byte, 0, 256+len(raw))
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendString(b, id)
	b = append(b, `,"source":`...)
	b = appendString(b, source)
	b = append(b, `,"type":`...)
	b = appendString(b, o.Type)
	if session != "" {
		b = append(b, `,"subject":`...)
		b = appendString(b, session)
	}
	if e.Now != nil {
		b = append(b, `,"time":`...)
		b = appendString(b, e.Now().UTC().Format(time.RFC3339Nano))
	}
	b = append(b, `,"datacontenttype":"application/json"`...)
	if c := o.Cause.ID; c != "" {
		b = append(b, `,"causationid":`...)
		b = appendString(b, c)
	} else if c := o.Cause.ReadID; c != "" {
		b = append(b, `,"causationid":`...)
		b = appendString(b, c)
	}
	b = append(b, `,"data":`...)
	b = append(b, raw...)
	b = append(b, '}')
	return id, e.Subjects.Verdict(session, kind), b, nil
}

// dataAs returns data as a T if it is a T or a non-nil *T.
func dataAs[T any](data any) (T, bool) {
	switch v := data.(type) {
	case T:
		return v, true
	case *T:
		if v != nil {
			return *v, true
		}
	}
	var zero T
	return zero, false
}

func nonNil[S ~[]E, E any](s S) S {
	if s == nil {
		return S{}
	}
	return s
}

// outputData checks that data fits the output type and returns a copy with
// nil slices replaced by empty ones.
func outputData(typ string, data any) (any, error) {
	mismatch := fmt.Errorf("%w: %s with data of type %T", ErrOutputData, typ, data)
	switch typ {
	case TypeCompactionAllowed:
		d, ok := dataAs[CompactionAllowed](data)
		if !ok {
			return nil, mismatch
		}
		d.SummaryCoverage = nonNil(d.SummaryCoverage)
		d.RecoveredBy = nonNil(d.RecoveredBy)
		d.Cured = nonNil(d.Cured)
		return d, nil
	case TypeCompactionRefused:
		d, ok := dataAs[CompactionRefused](data)
		if !ok {
			return nil, mismatch
		}
		reasons := make([]Reason, len(d.Reasons))
		for i, r := range d.Reasons {
			r.AtRisk = nonNil(r.AtRisk)
			reasons[i] = r
		}
		d.Reasons = reasons
		return d, nil
	case TypeTranscriptSpilled:
		d, ok := dataAs[SpillHandle](data)
		if !ok {
			return nil, mismatch
		}
		return d, nil
	case TypeSessionHalted:
		d, ok := dataAs[SessionHalted](data)
		if !ok {
			return nil, mismatch
		}
		d.Unrecoverable = nonNil(d.Unrecoverable)
		return d, nil
	case TypeEventRejected:
		d, ok := dataAs[EventRejected](data)
		if !ok {
			return nil, mismatch
		}
		h := make(map[string][]string, len(d.Input.Headers))
		for k, v := range d.Input.Headers {
			h[k] = nonNil(v)
		}
		d.Input.Headers = h
		return d, nil
	case TypeCompactionViolation:
		d, ok := dataAs[CompactionViolation](data)
		if !ok {
			return nil, mismatch
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownOutputType, typ)
}

// MarshalStructured writes an input event as one line of structured
// CloudEvents JSON (no newline in it, none at the end), as spills store it:
// the attributes, the extensions in name order and the data exactly as
// received (compacted). Meta and Body are not written, except that an event
// built by hand with a Body and no Data gets its Body as data. For a decoded
// event ev, DecodeJSON(MarshalStructured(ev)) equals ev but for Meta.
// MarshalStructured is safe for concurrent use.
func MarshalStructured(ev *Event) ([]byte, error) { return AppendStructured(nil, ev) }

// AppendStructured appends what MarshalStructured writes for ev to dst and
// returns the extended slice; on an error it returns nil, and dst's
// contents are as they were. A caller that encodes many events reuses one
// buffer.
func AppendStructured(dst []byte, ev *Event) ([]byte, error) {
	if ev == nil {
		return nil, fmt.Errorf("%w: nil event", ErrNotEncodable)
	}
	data := ev.Data
	if data == nil && ev.Body != nil {
		if _, closed := ev.Body.(*SessionClosed); !closed {
			raw, err := json.Marshal(ev.Body)
			if err != nil {
				return nil, fmt.Errorf("%w: body: %w", ErrNotEncodable, err)
			}
			data = raw
		}
	}
	if data != nil {
		// Decoded data is compact already: then it is written as it is,
		// not copied first.
		if valid, spaced := scanJSON(data); !valid || spaced {
			c, err := compact(data)
			if err != nil {
				return nil, fmt.Errorf("%w: data is not valid JSON: %w", ErrNotEncodable, err)
			}
			data = c
		}
	}

	size := 128 + len(ev.ID) + len(ev.Source) + len(ev.Type) + len(ev.Subject) + len(ev.DataContentType) + len(data)
	for name, val := range ev.Extensions {
		size += len(name) + len(val) + 4
	}
	b := slices.Grow(dst, size)
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendString(b, ev.ID)
	b = append(b, `,"source":`...)
	b = appendString(b, ev.Source)
	b = append(b, `,"type":`...)
	b = appendString(b, ev.Type)
	b = append(b, `,"subject":`...)
	b = appendString(b, ev.Subject)
	if !ev.Time.IsZero() {
		if y := ev.Time.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("%w: time %v is outside RFC 3339's years", ErrNotEncodable, ev.Time)
		}
		// RFC 3339 text of years 0 to 9999 has nothing to escape.
		b = append(b, `,"time":"`...)
		b = ev.Time.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	if ev.DataContentType != "" {
		b = append(b, `,"datacontenttype":`...)
		b = appendString(b, ev.DataContentType)
	}
	b, err := appendExtensions(b, ev.Extensions)
	if err != nil {
		return nil, err
	}
	if data != nil {
		b = append(b, `,"data":`...)
		b = append(b, data...)
	}
	return append(b, '}'), nil
}

// appendExtensions appends the extension attributes ext to b, in name
// order, as AppendStructured writes them; null ones are left out.
func appendExtensions(b []byte, ext map[string]json.RawMessage) ([]byte, error) {
	var buf [8]string
	names := buf[:0]
	for name := range ext {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !validAttrName(name) || isCoreAttr(name) || name == "data" {
			return nil, fmt.Errorf("%w: %q is not an extension attribute name", ErrNotEncodable, name)
		}
		val, err := compact(ext[name])
		if err != nil {
			return nil, fmt.Errorf("%w: extension %s: %w", ErrNotEncodable, name, err)
		}
		switch jsonKind(val) {
		case "null":
			continue
		case "an object", "an array":
			return nil, fmt.Errorf("%w: extension %s is %s", ErrNotEncodable, name, jsonKind(val))
		}
		b = append(b, ',')
		b = appendString(b, name)
		b = append(b, ':')
		b = append(b, val...)
	}
	return b, nil
}

// Verdict is an output event as a subscriber reads it back. The embedded
// Output has typed Data (a pointer to the output data type); its Cause.ID is
// the causationid, and Cause.Source and Cause.Meta are not on the wire.
type Verdict struct {
	ID     string
	Source string
	Time   time.Time // zero when the output had no time attribute
	Output
}

// DecodeVerdict decodes an output event written by Encode (or by any
// conforming writer of structured CloudEvents). Unknown data fields are
// ignored. Failures are *Error values. It is safe for concurrent use.
func DecodeVerdict(body []byte) (*Verdict, error) {
	v, err := decodeVerdict(body)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// decodeVerdict is DecodeVerdict with its *Error.
func decodeVerdict(body []byte) (*Verdict, *Error) {
	var env envelope
	if err := env.readStructured(body, false); err != nil {
		return nil, err
	}
	for k := attrSpecversion; k <= attrType; k++ {
		if err := env.checkPresent(&attrTable[k], "the value the encoder wrote"); err != nil {
			return nil, err
		}
	}
	v := &Verdict{ID: env.attr[attrID], Source: env.attr[attrSource]}
	if v.Type = env.attr[attrType]; v.Kind() == "" {
		return nil, Errorf(CodeUnknownType, "type", "the type %s is not a seamguard output type", jsonQuote(Excerpt(v.Type)))
	}
	if env.has(attrSubject) {
		if !env.isString(attrSubject) {
			return nil, Errorf(CodeMalformed, "subject", "subject is %s; it must be a string", jsonKind(env.raw[attrSubject]))
		}
		v.Session = env.attr[attrSubject]
	}
	if raw, ok := env.ext["causationid"]; ok {
		s, isStr := asString(raw)
		if !isStr {
			return nil, Errorf(CodeMalformed, "causationid", "causationid is %s; it must be a string", jsonKind(raw))
		}
		v.Cause.ID = s
	}
	t, err := env.readTime()
	if err != nil {
		return nil, err
	}
	v.Time = t
	if _, err := env.readContentType(); err != nil {
		return nil, err
	}
	if err := decodeVerdictData(v, env.data); err != nil {
		return nil, err
	}
	return v, nil
}

// decodeVerdictData decodes data, the data of the verdict v, into v.Data.
func decodeVerdictData(v *Verdict, data []byte) *Error {
	if data == nil {
		return Errorf(CodeMissingAttribute, "data", "the output has no data")
	}
	if jsonKind(data) != "an object" {
		return Errorf(CodeBadData, "data", "data is %s; output data is a JSON object", jsonKind(data))
	}
	var target any
	switch v.Type {
	case TypeCompactionAllowed:
		target = &CompactionAllowed{}
	case TypeCompactionRefused:
		target = &CompactionRefused{}
	case TypeTranscriptSpilled:
		target = &SpillHandle{}
	case TypeSessionHalted:
		target = &SessionHalted{}
	case TypeEventRejected:
		target = &EventRejected{}
	case TypeCompactionViolation:
		target = &CompactionViolation{}
	}
	if err := json.Unmarshal(data, target); err != nil {
		return &Error{Code: CodeBadData, Field: "data", Err: err,
			Message: fmt.Sprintf("the %s data does not fit its type: %v", v.Type, err)}
	}
	v.Data = target
	return nil
}
