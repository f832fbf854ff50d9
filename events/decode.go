package events

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// ContentTypeCloudEventsJSON is the media type of a structured-mode event.
const ContentTypeCloudEventsJSON = "application/cloudevents+json"

// ContentTypeJSON is the only data content type seamguard accepts.
const ContentTypeJSON = "application/json"

// coreAttrs are the CloudEvents attributes with a field of their own in Event.
// Every other attribute (dataschema included) is kept in Event.Extensions.
var coreAttrs = map[string]bool{
	"specversion": true, "id": true, "source": true, "type": true,
	"subject": true, "time": true, "datacontenttype": true,
}

// inputTypes are the event types an agent may publish.
var inputTypes = map[string]bool{
	TypeSessionOpened: true, TypeTurnAppended: true, TypeContextTruncated: true,
	TypeContextPinned: true, TypeContextUnpinned: true,
	TypeCompactionRequested: true, TypeCompactionCommitted: true,
	TypeSessionResumed: true, TypeSessionClosed: true,
}

// DecodeMsg decodes and validates one input message as it arrived from NATS:
// its subject, headers (nats.Header is a map[string][]string) and body.
// Either CloudEvents content mode is accepted (see the package doc). The
// event's subject attribute must equal the session token of the NATS subject.
//
// On success the returned event's Meta holds the NATS subject and a copy of
// the headers; the caller sets Meta.Seq. Every failure is an *Error carrying
// the rejection code and the offending field. DecodeMsg does not retain its
// arguments and is safe for concurrent use.
//
// Well-formed events of the usual shapes take a fast path (decode_fast.go);
// everything else, and every failure, takes the general decoder. Both give
// the same result for every input.
func DecodeMsg(subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, error) {
	if ev := decodeMsgFast(subject, header, body, subjects, false); ev != nil {
		ev.Meta = Meta{Subject: subject, Headers: copyHeaderPacked(header), Control: subjects.IsControl(subject)}
		return ev, nil
	}
	return decodeMsgSlow(subject, header, body, subjects)
}

// DecodeMsgOwned is DecodeMsg for a caller that hands header and body over,
// such as the consumer of a NATS delivery, whose header and data are its
// own: the event's Meta.Headers is header itself (nil when header is
// empty), and its Data may be body itself or a part of it, not copies. The
// caller must change neither afterwards; the result is otherwise the same
// as DecodeMsg's.
func DecodeMsgOwned(subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, error) {
	if ev := decodeMsgFast(subject, header, body, subjects, true); ev != nil {
		if len(header) == 0 {
			header = nil
		}
		ev.Meta = Meta{Subject: subject, Headers: header, Control: subjects.IsControl(subject)}
		return ev, nil
	}
	return decodeMsgSlow(subject, header, body, subjects)
}

// decodeMsgSlow is the general decoder: every input, every error.
func decodeMsgSlow(subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, error) {
	ev, err := decodeMsg(subject, header, body, subjects)
	if err != nil {
		return nil, err
	}
	return ev, nil
}

func decodeMsg(subject string, header map[string][]string, body []byte, subjects Subjects) (*Event, *Error) {
	hdr, err := readHeaders(header)
	if err != nil {
		return nil, err
	}
	_, binary := hdr.ce["specversion"]
	if hdr.hasCT && mediaType(hdr.contentType) == ContentTypeCloudEventsJSON {
		binary = false
	}
	var env *envelope
	if binary {
		env, err = binaryEnvelope(hdr, body)
	} else {
		env, err = structuredEnvelope(body)
		if err == nil {
			err = headersAgree(hdr.ce, env.attrs)
		}
	}
	if err != nil {
		return nil, err
	}
	onSubject := func(session string) *Error {
		tok, err := subjects.sessionOf(subject)
		if err != nil {
			return err
		}
		if tok != session {
			on, want := subjects.Events(tok), subjects.Events(session)
			if subjects.IsControl(subject) {
				on, want = subjects.Control(tok), subjects.Control(session)
			}
			return Errorf(CodeSubjectMismatch, "subject",
				"the event's subject is %q but it was published on %q, the subject of session %q; publish each event on %s",
				session, on, tok, want)
		}
		return nil
	}
	ev, err := env.validate(onSubject)
	if err != nil {
		return nil, err
	}
	ev.Meta = Meta{Subject: subject, Headers: copyHeader(header), Control: subjects.IsControl(subject)}
	return ev, nil
}

