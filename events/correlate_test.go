package events

import (
	"strings"
	"testing"
)

func TestReadableID(t *testing.T) {
	long := strings.Repeat("x", MaxIDBytes+1)
	for _, c := range []struct {
		name    string
		headers map[string][]string
		data    string
		want    string
	}{
		{"binary header", map[string][]string{"Ce-Id": {"a%20b"}}, `not json`, "a b"},
		{"binary header wins over the body", map[string][]string{"ce-id": {"h"}}, `{"id":"b"}`, "h"},
		{"binary header too long", map[string][]string{"ce-id": {long}}, `{"id":"b"}`, ""},
		{"binary header bad escape", map[string][]string{"ce-id": {"%zz"}}, ``, ""},
		{"structured body", nil, `{"specversion":"2.0","id":"ev-1","data":{"request_id":5}}`, "ev-1"},
		{"structured id escaped", nil, `{"id":"ev\u002d2"}`, "ev-2"},
		{"structured id too long", nil, `{"id":"` + long + `"}`, ""},
		{"structured id not a string", nil, `{"id":42}`, ""},
		{"structured id empty", nil, `{"id":""}`, ""},
		{"not json", nil, `{"id":"x"`, ""},
		{"no body", nil, ``, ""},
	} {
		if got := ReadableID(c.headers, []byte(c.data)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
