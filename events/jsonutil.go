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

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) {
		switch raw[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipValue returns the index just past the JSON value that starts at i in
// valid JSON.
func skipValue(raw []byte, i int) int {
	switch raw[i] {
	case '"':
		return skipString(raw, i)
	case '{', '[':
		depth := 0
		for i < len(raw) {
			switch raw[i] {
			case '"':
				i = skipString(raw, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(raw) { // a number, true, false or null
		switch raw[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at i. It
// finds quotes and backslashes with bytes.IndexByte, which looks at many
// bytes at once; q is the next quote once found, so that a string with many
// escapes is still read in one pass.
func skipString(raw []byte, i int) int {
	// Short plain strings, such as names, end before a call would pay off.
	for j := i + 1; j < len(raw) && j <= i+16; j++ {
		if c := raw[j]; c == '"' {
			return j + 1
		} else if c == '\\' {
			break
		}
	}
	i++
	q := -1
	for i < len(raw) {
		if q < i {
			k := bytes.IndexByte(raw[i:], '"')
			if k < 0 {
				return len(raw)
			}
			q = i + k
		}
		k := bytes.IndexByte(raw[i:q], '\\')
		if k < 0 {
			return q + 1
		}
		i += k + 2 // past the backslash and the byte it escapes
	}
	return len(raw)
}

// parseObjectSlow is parseObject with encoding/json's tokenizer, which
// names the first syntax error.
func parseObjectSlow(raw []byte) (members []member, dup string, err error) {
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
	if len(raw) >= 2 && raw[len(raw)-1] == '"' {
		if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 && bytes.IndexByte(in, '"') < 0 && plainText(in) {
			return string(in), true
		}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// plainText reports whether b is valid UTF-8 with no control characters:
// then a JSON string with b between its quotes and no escapes means b.
func plainText(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c >= utf8.RuneSelf {
			return utf8.Valid(b) && !hasControl(b)
		}
	}
	return true
}

func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// parseUint returns the value of raw if it is a plain JSON integer in
// [0, MaxOffset]; otherwise it says what is wrong with it.
func parseUint(raw json.RawMessage) (uint64, string) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == '"' || raw[0] == '{' || raw[0] == '[' || raw[0] == 't' || raw[0] == 'f' || raw[0] == 'n' {
		return 0, "is " + jsonKind(raw) + ", not a number"
	}
	if raw[0] == '-' {
		return 0, "is negative (" + Excerpt(string(raw)) + ")"
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, "is " + Excerpt(string(raw)) + ", not a plain integer (no fraction, no exponent)"
		}
	}
	v, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || v > MaxOffset {
		return 0, "is " + Excerpt(string(raw)) + ", more than the largest allowed value 2^53 (9007199254740992)"
	}
	return v, ""
}

// appendString appends s as a JSON string. It does not escape HTML, so that
// bytes read back from our own output compare equal; invalid UTF-8 becomes
// U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		// A run of bytes that stand for themselves goes in at once.
		if j := plainASCII(s, i); j > i {
			b = append(b, s[i:j]...)
			if i = j; i == len(s) {
				break
			}
		}
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

// plainASCII returns the index of the first byte at or after i that
// appendString does not copy as it is: a control, DEL, a quote, a backslash,
// or a byte of a multi-byte character.
func plainASCII[T string | []byte](s T, i int) int {
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return i
		}
	}
	return i
}

func jsonString(s string) json.RawMessage {
	return appendString(nil, s)
}

// compact returns raw without insignificant white space, in a new slice.
// Valid JSON is copied leaving out white space outside strings; anything
// else goes through json.Compact, whose error says what is wrong.
func compact(raw []byte) (json.RawMessage, error) {
	switch valid, spaced := scanJSON(raw); {
	case valid && !spaced:
		return bytes.Clone(raw), nil
	case valid:
		return compactValid(raw), nil
	}
	return compactSlow(raw)
}

// compactValid is compact for valid JSON.
func compactValid(raw []byte) json.RawMessage {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			end := skipString(raw, i)
			out = append(out, raw[i:end]...)
			i = end
		default:
			out = append(out, c)
			i++
		}
	}
	return out
}

func compactSlow(raw []byte) (json.RawMessage, error) {
	var buf bytes.Buffer
	buf.Grow(len(raw))
	if err := json.Compact(&buf, raw); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