// DecodeJSON decodes and validates one structured-mode event, such as a line
// of a spill or of an offline input file. meta is stored in the event as is.
// There is no NATS subject to check, but the subject attribute must still be
// a valid session id. Every failure is an *Error. DecodeJSON does not retain
// line and is safe for concurrent use.
func DecodeJSON(line []byte, meta Meta) (*Event, error) {
	if ev := decodeJSONFast(line); ev != nil {
		ev.Meta = meta
		return ev, nil
	}
	return decodeJSONSlow(line, meta)
}

// decodeJSONSlow is DecodeJSON's general decoder.
func decodeJSONSlow(line []byte, meta Meta) (*Event, error) {
	env, err := structuredEnvelope(line)
	if err != nil {
		return nil, err
	}
	ev, err := env.validate(nil)
	if err != nil {
		return nil, err
	}
	ev.Meta = meta
	return ev, nil
}

// envelope is an event's attributes, whatever mode they came in, before
// validation. Attribute values are raw JSON; binary-mode values are JSON
// strings. A JSON null attribute counts as absent and is not in attrs.
type envelope struct {
	attrs map[string]json.RawMessage
	data  json.RawMessage // compacted; nil when the event has no data
}

// headers are the parts of a NATS header that matter to decoding.
type headers struct {
	ce          map[string]string // ce-<name> headers by lower-case name, percent-decoded
	contentType string
	hasCT       bool
}

func readHeaders(h map[string][]string) (headers, *Error) {
	out := headers{ce: map[string]string{}}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys) // so that the same input always gets the same error
	for _, k := range keys {
		lk := strings.ToLower(k)
		if lk == "content-type" {
			for _, v := range h[k] {
				if out.hasCT && v != out.contentType {
					return out, Errorf(CodeMalformed, "",
						"the Content-Type header is given twice with different values (%q and %q); send it once", Excerpt(out.contentType), Excerpt(v))
				}
				out.contentType, out.hasCT = v, true
			}
			continue
		}
		name, ok := strings.CutPrefix(lk, "ce-")
		if !ok {
			continue
		}
		if name == "data" || name == "data_base64" {
			return out, Errorf(CodeMalformed, "data",
				"the header %q is not allowed: in binary mode the data is the message body, in structured mode it is the body's \"data\" member", Excerpt(k))
		}
		if !validAttrName(name) {
			return out, Errorf(CodeMalformed, Excerpt(name),
				"the header %q does not name a CloudEvents attribute: attribute names are lower-case letters and digits only", Excerpt(k))
		}
		for _, v := range h[k] {
			dv, problem := percentDecode(v)
			if problem != "" {
				return out, Errorf(CodeMalformed, Excerpt(name),
					"the value of header %q %s; percent-encode it (a literal %% is %%25) or send the value as plain UTF-8 text", Excerpt(k), problem)
			}
			if prev, seen := out.ce[name]; seen && prev != dv {
				return out, Errorf(CodeMalformed, Excerpt(name),
					"the attribute %s is given twice in the headers with different values (%q and %q); send each ce- header once", Excerpt(name), Excerpt(prev), Excerpt(dv))
			}
			out.ce[name] = dv
		}
	}
	return out, nil
}

// percentDecode decodes %XX escapes in a header value. It says what is wrong
// when an escape is incomplete or the result is not UTF-8.
func percentDecode(s string) (string, string) {
	if strings.IndexByte(s, '%') < 0 {
		if !utf8.ValidString(s) {
			return "", "is not valid UTF-8"
		}
		return s, ""
	}
	buf := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			buf = append(buf, c)
			continue
		}
		if i+2 >= len(s) {
			return "", "ends in an incomplete percent-escape"
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", "holds " + jsonQuote(s[i:i+3]) + ", which is not a percent-escape (% and two hex digits)"
		}
		buf = append(buf, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(buf) {
		return "", "does not decode to valid UTF-8"
	}
	return string(buf), ""
}

