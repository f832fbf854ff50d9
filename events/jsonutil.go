package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"unicode/utf8"
)

// member is one name/value pair of a JSON object, in document order.
type member struct {
	name string
	val  json.RawMessage
}

var errNotObject = errors.New("not a JSON object")

// parseObject reads raw as exactly one JSON object and returns its members in
// order. dup is the first name that occurs twice (then members is nil).
// Nesting is bounded by encoding/json (10000 levels) and the scan is linear:
// member values are kept raw, never walked recursively here.
func parseObject(raw []byte) (members []member, dup string, err error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, "", err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, "", errNotObject
	}
	seen := make(map[string]struct{})
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, "", err
		}
		name, ok := tok.(string)
		if !ok { // cannot happen: the decoder checks object syntax
			return nil, "", errNotObject
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, "", err
		}
		if _, ok := seen[name]; ok {
			return nil, name, nil
		}
		seen[name] = struct{}{}
		members = append(members, member{name, v})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, "", errors.New("unexpected data after the top-level object")
	}
	return members, "", nil
}

// jsonKind names the JSON type of a valid raw value, for messages.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func isNull(raw json.RawMessage) bool {
	return string(bytes.TrimSpace(raw)) == "null"
}

// asString returns the string value of raw, or false if raw is not a JSON string.
func asString(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// parseUint returns the value of raw if it is a plain JSON integer in
// [0, MaxOffset]; otherwise it says what is wrong with it.
func parseUint(raw json.RawMessage) (uint64, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == '"' || raw[0] == '{' || raw[0] == '[' || raw[0] == 't' || raw[0] == 'f' || raw[0] == 'n' {
		return 0, "is " + jsonKind(raw) + ", not a number"
	}
	if raw[0] == '-' {
		return 0, "is negative (" + string(raw) + ")"
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, "is " + string(raw) + ", not a plain integer (no fraction, no exponent)"
		}
	}
	v, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || v > MaxOffset {
		return 0, "is " + abbreviate(string(raw)) + ", more than the largest allowed value 2^53 (9007199254740992)"
	}
	return v, ""
}

func abbreviate(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// appendString appends s as a JSON string. It does not escape HTML, so that
// bytes read back from our own output compare equal; invalid UTF-8 becomes
// U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func jsonString(s string) json.RawMessage {
	return appendString(nil, s)
}

// compact returns raw without insignificant white space, in a new slice.
func compact(raw []byte) (json.RawMessage, error) {
	var buf bytes.Buffer
	buf.Grow(len(raw))
	if err := json.Compact(&buf, raw); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
