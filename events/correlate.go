package events

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// ReadableID returns the CloudEvents id of an input that could not be
// decoded, where it can still be read: the ce-id header (binary mode, any
// case, percent-decoded) or the "id" member of a JSON object body
// (structured mode). It returns "" when there is none, or when it is not a
// string of 1 to MaxIDBytes bytes of valid UTF-8 (a rejection must never
// carry more of an input than its bounds allow). Rejections carry it as
// their causationid, so that the agent that sent the input can match them.
func ReadableID(headers map[string][]string, data []byte) string {
	for name, vals := range headers {
		if !strings.EqualFold(name, "ce-id") || len(vals) == 0 {
			continue
		}
		if id, bad := percentDecode(vals[0]); bad == "" && plausibleID(id) {
			return id
		}
		return ""
	}
	var body struct {
		ID json.RawMessage `json:"id"`
	}
	if len(data) == 0 || data[0] != '{' || json.Unmarshal(data, &body) != nil || len(body.ID) == 0 || body.ID[0] != '"' {
		return ""
	}
	var id string
	if json.Unmarshal(body.ID, &id) != nil || !plausibleID(id) {
		return ""
	}
	return id
}

func plausibleID(id string) bool {
	return id != "" && len(id) <= MaxIDBytes && utf8.ValidString(id)
}