func jsonQuote(s string) string {
	return string(appendString(nil, s))
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// validAttrName reports whether name is a CloudEvents 1.0 attribute name:
// lower-case ASCII letters and digits.
func validAttrName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// mediaType returns the lower-case media type of a content type, without
// parameters.
func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(strings.TrimSpace(ct))
}

func copyHeader(h map[string][]string) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, v := range h {
		out[k] = slices.Clone(v)
	}
	return out
}

func binaryEnvelope(hdr headers, body []byte) (*envelope, *Error) {
	env := &envelope{attrs: make(map[string]json.RawMessage, len(hdr.ce)+1)}
	for name, v := range hdr.ce {
		env.attrs[name] = jsonString(v)
	}
	if _, ok := hdr.ce["datacontenttype"]; !ok && hdr.hasCT {
		env.attrs["datacontenttype"] = jsonString(hdr.contentType)
	}
	if len(body) == 0 {
		return env, nil
	}
	if !utf8.Valid(body) {
		return nil, Errorf(CodeBadData, "data", "the message body is not valid UTF-8; send the data as a UTF-8 JSON object")
	}
	data, err := compact(body)
	if err != nil {
		return nil, &Error{Code: CodeBadData, Field: "data", Err: err,
			Message: "the message body is not valid JSON (" + Excerpt(err.Error()) + "); in binary mode the body is the event's data, a JSON object"}
	}
	env.data = data
	return env, nil
}

func structuredEnvelope(body []byte) (*envelope, *Error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, Errorf(CodeMalformed, "",
			"the message is empty; send a structured CloudEvent (a JSON object) or a binary-mode event with ce-* headers")
	}
	if !utf8.Valid(body) {
		return nil, Errorf(CodeMalformed, "", "the message body is not valid UTF-8; a structured CloudEvent is UTF-8 JSON")
	}
	members, dup, err := parseObject(body)
	if err != nil {
		return nil, &Error{Code: CodeMalformed, Err: err,
			Message: "the message body is not a JSON object (" + Excerpt(err.Error()) + "); send one CloudEvent as a JSON object, or binary mode with a ce-specversion header"}
	}
	if dup != "" {
		return nil, Errorf(CodeMalformed, Excerpt(dup), "the member %q appears twice in the event; send each attribute once", Excerpt(dup))
	}
	env := &envelope{attrs: make(map[string]json.RawMessage, len(members))}
	for _, m := range members {
		switch {
		case m.name == "data":
			data, err := compact(m.val)
			if err != nil { // cannot happen: parseObject checked the syntax
				return nil, &Error{Code: CodeMalformed, Field: "data", Err: err, Message: "data is not valid JSON"}
			}
			env.data = data
			continue
		case m.name == "data_base64":
			if isNull(m.val) {
				continue
			}
			return nil, Errorf(CodeBadData, "data",
				"the event carries data_base64; seamguard's data is a JSON object: send it as \"data\" with datacontenttype application/json")
		case !validAttrName(m.name):
			return nil, Errorf(CodeMalformed, Excerpt(m.name),
				"the member %q is not a CloudEvents attribute name; attribute names are lower-case letters and digits only", Excerpt(m.name))
		case isNull(m.val):
			continue // a null attribute is an absent one
		}
		val, err := compact(m.val)
		if err != nil {
			return nil, &Error{Code: CodeMalformed, Field: Excerpt(m.name), Err: err, Message: Excerpt(m.name) + " is not valid JSON"}
		}
		if !coreAttrs[m.name] {
			switch jsonKind(val) {
			case "an object", "an array":
				return nil, Errorf(CodeMalformed, Excerpt(m.name),
					"the extension attribute %s is %s; extension values are strings, numbers or booleans", Excerpt(m.name), jsonKind(val))
			case "a string":
				s, _ := asString(val)
				val = jsonString(s) // one spelling for one value, whatever the escapes
			}
			if m.name == "dataschema" && jsonKind(val) != "a string" {
				return nil, Errorf(CodeMalformed, m.name, "dataschema is %s; it must be a URI string", jsonKind(val))
			}
		}
		env.attrs[m.name] = val
	}
	return env, nil
}

