package events

import "encoding/json"

// The CloudEvents core attributes seamguard reads, in the style of sdk-go's
// binding/spec Kind: one fixed, typed table, which the header reader, the
// structured reader, the validator and the encoder all consult. Every other
// attribute (dataschema included) is an extension, kept in
// Event.Extensions.

// attrKind is a core attribute: its index in attrTable and in envelope.
type attrKind uint8

// The core attributes, in the order the validator requires them.
const (
	attrSpecversion attrKind = iota
	attrID
	attrSource
	attrType
	attrSubject
	attrTime
	attrDataContentType
	numAttrs
)

// attrRule is how a core attribute is validated (envelope.validate).
type attrRule uint8

const (
	// ruleSpecversion: required, and the string "1.0" (bad_specversion).
	ruleSpecversion attrRule = iota
	// ruleRequired: a non-empty string (missing_attribute, malformed).
	ruleRequired
	// ruleTime: optional; an RFC 3339 timestamp string (malformed).
	ruleTime
	// ruleMediaType: optional; a string whose media type is
	// application/json (malformed, bad_data).
	ruleMediaType
)

// attrSpec describes one core attribute.
type attrSpec struct {
	kind   attrKind
	name   string // its name in structured mode and in messages
	header string // its binary-mode header, as Go's HTTP and MIME packages canonicalize it
	rule   attrRule
	// hint says what a required attribute should be set to; for an
	// optional one, what its value must be when it is not a string.
	hint string
	// maxBytes bounds a string value (too_large) with boundHint saying
	// what to do; 0 when another check bounds the value.
	maxBytes  int
	boundHint string
}

// attrTable is every core attribute, indexed by attrKind.
var attrTable = [numAttrs]attrSpec{
	{kind: attrSpecversion, name: "specversion", header: "Ce-Specversion", rule: ruleSpecversion},
	{kind: attrID, name: "id", header: "Ce-Id", rule: ruleRequired, hint: "a unique id per event, also sent as Nats-Msg-Id",
		maxBytes: MaxIDBytes, boundHint: "use an id of at most 256 bytes, such as a UUID or a ULID"},
	{kind: attrSource, name: "source", header: "Ce-Source", rule: ruleRequired, hint: "a URI-reference naming the agent",
		maxBytes: MaxIDBytes, boundHint: "use a source URI of at most 256 bytes that names the agent"},
	{kind: attrType, name: "type", header: "Ce-Type", rule: ruleRequired, hint: "one of the io.seamguard.* input types"},
	{kind: attrSubject, name: "subject", header: "Ce-Subject", rule: ruleRequired, hint: "the session id"},
	{kind: attrTime, name: "time", header: "Ce-Time", rule: ruleTime,
		hint: "it must be an RFC 3339 timestamp string such as \"2025-01-02T15:04:05Z\""},
	{kind: attrDataContentType, name: "datacontenttype", header: "Ce-Datacontenttype", rule: ruleMediaType,
		hint: "it must be the string \"application/json\" or absent"},
}

// attrsByLen indexes attrTable by the length of the names, so that a name
// is looked up with one or two comparisons.
var attrsByLen = func() (idx [16][]attrKind) {
	for k := range attrTable {
		n := len(attrTable[k].name)
		idx[n] = append(idx[n], attrTable[k].kind)
	}
	return idx
}()

// attrNamed returns the core attribute named name exactly, as a structured
// event spells it.
func attrNamed[T string | []byte](name T) (attrKind, bool) {
	if len(name) < len(attrsByLen) {
		for _, k := range attrsByLen[len(name)] {
			if attrTable[k].name == string(name) {
				return k, true
			}
		}
	}
	return 0, false
}

// attrFolded returns the core attribute named name in any ASCII case, as a
// ce- header may spell it.
func attrFolded(name string) (attrKind, bool) {
	if len(name) < len(attrsByLen) {
		for _, k := range attrsByLen[len(name)] {
			if asciiEqualFold(name, attrTable[k].name) {
				return k, true
			}
		}
	}
	return 0, false
}

