package events

import (
	"strings"
)

// The input decoder's rejections: every *Error DecodeMsg, DecodeMsgOwned
// and DecodeJSON return is built here, out of line, so that the functions
// on the path of an accepted event stay small: the decoder is only as fast
// as the code it runs fits the instruction cache. The messages are the
// contract's; tests and golden files check them.

// The rejections of a structured event's body.

// errEmptyMessage rejects a body that is empty or white space.
func errEmptyMessage() *Error {
	return Errorf(CodeMalformed, "",
		"the message is empty; send a structured CloudEvent (a JSON object) or a binary-mode event with ce-* headers")
}

// errBodyNotUTF8 rejects a structured body that is not UTF-8.
func errBodyNotUTF8() *Error {
	return Errorf(CodeMalformed, "", "the message body is not valid UTF-8; a structured CloudEvent is UTF-8 JSON")
}

// errNotObjectBody rejects a structured body that is not a JSON object, as
// encoding/json's err says.
func errNotObjectBody(err error) *Error {
	return &Error{Code: CodeMalformed, Err: err,
		Message: "the message body is not a JSON object (" + Excerpt(err.Error()) + "); send one CloudEvent as a JSON object, or binary mode with a ce-specversion header"}
}

// errMemberTwice rejects a structured event with the member name twice.
func errMemberTwice(name []byte) *Error {
	dup := Excerpt(string(name))
	return Errorf(CodeMalformed, dup, "the member %q appears twice in the event; send each attribute once", dup)
}

// errDataBase64 rejects a structured event with data_base64.
func errDataBase64() *Error {
	return Errorf(CodeBadData, "data",
		"the event carries data_base64; seamguard's data is a JSON object: send it as \"data\" with datacontenttype application/json")
}

// errMemberName rejects a member whose name is no attribute name.
func errMemberName(name []byte) *Error {
	n := Excerpt(string(name))
	return Errorf(CodeMalformed, n,
		"the member %q is not a CloudEvents attribute name; attribute names are lower-case letters and digits only", n)
}

// errExtensionKind rejects an extension whose value val is an object or an
// array.
func errExtensionKind(name, val []byte) *Error {
	n := Excerpt(string(name))
	return Errorf(CodeMalformed, n,
		"the extension attribute %s is %s; extension values are strings, numbers or booleans", n, jsonKind(val))
}

// errDataschema rejects a dataschema val that is not a string.
func errDataschema(val []byte) *Error {
	return Errorf(CodeMalformed, "dataschema", "dataschema is %s; it must be a URI string", jsonKind(val))
}

// The rejections of a binary-mode event's body.

// errDataNotUTF8 rejects a binary-mode body that is not UTF-8.
func errDataNotUTF8() *Error {
	return Errorf(CodeBadData, "data", "the message body is not valid UTF-8; send the data as a UTF-8 JSON object")
}

// errDataNotJSON rejects a binary-mode body that is not JSON, as
// encoding/json's err says.
func errDataNotJSON(err error) *Error {
	return &Error{Code: CodeBadData, Field: "data", Err: err,
		Message: "the message body is not valid JSON (" + Excerpt(err.Error()) + "); in binary mode the body is the event's data, a JSON object"}
}

// The rejections of headers.

// errContentTypeTwice rejects two Content-Type values, prev and v.
func errContentTypeTwice(prev, v string) *Error {
	return Errorf(CodeMalformed, "",
		"the Content-Type header is given twice with different values (%q and %q); send it once", Excerpt(prev), Excerpt(v))
}

// errDataHeader rejects the header k, a ce-data or ce-data_base64.
func errDataHeader(k string) *Error {
	return Errorf(CodeMalformed, "data",
		"the header %q is not allowed: in binary mode the data is the message body, in structured mode it is the body's \"data\" member", Excerpt(k))
}

// errHeaderName rejects the header k, whose attribute name is not one.
func errHeaderName(k, name string) *Error {
	return Errorf(CodeMalformed, Excerpt(name),
		"the header %q does not name a CloudEvents attribute: attribute names are lower-case letters and digits only", Excerpt(k))
}

// errHeaderValue rejects the value of the header k, which names the
// attribute name, for the problem percentDecode found.
func errHeaderValue(k, name, problem string) *Error {
	return Errorf(CodeMalformed, Excerpt(name),
		"the value of header %q %s; percent-encode it (a literal %% is %%25) or send the value as plain UTF-8 text", Excerpt(k), problem)
}

// errHeaderOnly rejects a structured event whose header gives the
// attribute name, as hv, which its body does not have.
func errHeaderOnly(name, hv string) *Error {
	return Errorf(CodeMalformed, Excerpt(name),
		"the header ce-%s is %q but the structured event in the body has no %s; in structured mode the body is the whole event: drop the header or add the attribute to the body",
		Excerpt(name), Excerpt(hv), Excerpt(name))
}

