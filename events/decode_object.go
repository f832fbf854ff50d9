package events

import (
	"bytes"
	"encoding/json"
)

// inlineMembers is how many members an object holds without allocating.
const inlineMembers = 16

// object is a JSON object's members, read in place, in document order:
// values as raw JSON, sub-slices of what was read, and names unescaped (a
// sub-slice too, unless the name had an escape). The first inlineMembers
// members are looked up by a scan; any more, through a map of every name.
type object struct {
	// path and key are the object's field path for messages: path alone,
	// such as "data", or path, a dot and key, such as "data.range" (so
	// that the path is built only for a message).
	path, key string
	n         int // members in names and vals
	names     [inlineMembers][]byte
	vals      [inlineMembers][]byte
	spaced    uint32         // bit k: vals[k] holds white space (readBody only)
	more      []member       // the members past inlineMembers
	index     map[string]int // every name's position, once there is more
	dup       []byte         // the first name that repeats an earlier one
}

// read reads raw, valid JSON, as an object. It returns false when raw is
// not an object. It stops at the first name given twice (o.dup).
func (o *object) read(raw []byte) bool {
	i := skipSpace(raw, 0)
	if i == len(raw) || raw[i] != '{' {
		return false
	}
	if i = skipSpace(raw, i+1); raw[i] == '}' {
		return true
	}
	for {
		end := skipString(raw, i)
		name := raw[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			name = unescapedName(raw[i:end])
		}
		i = skipSpace(raw, skipSpace(raw, end)+1) // past the colon
		end = skipValue(raw, i)
		if o.n == inlineMembers {
			o.addMore(name, raw[i:end:end])
		} else { // add, spelled out for speed
			for _, prev := range o.names[:o.n] {
				if string(prev) == string(name) {
					o.dup = name
				}
			}
			o.names[o.n], o.vals[o.n] = name, raw[i:end:end]
			o.n++
		}
		if o.dup != nil {
			return true
		}
		if i = skipSpace(raw, end); raw[i] == '}' {
			return true
		}
		i = skipSpace(raw, i+1) // past the comma
	}
}

// readBody reads b, valid UTF-8, as exactly one JSON object with optional
// white space around it, checking its syntax as encoding/json's Decoder
// reads it: each member's value is valid JSON nested at most 10000 levels
// deep, counted from the value. It returns false when b is not such an
// object (parseObjectSlow then says why). Every member is read, also past
// a name given twice (o.dup).
func (o *object) readBody(b []byte) bool {
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return false
	}
	if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end := validString(b, i)
		if end < 0 {
			return false
		}
		name := unescapedName(b[i:end])
		if i = skipSpace(b, end); i == len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		end, spaced := scanValue(b, i)
		if end < 0 {
			return false
		}
		if spaced && o.more == nil && o.n < inlineMembers {
			o.spaced |= 1 << o.n
		}
		o.add(name, b[i:end:end])
		if i = skipSpace(b, end); i == len(b) {
			return false
		}
		switch b[i] {
		case '}':
			return skipSpace(b, i+1) == len(b)
		case ',':
			i = skipSpace(b, i+1)
		default:
			return false
		}
	}
}

// unescapedName returns the name that the JSON string raw spells.
func unescapedName(raw []byte) []byte {
	name := raw[1 : len(raw)-1]
	if bytes.IndexByte(name, '\\') < 0 {
		return name
	}
	s, _ := asString(raw)
	return []byte(s)
}

// add appends the member name: val, noting the first repeated name.
func (o *object) add(name, val []byte) {
	if o.n == inlineMembers {
		o.addMore(name, val)
		return
	}
	for _, prev := range o.names[:o.n] {
		if string(prev) == string(name) && o.dup == nil {
			o.dup = name
		}
	}
	o.names[o.n], o.vals[o.n] = name, val
	o.n++
}

// addMore is add past inlineMembers, where every name is indexed.
func (o *object) addMore(name, val []byte) {
	if o.index == nil {
		o.index = make(map[string]int, 2*inlineMembers)
		for k, nm := range o.names {
			if _, seen := o.index[string(nm)]; !seen {
				o.index[string(nm)] = k
			}
		}
	}
	if _, seen := o.index[string(name)]; !seen {
		o.index[string(name)] = inlineMembers + len(o.more)
	} else if o.dup == nil {
		o.dup = name
	}
	o.more = append(o.more, member{string(name), val})
}

// len returns the number of members.
func (o *object) len() int { return o.n + len(o.more) }

// member returns the name, the value and whether the value holds white
// space (true when not known) of the member at position k.
func (o *object) member(k int) (name, val []byte, spaced bool) {
	if k < inlineMembers {
		return o.names[k], o.vals[k], o.spaced&(1<<k) != 0
	}
	m := o.more[k-inlineMembers]
	return []byte(m.name), m.val, true
}

// raw returns a member's value, null included.
func (o *object) raw(name string) ([]byte, bool) {
	for k, nm := range o.names[:o.n] {
		if string(nm) == name {
			return o.vals[k], true
		}
	}
	if o.more != nil {
		return o.rawMore(name)
	}
	return nil, false
}

// rawMore is raw for the members past inlineMembers.
func (o *object) rawMore(name string) ([]byte, bool) {
	if k, ok := o.index[name]; ok && k >= inlineMembers {
		return o.more[k-inlineMembers].val, true
	}
	return nil, false
}

// get returns a member's value; null counts as absent (values are read
// without white space around them).
func (o *object) get(name string) (json.RawMessage, bool) {
	v, ok := o.raw(name)
	return v, ok && string(v) != "null"
}
