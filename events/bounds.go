package events

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Excerpt returns s as an output may quote it: s itself when it is at most
// MaxQuoteBytes long, else its longest prefix of at most MaxQuoteBytes bytes
// that ends on a UTF-8 boundary, followed by a marker saying how many bytes
// were left out, as in "abc…[599744 more bytes]". Every message and output
// field that echoes an input value goes through it.
func Excerpt(s string) string {
	if len(s) <= MaxQuoteBytes {
		return s
	}
	n := MaxQuoteBytes
	// Step back over at most three continuation bytes to a rune's start.
	for k := 0; k < utf8.UTFMax-1 && n > 0 && !utf8.RuneStart(s[n]); k++ {
		n--
	}
	return s[:n] + "…[" + strconv.Itoa(len(s)-n) + " more bytes]"
}

// Bounds on what an event.rejected echoes of its input's NATS headers.
const (
	// MaxEchoHeaders is the most header names echoed.
	MaxEchoHeaders = 32
	// MaxEchoValues is the most values echoed of one header name.
	MaxEchoValues = 4
	// MaxEchoBytes bounds the echoed names and values, counted as JSON
	// strings (escapes included).
	MaxEchoBytes = 16 << 10
)

// echoFirst are the headers that identify an input, echoed before any other.
var echoFirst = []string{"nats-msg-id", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-specversion", "content-type"}

// EchoHeaders returns what an event.rejected shows of an input's headers, so
// that no input can make a rejection large: every name and value through
// Excerpt, at most MaxEchoValues values of a name, at most MaxEchoHeaders
// names, and at most MaxEchoBytes in all. The headers that identify the
// input (Nats-Msg-Id, then ce-id, ce-source, ce-type, ce-subject,
// ce-specversion, Content-Type, in any case) come first, then the others in
// byte order of their names; what does not fit is left out, and omitted
// counts the values left out (a name with no values counts as one). The
// result is never nil and shares no memory with h.
func EchoHeaders(h map[string][]string) (echo map[string][]string, omitted int) {
	echo = make(map[string][]string, min(len(h), MaxEchoHeaders))
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	rank := func(k string) int {
		lk := strings.ToLower(k)
		if i := slices.Index(echoFirst, lk); i >= 0 {
			return i
		}
		return len(echoFirst)
	}
	slices.SortFunc(names, func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	budget := MaxEchoBytes
	for _, k := range names {
		vs := h[k]
		name := Excerpt(k)
		cost := jsonLen(name)
		_, merged := echo[name] // two long names may share an excerpt
		if (!merged && len(echo) == MaxEchoHeaders) || cost > budget {
			omitted += max(len(vs), 1)
			continue
		}
		if !merged {
			budget -= cost
			echo[name] = []string{}
		}
		for i, v := range vs {
			v = Excerpt(v)
			if c := jsonLen(v); len(echo[name]) < MaxEchoValues && c <= budget {
				budget -= c
				echo[name] = append(echo[name], v)
				continue
			}
			omitted += len(vs) - i
			break
		}
	}
	return echo, omitted
}

// jsonLen is len(appendString(nil, s)) without building it.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20 || c == 0x7f:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1, r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}
