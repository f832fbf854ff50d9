package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// The fast paths of parseObject, compact and asString must give what the
// encoding/json paths give, on any input.

var jsonSeeds = []string{
	`{}`, ` { } `, `{"a":1}`, `{"a" : [1, {"b": "c\"}"}], "d":null}`, "{\n\t\"x\": \"y z\"\r\n}",
	`{"a":1,"a":2}`, `{"a":"\u00e9\n","b\\c":true}`, `[1,2]`, `"str"`, `{"a":}`, `{"a":1`, `{"a":1}x`,
	`{"content":"caf\u00e9 \u2028 <b>&amp;</b>","n":-1.5e3}`, `{"":0}`, `{"a":{"a":{"a":[[[]]]}}}`,
	"\"\xff\"", `"a\"b"`, `"`, `""`, `"\ud800"`,
	// strings past the short loop of skipString and validString: escapes
	// at and after it, a quote escaped right before the end, controls
	// late, a trailing backslash, no end at all
	`"` + strings.Repeat("a", 15) + `\"` + strings.Repeat("b", 40) + `\\\"c"`,
	`{"` + strings.Repeat("k", 20) + `":"` + strings.Repeat("v", 33) + `\u00e9\n` + strings.Repeat("w", 31) + `"}`,
	`"` + strings.Repeat("a", 40) + "\t" + `"`, `"` + strings.Repeat("a", 70) + "\x1f" + strings.Repeat("b", 9) + `"`,
	`"` + strings.Repeat("a", 40) + `\`, `"` + strings.Repeat("a", 40) + `\"`, `"` + strings.Repeat("a", 40),
	`"` + strings.Repeat("a", 16) + "éééé\x01" + strings.Repeat("b", 7) + `"`, `"` + strings.Repeat("a", 56) + "éééé\x01" + strings.Repeat("b", 7) + `"`,
	`"` + "\x01" + strings.Repeat("a", 7) + "éééé" + strings.Repeat("b", 20) + `"`,
	`["` + strings.Repeat(`x\"`, 30) + `", "` + strings.Repeat(`\\`, 30) + `"]`, `"` + strings.Repeat("a", 40) + `\u12"`,
}

func FuzzFastJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkFastJSON(t, raw)
	})
}

func TestFastJSONSeeds(t *testing.T) {
	for _, s := range jsonSeeds {
		checkFastJSON(t, []byte(s))
	}
}

func checkFastJSON(t *testing.T, raw []byte) {
	t.Helper()
	m1, d1, e1 := parseObject(raw)
	m2, d2, e2 := parseObjectSlow(raw)
	if !utf8.Valid(raw) {
		// A body is checked for UTF-8 first (readStructured); the fast
		// reader refuses text that is not, which encoding/json reads.
		var o object
		require.False(t, o.readBody(raw), "readBody(%q) took text that is not UTF-8", raw)
		e1, e2, m1, m2, d1, d2 = nil, nil, nil, nil, "", ""
	}
	require.Equal(t, e2 == nil, e1 == nil, "parseObject(%q) error: fast %v, slow %v", raw, e1, e2)
	require.Equal(t, d2, d1, "duplicate of %q", raw)
	require.Equal(t, len(m2), len(m1), "members of %q", raw)
	for i := range m1 {
		require.Equal(t, m2[i].name, m1[i].name)
		require.Equal(t, string(m2[i].val), string(m1[i].val))
	}
	c1, e1 := compact(raw)
	c2, e2 := compactSlow(raw)
	require.Equal(t, e2 == nil, e1 == nil, "compact(%q)", raw)
	require.True(t, bytes.Equal(c1, c2), "compact(%q): fast %q, slow %q", raw, c1, c2)
	s1, ok1 := asString(raw)
	var s2 string
	ok2 := len(bytes.TrimSpace(raw)) > 0 && bytes.TrimSpace(raw)[0] == '"' && json.Unmarshal(bytes.TrimSpace(raw), &s2) == nil
	require.Equal(t, ok2, ok1, "asString(%q)", raw)
	require.Equal(t, s2, s1, "asString(%q)", raw)
}

func FuzzValidJSON(f *testing.F) {
	for _, s := range append(jsonSeeds, `{"a" :1}`, `{"a": 1}`, `[1 ,2]`, `{ "a":1}`, `-0.5e+7`, `01`, `1.`, `[1,]`, `{"a":1,}`, `[`, `]`, `nul`, `truex`, `"\u12"`, `"\x"`, " 1 ", `[[],{}]`, "\"\t\"",
		"\"é\"", "\"\xff\"", "{\"a\xc3\":1}", "\"\xc3\\n\xa9\"", "[\""+strings.Repeat("a", 40)+"\xe2\x82\"]", "\""+strings.Repeat("é", 30)+"\"", "\xc3\xa9") {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000)))
	f.Add([]byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001)))
	f.Fuzz(func(t *testing.T, raw []byte) {
		valid, spaced := scanJSON(raw)
		require.Equal(t, json.Valid(raw) && utf8.Valid(raw), valid, "validJSON(%q)", raw)
		if valid {
			c, err := compactSlow(raw)
			require.NoError(t, err)
			require.Equal(t, !bytes.Equal(c, raw), spaced, "scanJSON(%q) says white space: %v", raw, spaced)
		}
	})
}

// TestHasControlOrHigh puts one control byte or one high byte at every
// position of ASCII buffers of every length up to 80: the word arithmetic
// must find each.
func TestHasControlOrHigh(t *testing.T) {
	for _, fill := range []byte{'a', 0x20, 0x7f} {
		for n := 0; n <= 80; n++ {
			b := bytes.Repeat([]byte{fill}, n)
			require.False(t, hasControlOrHigh(b), "fill %#x, length %d", fill, n)
			for p := range n {
				for _, c := range []byte{0x00, 0x1f, 0x80, 0xc3, 0xff} {
					b[p] = c
					require.True(t, hasControlOrHigh(b), "fill %#x, length %d, %#x at %d", fill, n, c, p)
				}
				b[p] = fill
			}
		}
	}
}

// TestHasControlByte puts one control byte at every position of buffers of
// every length up to 80, among ASCII and among high bytes, which the word
// arithmetic must not let hide it.
func TestHasControlByte(t *testing.T) {
	for _, fill := range []byte{'a', 0x20, 0x7f, 0x80, 0xc3, 0xff} {
		for n := 0; n <= 80; n++ {
			b := bytes.Repeat([]byte{fill}, n)
			require.False(t, hasControlByte(b), "fill %#x, length %d", fill, n)
			for p := range n {
				for _, c := range []byte{0x00, 0x01, 0x1f} {
					b[p] = c
					require.True(t, hasControlByte(b), "fill %#x, length %d, %#x at %d", fill, n, c, p)
				}
				b[p] = fill
			}
		}
	}
}
