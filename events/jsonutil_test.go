package events

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestQuotedValuesKeepCharacters: a message that quotes a long value cuts
// it at a character's start (with Excerpt), so that it stays valid UTF-8,
// and quotes at most MaxQuoteBytes of it.
func TestQuotedValuesKeepCharacters(t *testing.T) {
	for _, s := range []string{
		strings.Repeat("a", 39) + "é" + strings.Repeat("b", 10),
		strings.Repeat("a", 38) + "€" + strings.Repeat("b", 10),
		strings.Repeat("😀", 20),
		strings.Repeat("a", 60),
		strings.Repeat("a", MaxQuoteBytes-1) + "é" + strings.Repeat("b", 10),
		strings.Repeat("😀", 100),
	} {
		for _, attr := range []string{"specversion", "type", "subject", "time", "datacontenttype", "partitionkey"} {
			if attr == "subject" && ValidSessionID(s) {
				continue
			}
			_, err := DecodeJSON(newSpec(TypeTurnAppended, map[string]any{attr: s}, nil).structured(t), Meta{})
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%s %q: %v", attr, s, err)
			}
			if e.Code == CodeTooLarge { // the bounds quote no value
				continue
			}
			r := []rune(s)
			prefix := string(r[:min(len(r), 40)]) // at most 160 bytes
			if !utf8.ValidString(e.Message) || !strings.Contains(e.Message, prefix) {
				t.Errorf("%s %q: message %q is not valid UTF-8 or does not quote %q", attr, s, e.Message, prefix)
			}
			if len(s) > MaxQuoteBytes && strings.Contains(e.Message, s) {
				t.Errorf("%s %q: message %q quotes all of it", attr, s, e.Message)
			}
		}
	}
}