// headersAgree checks the ce-* headers of a structured-mode message against
// the attributes in its body.
func headersAgree(ce map[string]string, attrs map[string]json.RawMessage) *Error {
	names := make([]string, 0, len(ce))
	for name := range ce {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		hv := ce[name]
		raw, ok := attrs[name]
		if !ok {
			return Errorf(CodeMalformed, Excerpt(name),
				"the header ce-%s is %q but the structured event in the body has no %s; in structured mode the body is the whole event: drop the header or add the attribute to the body",
				Excerpt(name), Excerpt(hv), Excerpt(name))
		}
		if attrEqual(name, raw, hv) {
			continue
		}
		return Errorf(CodeMalformed, Excerpt(name),
			"the header ce-%s (%q) contradicts the %s in the structured event (%s); drop the header or make them agree",
			Excerpt(name), Excerpt(hv), Excerpt(name), abbreviate(string(raw)))
	}
	return nil
}

func attrEqual(name string, raw json.RawMessage, hv string) bool {
	s, isStr := asString(raw)
	if !isStr {
		return string(raw) == hv // numbers and booleans, by their JSON spelling
	}
	if s == hv {
		return true
	}
	if name == "time" {
		t1, ok1 := parseTime(s)
		t2, ok2 := parseTime(hv)
		return ok1 && ok2 && t1.Equal(t2)
	}
	return false
}

// validate checks the envelope against the contract and decodes the data.
// onSubject, when not nil, checks the session against the NATS subject.
func (env *envelope) validate(onSubject func(session string) *Error) (*Event, *Error) {
	a := env.attrs
	if err := checkSpecversion(a); err != nil {
		return nil, err
	}
	ev := &Event{}
	for _, f := range []struct {
		name string
		dst  *string
		hint string
	}{
		{"id", &ev.ID, "a unique id per event, also sent as Nats-Msg-Id"},
		{"source", &ev.Source, "a URI-reference naming the agent"},
		{"type", &ev.Type, "one of the io.seamguard.* input types"},
		{"subject", &ev.Subject, "the session id"},
	} {
		s, err := requiredString(a, f.name, f.hint)
		if err != nil {
			return nil, err
		}
		*f.dst = s
	}
	if err := checkBounds(ev, a); err != nil {
		return nil, err
	}
	if !ValidSessionID(ev.Subject) {
		return nil, Errorf(CodeBadSessionID, "subject",
			"the subject %s is not a valid session id; use 1 to 128 of the characters A-Z, a-z, 0-9, '_' and '-'", jsonQuote(abbreviate(ev.Subject)))
	}
	if onSubject != nil {
		if err := onSubject(ev.Subject); err != nil {
			return nil, err
		}
	}
	if raw, ok := a["partitionkey"]; ok {
		s, isStr := asString(raw)
		if !isStr {
			return nil, Errorf(CodeMalformed, "partitionkey", "partitionkey is %s; when present it must be the session id as a string", jsonKind(raw))
		}
		if s != ev.Subject {
			return nil, Errorf(CodeSubjectMismatch, "partitionkey",
				"partitionkey is %s but the session is %q; set partitionkey to the session id or leave it out", jsonQuote(abbreviate(s)), ev.Subject)
		}
	}
	t, err := optionalTime(a)
	if err != nil {
		return nil, err
	}
	ev.Time = t
	ct, err := optionalContentType(a)
	if err != nil {
		return nil, err
	}
	ev.DataContentType = ct
	if !inputTypes[ev.Type] {
		return nil, Errorf(CodeUnknownType, "type",
			"the type %s is not a seamguard input type; use one of %s", jsonQuote(abbreviate(ev.Type)), strings.Join(sortedInputTypes(), ", "))
	}
	for name, raw := range a {
		if coreAttrs[name] {
			continue
		}
		if ev.Extensions == nil {
			ev.Extensions = make(map[string]json.RawMessage)
		}
		ev.Extensions[name] = raw
	}
	body, err := decodeData(ev.Type, env.data)
	if err != nil {
		return nil, err
	}
	ev.Data, ev.Body = env.data, body
	return ev, nil
}

