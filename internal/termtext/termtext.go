package termtext

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// unsafe reports whether r must not reach a terminal as it is: the C0
// controls (ESC, BEL, CR, LF, TAB and the rest), DEL, the C1 controls
// (U+0080 to U+009F; 0x9B is CSI to some terminals), the line and
// paragraph separators, and the bidi marks, embeddings, overrides and
// isolates (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069).
func unsafe(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r == 0x2028, r == 0x2029:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Escape returns s with every character that could act on a terminal (see
// unsafe) written as a visible escape: \xNN for C0 controls and DEL,
// \uNNNN for the others, and \xNN for each byte that is not UTF-8. Text
// without such characters comes back unchanged. Backslashes are not
// escaped: the result is for reading, not for parsing back.
func Escape(s string) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafe(r) || r == utf8.RuneError && n == 1 {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// EscapeLines is Escape for text of several lines: each line is escaped,
// and the newlines between them are kept.
func EscapeLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Escape(l)
	}
	return strings.Join(lines, "\n")
}

// JSON returns a JSON document with the same meaning as doc, safe to print:
// inside strings, every character Escape would escape is written as a
// \uNNNN escape (encoding/json already escapes the C0 controls, but not
// DEL, the C1 controls or the bidi characters), and each byte that is not
// UTF-8 as \ufffd, as a JSON decoder reads it; outside strings a CR or a
// TAB becomes a space. doc must be valid JSON (json.Valid); JSON returns
// anything else escaped by Escape, and false.
func JSON(doc []byte) ([]byte, bool) {
	if !json.Valid(doc) {
		return []byte(Escape(string(doc))), false
	}
	out := make([]byte, 0, len(doc)+16)
	inString, escaped := false, false
	for i := 0; i < len(doc); {
		c := doc[i]
		if !inString {
			switch c {
			case '"':
				inString = true
			case '\r', '\t':
				c = ' '
			}
			out = append(out, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			if c == 0x7f {
				out = append(out, `\u007f`...)
			} else {
				out = append(out, c)
			}
			i++
			continue
		}
		escaped = false
		r, n := utf8.DecodeRune(doc[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			out = append(out, `\ufffd`...)
		case unsafe(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, doc[i:i+n]...)
		}
		i += n
	}
	return out, true
}
