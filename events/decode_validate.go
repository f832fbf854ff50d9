package events

import (
	"slices"
	"time"
)

// origin is where an envelope came from, for the checks that depend on it.
type origin struct {
	subject  string // the NATS subject, when fromNATS
	subjects Subjects
	fromNATS bool // false for DecodeJSON: there is no NATS subject to check
}

// validate checks the envelope against the contract and decodes the data.
// The checks run in a fixed order, so that an event with several faults
// always gets the same rejection: specversion, the required attributes in
// table order, the bounds, the session, the optional attributes in table
// order, the type, the data.
func (e *envelope) validate(o origin) (*Event, *Error) {
	if !e.allPresent() {
		return nil, e.firstAbsent()
	}
	if err := e.checkBounds(); err != nil {
		return nil, err
	}
	if err := e.checkSession(o); err != nil {
		return nil, err
	}
	ev := &Event{ID: e.attr[attrID], Source: e.attr[attrSource], Subject: e.attr[attrSubject], Extensions: e.ext}
	for _, k := range valueRules {
		if err := e.checkValue(&attrTable[k], ev); err != nil {
			return nil, err
		}
	}
	typ, ok := inputType(e.attr[attrType])
	if !ok {
		return nil, errUnknownType(e.attr[attrType])
	}
	body, err := decodeData(typ, e.data)
	if err != nil {
		return nil, err
	}
	ev.Type, ev.Data, ev.Body = typ, e.data, body
	return ev, nil
}

// What validate does with each core attribute, from attrTable.
var (
	// presentRules are the attributes checkPresent checks, as a bit set.
	presentRules uint8
	// boundedRules are the attributes with a bound, in table order.
	boundedRules []attrKind
	// valueRules are the attributes checkValue checks, in table order.
	valueRules []attrKind
)

func init() {
	for k := range attrTable {
		a := &attrTable[k]
		switch a.rule {
		case ruleSpecversion, ruleRequired:
			presentRules |= 1 << a.kind
		case ruleTime, ruleMediaType:
			valueRules = append(valueRules, a.kind)
		}
		if a.maxBytes > 0 {
			boundedRules = append(boundedRules, a.kind)
		}
	}
}

// allPresent reports whether checkPresent passes every attribute, sparing
// its work on the events that do.
func (e *envelope) allPresent() bool {
	if e.str&presentRules != presentRules || e.attr[attrSpecversion] != "1.0" {
		return false
	}
	for k := range attrTable {
		if presentRules&(1<<k) != 0 && e.attr[k] == "" {
			return false
		}
	}
	return true
}

// firstAbsent returns the rejection checkPresent gives the first attribute
// that fails it, in table order.
func (e *envelope) firstAbsent() *Error {
	for k := range attrTable {
		if err := e.checkPresent(&attrTable[k], attrTable[k].hint); err != nil {
			return err
		}
	}
	return nil
}

// checkPresent checks what the rule of a must hold whatever else is wrong
// with the event: specversion is "1.0", a required attribute is a
// non-empty string (hint says what to set it to). Optional attributes pass.
func (e *envelope) checkPresent(a *attrSpec, hint string) *Error {
	switch a.rule {
	case ruleSpecversion:
		if !e.has(a.kind) {
			return errNoSpecversion()
		}
		if !e.isString(a.kind) || e.attr[a.kind] != "1.0" {
			return errBadSpecversion(e.rawJSON(a.kind))
		}
	case ruleRequired:
		switch {
		case !e.has(a.kind):
			return errNoAttr(a, hint)
		case !e.isString(a.kind):
			return errAttrNotString(a, e.raw[a.kind], hint)
		case e.attr[a.kind] == "":
			return errEmptyAttr(a, hint)
		}
	}
	return nil
}

// checkValue checks an optional attribute, one of valueRules, by its rule,
// when present, and sets its field of ev.
func (e *envelope) checkValue(a *attrSpec, ev *Event) *Error {
	if !e.has(a.kind) {
		return nil
	}
	if !e.isString(a.kind) {
		return errNotStringAttr(a, e.raw[a.kind])
	}
	s := e.attr[a.kind]
	if a.rule == ruleTime {
		t, ok := parseTime(s)
		if !ok {
			return errBadTime(s)
		}
		ev.Time = t
		return nil
	}
	if !isMediaType(s, ContentTypeJSON) {
		return errBadMediaType(s)
	}
	ev.DataContentType = s
	return nil
}

// checkBounds rejects a core attribute or an extension value longer than
// its bound (too_large), naming the first such attribute: the core ones in
// table order (id, source), then the extensions in name order.
func (e *envelope) checkBounds() *Error {
	for _, k := range boundedRules {
		if a := &attrTable[k]; len(e.attr[k]) > a.maxBytes {
			return tooLarge(a.name, len(e.attr[k]), a.maxBytes, a.boundHint)
		}
	}
	if e.ext == nil {
		return nil
	}
	return e.checkExtBounds()
}

// checkExtBounds is checkBounds for the extensions.
func (e *envelope) checkExtBounds() *Error {
	var over []string
	for name, raw := range e.ext {
		if len(raw) > MaxIDBytes && extLen(raw) > MaxIDBytes { // a value's JSON is never shorter than it
			over = append(over, name)
		}
	}
	if len(over) == 0 {
		return nil
	}
	name := slices.Min(over)
	return tooLarge(name, extLen(e.ext[name]), MaxIDBytes,
		"send extension values of at most 256 bytes and put anything larger in the data")
}

// checkSession checks the subject attribute: a valid session id, the
// session of the NATS subject the event came on, and the partitionkey
// extension's value when there is one.
func (e *envelope) checkSession(o origin) *Error {
	session := e.attr[attrSubject]
	if !ValidSessionID(session) {
		return errBadSession(session)
	}
	if o.fromNATS {
		tok, err := o.subjects.sessionOf(o.subject)
		if err != nil {
			return err
		}
		if tok != session {
			return o.subjects.errSubjectMismatch(o.subject, tok, session)
		}
	}
	if raw, ok := e.ext["partitionkey"]; ok && !isJSONString(raw, session) {
		return errPartitionKey(raw, session)
	}
	return nil
}

// readTime returns the time attribute, zero when absent.
func (e *envelope) readTime() (time.Time, *Error) {
	var ev Event
	err := e.checkValue(&attrTable[attrTime], &ev)
	return ev.Time, err
}

// readContentType returns the datacontenttype attribute, "" when absent.
func (e *envelope) readContentType() (string, *Error) {
	var ev Event
	err := e.checkValue(&attrTable[attrDataContentType], &ev)
	return ev.DataContentType, err
}