// errContradicts rejects a structured event whose header gives the
// attribute name as hv, and its body as raw JSON.
func errContradicts(name, hv string, raw []byte) *Error {
	return Errorf(CodeMalformed, Excerpt(name),
		"the header ce-%s (%q) contradicts the %s in the structured event (%s); drop the header or make them agree",
		Excerpt(name), Excerpt(hv), Excerpt(name), Excerpt(string(raw)))
}

// givenTwice rejects an attribute whose headers give two values.
func givenTwice(name, prev, v string) *Error {
	return Errorf(CodeMalformed, Excerpt(name),
		"the attribute %s is given twice in the headers with different values (%q and %q); send each ce- header once", Excerpt(name), Excerpt(prev), Excerpt(v))
}

// The rejections of attributes.

// errNoSpecversion rejects an event without specversion.
func errNoSpecversion() *Error {
	return Errorf(CodeMissingAttribute, "specversion",
		"the event has no specversion; seamguard reads CloudEvents 1.0: set specversion to \"1.0\"")
}

// errBadSpecversion rejects a specversion, raw JSON, other than "1.0".
func errBadSpecversion(raw []byte) *Error {
	return Errorf(CodeBadSpecversion, "specversion",
		"specversion is %s; seamguard reads CloudEvents 1.0 only: set specversion to \"1.0\"", Excerpt(string(raw)))
}

// errNoAttr rejects an event without the required attribute a; hint says
// what to set it to.
func errNoAttr(a *attrSpec, hint string) *Error {
	return Errorf(CodeMissingAttribute, a.name, "the event has no %s; set it to %s", a.name, hint)
}

// errAttrNotString rejects a required attribute a whose value raw is not a
// string.
func errAttrNotString(a *attrSpec, raw []byte, hint string) *Error {
	return Errorf(CodeMalformed, a.name, "%s is %s; it must be a string: %s", a.name, jsonKind(raw), hint)
}

// errEmptyAttr rejects a required attribute a that is empty.
func errEmptyAttr(a *attrSpec, hint string) *Error {
	return Errorf(CodeMissingAttribute, a.name, "%s is empty; set it to %s", a.name, hint)
}

// errNotStringAttr rejects the optional attribute a, whose value raw is not
// a string.
func errNotStringAttr(a *attrSpec, raw []byte) *Error {
	return Errorf(CodeMalformed, a.name, "%s is %s; %s", a.name, jsonKind(raw), a.hint)
}

// errBadTime rejects a time s that is not an RFC 3339 timestamp.
func errBadTime(s string) *Error {
	return Errorf(CodeMalformed, "time",
		"time %s is not an RFC 3339 timestamp; write it like \"2025-01-02T15:04:05.123Z\"", jsonQuote(Excerpt(s)))
}

// errBadMediaType rejects a datacontenttype s other than application/json.
func errBadMediaType(s string) *Error {
	return Errorf(CodeBadData, "datacontenttype",
		"datacontenttype is %s; seamguard's data is a JSON object: set datacontenttype to application/json or leave it out", jsonQuote(Excerpt(s)))
}

// errUnknownType rejects a type that is not an input type.
func errUnknownType(typ string) *Error {
	return Errorf(CodeUnknownType, "type", "the type %s is not a seamguard input type; use one of %s",
		jsonQuote(Excerpt(typ)), strings.Join(inputTypes[:], ", "))
}

// tooLarge rejects a field of n bytes, above bound.
func tooLarge(field string, n, bound int, what string) *Error {
	return Errorf(CodeTooLarge, Excerpt(field), "%s is %d bytes, more than the %d allowed; %s", Excerpt(field), n, bound, what)
}

// errBadSession rejects a subject attribute that is not a session id.
func errBadSession(session string) *Error {
	return Errorf(CodeBadSessionID, "subject",
		"the subject %s is not a valid session id; use 1 to 128 of the characters A-Z, a-z, 0-9, '_' and '-'", jsonQuote(Excerpt(session)))
}

// errPartitionKey rejects a partitionkey raw other than the session's.
func errPartitionKey(raw []byte, session string) *Error {
	s, isStr := asString(raw)
	if !isStr {
		return Errorf(CodeMalformed, "partitionkey", "partitionkey is %s; when present it must be the session id as a string", jsonKind(raw))
	}
	return Errorf(CodeSubjectMismatch, "partitionkey",
		"partitionkey is %s but the session is %q; set partitionkey to the session id or leave it out", jsonQuote(Excerpt(s)), session)
}

// The rejections of NATS subjects.

// errSubjectMismatch rejects an event of session that came on natsSubject,
// the subject of session tok.
func (s Subjects) errSubjectMismatch(natsSubject, tok, session string) *Error {
	on, want := s.Events(tok), s.Events(session)
	if s.IsControl(natsSubject) {
		on, want = s.Control(tok), s.Control(session)
	}
	return Errorf(CodeSubjectMismatch, "subject",
		"the event's subject is %q but it was published on %q, the subject of session %q; publish each event on %s",
		session, on, tok, want)
}

