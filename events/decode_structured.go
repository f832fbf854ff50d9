package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// readStructured reads a structured-mode event, a JSON object, into e.
// With own, e's data may be a part of body rather than a copy.
//
// A body that is not one JSON object in UTF-8 is malformed, and so is a
// member given twice, whatever else is wrong; then the members are read in
// document order, and the first one at fault is the rejection.
func (e *envelope) readStructured(body []byte, own bool) *Error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errEmptyMessage()
	}
	var o object
	if !o.readBody(body) {
		// readBody checks the UTF-8 too (see scanJSON): a body it refuses
		// is looked at again to say what is wrong.
		if !utf8.Valid(body) {
			return errBodyNotUTF8()
		}
		if err := o.readSlow(body); err != nil {
			return err
		}
	}
	if o.dup != nil {
		return errMemberTwice(o.dup)
	}
	return e.readMembers(&o, own)
}

// readSlow reads body, which readBody refused, with encoding/json's
// tokenizer, whose error names the first syntax error. Without an error,
// parseObjectSlow stops at the first name given twice and returns it, and
// no members; as its "" is also no name, it returns no members and no
// name for a name "" given twice. (Otherwise readBody, which reads every
// object parseObjectSlow reads, would not have refused body: FuzzFastJSON
// holds them to that; then its members are read.)
func (o *object) readSlow(body []byte) *Error {
	members, dup, err := parseObjectSlow(body)
	if err != nil {
		return errNotObjectBody(err)
	}
	if dup != "" || members == nil {
		o.dup = []byte(dup)
		return nil
	}
	*o = object{spaced: ^uint32(0)} // white space unknown: data is compacted
	for _, m := range members {
		o.add([]byte(m.name), m.val)
	}
	return nil
}

// readMembers reads the members of a structured event into e.
func (e *envelope) readMembers(o *object, own bool) *Error {
	// The core attributes that are strings without escapes share one
	// allocation.
	var spans [numAttrs][]byte
	n := 0
	for k := range o.len() {
		name, val, spaced := o.member(k)
		kind, core := attrNamed(name)
		switch {
		case !core:
			if err := e.readMember(name, val, spaced, own); err != nil {
				return err
			}
		case val[0] == '"' && bytes.IndexByte(val, '\\') < 0:
			spans[kind] = val[1 : len(val)-1]
			e.setString(kind, "")
			e.raw[kind] = val
			n += len(spans[kind])
		case string(val) == "null": // a null attribute is an absent one
		case val[0] == '"':
			s, _ := asString(val)
			e.setString(kind, s)
			e.raw[kind] = val
		default:
			e.setRaw(kind, val)
		}
	}
	if n > 0 {
		var b strings.Builder
		b.Grow(n)
		for _, sp := range spans {
			b.Write(sp)
		}
		all := b.String()
		for k, sp := range spans {
			if sp != nil {
				e.attr[k], all = all[:len(sp)], all[len(sp):]
			}
		}
	}
	return nil
}

// readMember reads a member of a structured event that is not a core
// attribute: the data, or an extension attribute.
func (e *envelope) readMember(name, val []byte, spaced, own bool) *Error {
	switch string(name) {
	case "data":
		e.data = dataOf(val, spaced, own)
		return nil
	case "data_base64":
		if string(val) == "null" {
			return nil
		}
		return errDataBase64()
	}
	if !validAttrName(name) {
		return errMemberName(name)
	}
	switch val[0] {
	case 'n': // null: an absent attribute
		return nil
	case '{', '[':
		return errExtensionKind(name, val)
	case '"':
		e.addExt(string(name), canonicalString(val))
		return nil
	}
	if string(name) == "dataschema" {
		return errDataschema(val)
	}
	e.addExt(string(name), bytes.Clone(val))
	return nil
}

// canonicalString returns the JSON string val as jsonString spells its
// value: one spelling for one value, whatever the escapes.
func canonicalString(val []byte) json.RawMessage {
	if in := val[1 : len(val)-1]; plainASCII(in, 0) == len(in) {
		return bytes.Clone(val) // nothing to unescape, nothing to escape
	}
	s, _ := asString(val)
	return jsonString(s)
}

// dataOf returns the data member val compacted: val itself with own, else
// a copy, when it holds no white space (spaced is false).
func dataOf(val []byte, spaced, own bool) []byte {
	switch {
	case spaced:
		return compactValid(val)
	case own:
		return val[:len(val):len(val)]
	}
	return bytes.Clone(val)
}

// readBinary reads the body of a binary-mode event, its data, into e. With
// own, e's data may be body itself rather than a copy.
func (e *envelope) readBinary(body []byte, own bool) *Error {
	if len(body) == 0 {
		return nil
	}
	// scanJSON checks the UTF-8 too (the strings'; JSON allows nothing but
	// ASCII outside them), so that the body is read once: a body it
	// refuses is looked at again to say what is wrong.
	switch valid, spaced := scanJSON(body); {
	case !valid:
		if !utf8.Valid(body) {
			return errDataNotUTF8()
		}
		data, err := compactSlow(body) // its error says what is wrong
		if err != nil {
			return errDataNotJSON(err)
		}
		e.data = data
	default:
		e.data = dataOf(body, spaced, own)
	}
	return nil
}