// attrByHeader returns the core attribute whose header is k, spelled as
// nearly every header arrives: "ce-" and the name in lower case, as the
// CloudEvents SDKs write them (nats.go keeps a header name's case), or as
// Go's HTTP and MIME packages canonicalize it ("Ce-Id"). Any other
// spelling is matched by addOther.
func attrByHeader(k string) (attrKind, bool) {
	n := len(k) - len("ce-")
	if n <= 0 || n >= len(attrsByLen) || k[1] != 'e' || k[2] != '-' {
		return 0, false
	}
	switch k[0] {
	case 'c':
		return attrNamed(k[3:])
	case 'C':
		for _, kind := range attrsByLen[n] {
			if attrTable[kind].header == k {
				return kind, true
			}
		}
	}
	return 0, false
}

// isCoreAttr reports whether name is the name of a core attribute.
func isCoreAttr(name string) bool {
	_, ok := attrNamed(name)
	return ok
}

// inputTypes are the event types an agent may publish, in byte order.
var inputTypes = [...]string{
	TypeCompactionCommitted, TypeCompactionRequested, TypeContextPinned,
	TypeContextTruncated, TypeContextUnpinned, TypeSessionClosed,
	TypeSessionOpened, TypeSessionResumed, TypeTurnAppended,
}

// inputType returns the package's constant for typ when it is an input
// type, so that an event does not keep a header's or a body's string.
func inputType(typ string) (string, bool) {
	for _, t := range inputTypes {
		if t == typ {
			return t, true
		}
	}
	return "", false
}

// envelope is an event's attributes and data, from either content mode,
// before validation. A JSON null attribute counts as absent.
type envelope struct {
	// attr holds the value of each present core attribute that is a
	// string; raw its JSON as a structured event spelled it (nil in
	// binary mode, where every value is a string).
	attr [numAttrs]string
	raw  [numAttrs][]byte
	have uint8 // bit k: core attribute k is present
	str  uint8 // bit k: core attribute k is a string
	// ext holds the extension attributes by lower-case name, as
	// Event.Extensions does: strings as JSON strings spelled by
	// jsonString, numbers and booleans as sent.
	ext map[string]json.RawMessage
	// data is the data, compacted; nil when absent.
	data json.RawMessage
}

// has reports whether core attribute k is present.
func (e *envelope) has(k attrKind) bool { return e.have&(1<<k) != 0 }

// isString reports whether core attribute k is present and a string.
func (e *envelope) isString(k attrKind) bool { return e.str&(1<<k) != 0 }

// setString sets core attribute k to the string v.
func (e *envelope) setString(k attrKind, v string) {
	e.have |= 1 << k
	e.str |= 1 << k
	e.attr[k] = v
}

// setRaw sets core attribute k to raw, a JSON value that is not a string.
func (e *envelope) setRaw(k attrKind, raw []byte) {
	e.have |= 1 << k
	e.str &^= 1 << k
	e.raw[k] = raw
}

// rawJSON returns core attribute k as compacted JSON, for the checks and
// messages that quote its JSON: as the body spelled it, or as jsonString
// spells a header's value.
func (e *envelope) rawJSON(k attrKind) json.RawMessage {
	if e.raw[k] == nil {
		return jsonString(e.attr[k])
	}
	c, _ := compact(e.raw[k]) // valid JSON: no error
	return c
}

// addExt adds the extension name with the JSON value val.
func (e *envelope) addExt(name string, val json.RawMessage) {
	if e.ext == nil {
		e.ext = make(map[string]json.RawMessage, 2)
	}
	e.ext[name] = val
}

// extLen is the size of an extension value as the bounds count it: a
// string's bytes, or the JSON spelling of a number or a boolean.
func extLen(raw json.RawMessage) int {
	if s, ok := asString(raw); ok {
		return len(s)
	}
	return len(raw)
}

// isJSONString reports whether raw, as jsonString spells strings, is the
// JSON string s, without decoding it. s must need no escaping (a session
// id).
func isJSONString(raw []byte, s string) bool {
	return len(raw) == len(s)+2 && raw[0] == '"' && raw[len(raw)-1] == '"' && string(raw[1:len(raw)-1]) == s
}
