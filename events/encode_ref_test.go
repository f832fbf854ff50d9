package events

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// The reference MarshalStructured and appendString: the code before they
// were made faster, kept verbatim, so that encode_fast_test.go can require
// the same bytes and errors from the current ones.

// marshalStructuredRef is MarshalStructured as it was.
func marshalStructuredRef(ev *Event) ([]byte, error) {
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
		c, err := compact(data)
		if err != nil {
			return nil, fmt.Errorf("%w: data is not valid JSON: %w", ErrNotEncodable, err)
		}
		data = c
	}

	b := make([]byte, 0, 256+len(data))
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendStringRef(b, ev.ID)
	b = append(b, `,"source":`...)
	b = appendStringRef(b, ev.Source)
	b = append(b, `,"type":`...)
	b = appendStringRef(b, ev.Type)
	b = append(b, `,"subject":`...)
	b = appendStringRef(b, ev.Subject)
	if !ev.Time.IsZero() {
		if y := ev.Time.Year(); y < 0 || y > 9999 {
			return nil, fmt.Errorf("%w: time %v is outside RFC 3339's years", ErrNotEncodable, ev.Time)
		}
		b = append(b, `,"time":`...)
		b = appendStringRef(b, ev.Time.Format(time.RFC3339Nano))
	}
	if ev.DataContentType != "" {
		b = append(b, `,"datacontenttype":`...)
		b = appendStringRef(b, ev.DataContentType)
	}
	names := make([]string, 0, len(ev.Extensions))
	for name := range ev.Extensions {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !validAttrName(name) || isCoreAttr(name) || name == "data" {
			return nil, fmt.Errorf("%w: %q is not an extension attribute name", ErrNotEncodable, name)
		}
		val, err := compact(ev.Extensions[name])
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
		b = appendStringRef(b, name)
		b = append(b, ':')
		b = append(b, val...)
	}
	if data != nil {
		b = append(b, `,"data":`...)
		b = append(b, data...)
	}
	return append(b, '}'), nil
}

// appendStringRef is appendString as it was.
func appendStringRef(b []byte, s string) []byte {
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
