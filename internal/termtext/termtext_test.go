package termtext

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostile holds what an agent could put in a request id to act on an
// operator's terminal.
const hostile = "r1\x1b[2J\x1b]0;pwned\x07\rX\t\n\x00\x7f\u009b31m\u202eevil\u2066\u2069\u200f\u2028 é ✓ \\x1b"

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain c1-request_0042 · é ✓ 世界", "plain c1-request_0042 · é ✓ 世界"},
		{"\x1b[2J", `\x1b[2J`},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"a\rb\nc\td", `a\x0db\x0ac\x09d`},
		{"\x00\x7f", `\x00\x7f`},
		{"\u0080\u009b\u009f\u00a0", `\u0080\u009b\u009f` + "\u00a0"},
		{"\u202aA\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u2028\u2029", `\u202aA\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u2028\u2029`},
		{"bad \xff\x9b utf8", `bad \xff\x9b utf8`},
		{`already \x1b`, `already \x1b`},
	} {
		got := Escape(tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
		assert.Equal(t, got, Escape(got), "escaping twice changes nothing")
		assertPrintable(t, got)
	}
}

func TestEscapeLines(t *testing.T) {
	got := EscapeLines("first\x1b[2J\nsecond\r\n\u202ethird")
	assert.Equal(t, "first\\x1b[2J\nsecond\\x0d\n\\u202ethird", got)
}

func TestJSON(t *testing.T) {
	doc := map[string]any{"request_id": hostile, "nested": []any{hostile, 1.5, nil, true}, hostile: "key"}
	for _, indent := range []string{"", "  "} {
		b, err := json.MarshalIndent(doc, "", indent)
		require.NoError(t, err)
		got, ok := JSON(b)
		require.True(t, ok)
		require.True(t, json.Valid(got), "%s", got)
		assertPrintable(t, strings.ReplaceAll(string(got), "\n", ""))
		var back map[string]any
		require.NoError(t, json.Unmarshal(got, &back))
		assert.Equal(t, doc, back, "the same document")
		assert.Contains(t, string(got), `\u202e`)
		assert.Contains(t, string(got), `\u009b`)
	}

	// Invalid UTF-8 in a string reads as U+FFFD, as a decoder reads it; CR
	// and TAB between tokens become spaces.
	got, ok := JSON([]byte("{\"a\":\t\"x\xffy\u007f\",\r\"b\\\"\u202e\":1}"))
	require.True(t, ok)
	assert.Equal(t, `{"a": "x\ufffdy\u007f", "b\"\u202e":1}`, string(got))
	var back map[string]any
	require.NoError(t, json.Unmarshal(got, &back))
	assert.Equal(t, "x\ufffdy\x7f", back["a"])

	// Not JSON: escaped as text.
	got, ok = JSON([]byte("not json \x1b[2J"))
	assert.False(t, ok)
	assert.Equal(t, `not json \x1b[2J`, string(got))
}

// FuzzEscape: whatever the input, the output holds no character that acts
// on a terminal and is valid UTF-8; text without such characters comes
// back as it was. JSON keeps a valid document valid and equal in meaning.
func FuzzEscape(f *testing.F) {
	f.Add(hostile)
	f.Add("plain")
	f.Add("\xff\xfe")
	f.Fuzz(func(t *testing.T, s string) {
		got := Escape(s)
		assertPrintable(t, got)
		clean := utf8.ValidString(s)
		for _, r := range s {
			clean = clean && !unsafe(r)
		}
		if clean {
			assert.Equal(t, s, got)
		}
		b, err := json.Marshal(map[string]string{"k": s})
		require.NoError(t, err)
		j, ok := JSON(b)
		require.True(t, ok)
		assertPrintable(t, string(j))
		var a, c map[string]string
		require.NoError(t, json.Unmarshal(b, &a))
		require.NoError(t, json.Unmarshal(j, &c))
		assert.Equal(t, a, c)
	})
}

// assertPrintable fails if s is not UTF-8 or holds a character that acts
// on a terminal.
func assertPrintable(t *testing.T, s string) {
	t.Helper()
	require.True(t, utf8.ValidString(s), "%q", s)
	for _, r := range s {
		require.False(t, unsafe(r), "%q holds %U", s, r)
	}
}