// errNotEventsSubject rejects natsSubject, which is no input subject.
func (s Subjects) errNotEventsSubject(natsSubject string) *Error {
	return Errorf(CodeBadSessionID, "subject",
		"the event arrived on NATS subject %q, which is not an events subject; publish each event on %s<session id>", Excerpt(natsSubject), s.prefix()+".events.")
}

// errSubjectTokens rejects natsSubject, which has more than one token
// after prefix.
func errSubjectTokens(natsSubject, prefix string) *Error {
	return Errorf(CodeBadSessionID, "subject",
		"the event arrived on NATS subject %q, which has more than one token after %q; a session id is a single token of letters, digits, '_' and '-'", Excerpt(natsSubject), prefix)
}

// errSessionToken rejects the session token of a NATS subject that is not
// a valid session id.
func errSessionToken(tok string) *Error {
	return Errorf(CodeBadSessionID, "subject",
		"the NATS subject token %q is not a valid session id; use 1 to 128 of the characters A-Z, a-z, 0-9, '_' and '-'", Excerpt(tok))
}

// The rejections of data.

// errClosedData rejects the data of a session.closed that is no object.
func errClosedData(data []byte) *Error {
	return Errorf(CodeBadData, "data",
		"data is %s; session.closed carries nothing: leave data out, or send null or an object", jsonKind(data))
}

// errNoData rejects an event of type typ without data.
func errNoData(typ string) *Error {
	return Errorf(CodeMissingAttribute, "data", "the event has no data; %s needs a JSON object as its data", typ)
}

// errNotObject rejects the object o, whose JSON raw is no object.
func (o *object) errNotObject(raw []byte) *Error {
	return Errorf(CodeBadData, o.fullPath(), "%s is %s; it must be a JSON object", o.fullPath(), jsonKind(raw))
}

// errFieldTwice rejects the object o, which has a member twice.
func (o *object) errFieldTwice() *Error {
	dup := Excerpt(string(o.dup))
	return Errorf(CodeBadData, o.fullPath()+"."+dup, "the field %q appears twice in %s; send it once", dup, o.fullPath())
}

// missing rejects a required member that is absent. The parts of hint,
// which says what to send, are joined only here.
func (o *object) missing(name string, hint ...string) *Error {
	return Errorf(CodeBadData, o.field(name), "%s is missing; send %s", o.field(name), strings.Join(hint, ""))
}

// errNotUint rejects a member raw that is no plain integer in [0, 2^53].
func (o *object) errNotUint(name string, raw []byte, hint []string) *Error {
	_, problem := parseUint(raw)
	return Errorf(CodeBadData, o.field(name),
		"%s %s; send %s as a plain non-negative JSON integer, at most 2^53", o.field(name), problem, strings.Join(hint, ""))
}

// errNotString rejects a member raw that is not a string.
func (o *object) errNotString(name string, raw []byte, hint string) *Error {
	return Errorf(CodeBadData, o.field(name), "%s is %s; send %s as a string", o.field(name), jsonKind(raw), hint)
}

// errEmptyString rejects a member that is an empty string.
func (o *object) errEmptyString(name, hint string) *Error {
	return Errorf(CodeBadData, o.field(name), "%s is empty; send %s", o.field(name), hint)
}

// errNotBool rejects a member raw that is neither true nor false.
func (o *object) errNotBool(name string, raw []byte, hint string) *Error {
	return Errorf(CodeBadData, o.field(name), "%s is %s; send %s as true or false", o.field(name), jsonKind(raw), hint)
}

// errBadUnit rejects a member s that is not one of the units.
func (o *object) errBadUnit(name, s, hint string) *Error {
	return Errorf(CodeBadData, o.field(name),
		"%s is %s; send %s: one of %q, %q or %q", o.field(name), jsonQuote(Excerpt(s)), hint, UnitTurns, UnitTokens, UnitMessages)
}

// errZeroSize rejects a turn of size 0.
func errZeroSize() *Error {
	return Errorf(CodeBadData, "data.size", "data.size is 0; a turn covers at least one offset: send its length in the session unit")
}

// errPastMaxOffset rejects a turn that ends past MaxOffset.
func errPastMaxOffset(offset, size uint64) *Error {
	return Errorf(CodeBadData, "data.size",
		"data.offset + data.size is %d + %d, past the largest allowed offset 2^53; check the turn's offset and size", offset, size)
}

// errReversed rejects a reversed data.range r, which should be what.
func errReversed(r Range, what string) *Error {
	return Errorf(CodeBadData, "data.range",
		"data.range is reversed (start %d > end %d); send %s as {\"start\": first, \"end\": one past the last}", r.Start, r.End, what)
}