// checkBounds rejects an id, a source or an extension value longer than
// MaxIDBytes (too_large), naming the first such attribute: id, source, then
// the extensions in name order.
func checkBounds(ev *Event, a map[string]json.RawMessage) *Error {
	if len(ev.ID) > MaxIDBytes {
		return tooLarge("id", len(ev.ID), MaxIDBytes, "use an id of at most 256 bytes, such as a UUID or a ULID")
	}
	if len(ev.Source) > MaxIDBytes {
		return tooLarge("source", len(ev.Source), MaxIDBytes, "use a source URI of at most 256 bytes that names the agent")
	}
	var names []string
	for name, raw := range a {
		if !coreAttrs[name] && extLen(raw) > MaxIDBytes {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	name := slices.Min(names)
	return tooLarge(name, extLen(a[name]), MaxIDBytes,
		"send extension values of at most 256 bytes and put anything larger in the data")
}

// extLen is the size of an extension value: a string's bytes, or the JSON
// spelling of a number or a boolean.
func extLen(raw json.RawMessage) int {
	if s, ok := asString(raw); ok {
		return len(s)
	}
	return len(raw)
}

// tooLarge is the too_large rejection of a field of n bytes, above bound.
func tooLarge(field string, n, bound int, what string) *Error {
	return Errorf(CodeTooLarge, Excerpt(field), "%s is %d bytes, more than the %d allowed; %s", Excerpt(field), n, bound, what)
}

func sortedInputTypes() []string {
	out := make([]string, 0, len(inputTypes))
	for t := range inputTypes {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func checkSpecversion(a map[string]json.RawMessage) *Error {
	raw, ok := a["specversion"]
	if !ok {
		return Errorf(CodeMissingAttribute, "specversion",
			"the event has no specversion; seamguard reads CloudEvents 1.0: set specversion to \"1.0\"")
	}
	if s, isStr := asString(raw); !isStr || s != "1.0" {
		return Errorf(CodeBadSpecversion, "specversion",
			"specversion is %s; seamguard reads CloudEvents 1.0 only: set specversion to \"1.0\"", abbreviate(string(raw)))
	}
	return nil
}

// requiredString returns a required attribute that must be a non-empty string.
func requiredString(a map[string]json.RawMessage, name, hint string) (string, *Error) {
	raw, ok := a[name]
	if !ok {
		return "", Errorf(CodeMissingAttribute, name, "the event has no %s; set it to %s", name, hint)
	}
	s, isStr := asString(raw)
	if !isStr {
		return "", Errorf(CodeMalformed, name, "%s is %s; it must be a string: %s", name, jsonKind(raw), hint)
	}
	if s == "" {
		return "", Errorf(CodeMissingAttribute, name, "%s is empty; set it to %s", name, hint)
	}
	return s, nil
}

func optionalTime(a map[string]json.RawMessage) (time.Time, *Error) {
	raw, ok := a["time"]
	if !ok {
		return time.Time{}, nil
	}
	s, isStr := asString(raw)
	if !isStr {
		return time.Time{}, Errorf(CodeMalformed, "time",
			"time is %s; it must be an RFC 3339 timestamp string such as \"2025-01-02T15:04:05Z\"", jsonKind(raw))
	}
	t, ok := parseTime(s)
	if !ok {
		return time.Time{}, Errorf(CodeMalformed, "time",
			"time %s is not an RFC 3339 timestamp; write it like \"2025-01-02T15:04:05.123Z\"", jsonQuote(abbreviate(s)))
	}
	return t, nil
}

func optionalContentType(a map[string]json.RawMessage) (string, *Error) {
	raw, ok := a["datacontenttype"]
	if !ok {
		return "", nil
	}
	s, isStr := asString(raw)
	if !isStr {
		return "", Errorf(CodeMalformed, "datacontenttype",
			"datacontenttype is %s; it must be the string \"application/json\" or absent", jsonKind(raw))
	}
	if mediaType(s) != ContentTypeJSON {
		return "", Errorf(CodeBadData, "datacontenttype",
			"datacontenttype is %s; seamguard's data is a JSON object: set datacontenttype to application/json or leave it out", jsonQuote(abbreviate(s)))
	}
	return s, nil
}
