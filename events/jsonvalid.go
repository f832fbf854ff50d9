package events

import (
	"bytes"
	"encoding/binary"
	"unicode/utf8"
)

// validJSON reports whether b is exactly one JSON value with optional white
// space around it, in UTF-8: what json.Valid reports and utf8.Valid too
// (FuzzValidJSON holds it to that, the nesting limit of 10000 included),
// several times faster, as it does not go through a state machine byte by
// byte. Outside strings JSON allows ASCII only, so the UTF-8 is checked in
// the strings, in the same look at their bytes as their control bytes: a
// body need not be read once more for it.
func validJSON(b []byte) bool {
	ok, _ := scanJSON(b)
	return ok
}

// scanJSON is validJSON, and also reports whether b holds white space
// outside strings (when it does not, b is already compact).
func scanJSON(b []byte) (valid, spaced bool) {
	i := skipSpace(b, 0)
	end, inner := scanValue(b, i)
	if end < 0 {
		return false, false
	}
	j := skipSpace(b, end)
	if j != len(b) {
		return false, false
	}
	return true, inner || i != 0 || j != end
}

// scanValue checks the JSON value that starts at b[i] (not white space) and
// returns the index just past it, or -1 when there is no valid value there.
// spaced reports white space inside the value, outside its strings. Nesting
// deeper than 10000 levels, counted from this value, is invalid, as in
// encoding/json.
func scanValue(b []byte, i int) (end int, spaced bool) {
	const maxDepth = 10000
	var stack []byte // '{' or '[' of each open container
	for {
		// A value starts at i.
		if i >= len(b) {
			return -1, false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(stack) >= maxDepth {
				return -1, false
			}
			var empty bool
			if i, empty = openContainer(b, i, &spaced); i >= 0 && !empty {
				stack = append(stack, c)
				continue
			}
		case c == '"':
			i = validString(b, i)
		case c == '-' || '0' <= c && c <= '9':
			i = validNumber(b, i)
		case c == 't':
			i = literal(b, i, "true")
		case c == 'f':
			i = literal(b, i, "false")
		case c == 'n':
			i = literal(b, i, "null")
		default:
			return -1, false
		}
		// After a value: close containers, or go on to the next element.
		for i >= 0 {
			if len(stack) == 0 {
				return i, spaced
			}
			j := skipSpace(b, i)
			if spaced = spaced || j != i; j >= len(b) {
				return -1, false
			}
			top := stack[len(stack)-1]
			if b[j] == ',' {
				if i = skipSpace(b, j+1); i != j+1 {
					spaced = true
				}
				if top == '{' {
					i = memberStart(b, i, &spaced)
				}
				break
			}
			if top == '{' && b[j] != '}' || top == '[' && b[j] != ']' {
				return -1, false
			}
			stack = stack[:len(stack)-1]
			i = j + 1
		}
		if i < 0 {
			return -1, false
		}
	}
}

// openContainer reads the '{' or '[' at b[i] and what follows up to the
// first element's value, whose index it returns; or, when the container is
// empty, the index just past it (empty). It returns -1 when the JSON is
// invalid, and sets *spaced when it skips white space.
func openContainer(b []byte, i int, spaced *bool) (next int, empty bool) {
	c := b[i]
	j := skipSpace(b, i+1)
	if j != i+1 {
		*spaced = true
	}
	if j < len(b) && (c == '{' && b[j] == '}' || c == '[' && b[j] == ']') {
		return j + 1, true
	}
	if c == '{' {
		j = memberStart(b, j, spaced)
	}
	return j, false
}

// memberStart reads an object member's name and colon at i and returns the
// index of its value, or -1; it sets *spaced when it skips white space.
func memberStart(b []byte, i int, spaced *bool) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = validString(b, i); i < 0 {
		return -1
	}
	j := skipSpace(b, i)
	if j >= len(b) || b[j] != ':' {
		return -1
	}
	k := skipSpace(b, j+1)
	if j != i || k != j+1 {
		*spaced = true
	}
	return k
}

// Masks for looking at 8 bytes at once (SWAR): ones has 0x01 in every byte,
// highs 0x80.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// hasControlByte reports whether b holds a byte below 0x20, looking at 32
// bytes at a time.
func hasControlByte(b []byte) bool { return controlScan(b, 0) }

// hasControlOrHigh reports whether b holds a byte below 0x20 or of 0x80 and
// above, looking at 32 bytes at a time.
func hasControlOrHigh(b []byte) bool { return controlScan(b, highs) }

// controlScan reports whether b holds a byte below 0x20, or, with m highs,
// one of 0x80 and above. In a word x, x-c borrows into the high bit of
// each byte below 0x20 (and past it only where there is one, so the answer
// is exact); a byte of 0x80 and above keeps its high bit, which ^x|m
// drops unless m counts it, and x&m counts it besides.
func controlScan(b []byte, m uint64) bool {
	const c = ones * 0x20
	word := func(x uint64) uint64 { return (x-c)&(^x|m) | x&m }
	for len(b) >= 32 {
		x0 := binary.LittleEndian.Uint64(b[0:8])
		x1 := binary.LittleEndian.Uint64(b[8:16])
		x2 := binary.LittleEndian.Uint64(b[16:24])
		x3 := binary.LittleEndian.Uint64(b[24:32])
		if (word(x0)|word(x1)|word(x2)|word(x3))&highs != 0 {
			return true
		}
		b = b[32:]
	}
	for len(b) >= 8 {
		if word(binary.LittleEndian.Uint64(b[:8]))&highs != 0 {
			return true
		}
		b = b[8:]
	}
	for _, x := range b {
		if x < 0x20 || m != 0 && x >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

// plainUTF8 reports whether b is UTF-8 without a byte below 0x20. Text that
// is all printable ASCII, as nearly all is, is told in one look at 32 bytes
// at a time; only text with a byte outside it is looked at again.
func plainUTF8(b []byte) bool {
	if !hasControlOrHigh(b) {
		return true
	}
	return !hasControlByte(b) && utf8.Valid(b)
}

// validString checks the string that starts at b[i] == '"' and returns the
// index just past it, or -1. Quotes and backslashes are found with
// bytes.IndexByte, as in skipString; the text between them must hold no
// control byte and be UTF-8 (no quote or backslash byte is part of a
// multi-byte UTF-8 sequence, so each stretch between them is checked on
// its own).
func validString(b []byte, i int) int {
	// Short plain strings, such as names, end before a call would pay off.
	for j := i + 1; j < len(b) && j <= i+16; j++ {
		if c := b[j]; c == '"' {
			return j + 1
		} else if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
	}
	i++
	q := -1 // the next quote at or after i, once found
	for i < len(b) {
		if q < i {
			k := bytes.IndexByte(b[i:], '"')
			if k < 0 {
				return -1
			}
			q = i + k
		}
		end := q
		k := bytes.IndexByte(b[i:q], '\\')
		if k >= 0 {
			end = i + k
		}
		if !plainUTF8(b[i:end]) {
			return -1
		}
		if k < 0 {
			return q + 1
		}
		i = end + 1 // the byte after the backslash
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i++
		case 'u':
			if i+4 >= len(b) {
				return -1
			}
			for _, h := range b[i+1 : i+5] {
				if _, ok := unhex(h); !ok {
					return -1
				}
			}
			i += 5
		default:
			return -1
		}
	}
	return -1
}

// validNumber checks the number that starts at i and returns the index just
// past it, or -1.
func validNumber(b []byte, i int) int {
	digits := func(i int) int {
		j := i
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
		return j
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func literal(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
