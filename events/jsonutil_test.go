package events

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestAbbreviateKeepsCharacters: a long value is cut at a character's
// start, so that a message quoting it stays valid UTF-8.
func TestAbbreviateKeepsCharacters(t *testing.T) {
	for _, s := range []string{
		strings.Repeat("a", 39) + "é" + strings.Repeat("b", 10),
		strings.Repeat("a", 38) + "€" + strings.Repeat("b", 10),
		strings.Repeat("😀", 20),
		strings.Repeat("a", 60),
	} {
		got := abbreviate(s)
		if !utf8.ValidString(got) {
			t.Errorf("abbreviate(%q) = %q: not valid UTF-8", s, got)
		}
		if !strings.HasSuffix(got, "...") || len(got) > 43 || !strings.HasPrefix(s, strings.TrimSuffix(got, "...")) {
			t.Errorf("abbreviate(%q) = %q: want a prefix of at most 40 bytes and ...", s, got)
		}
	}
}
