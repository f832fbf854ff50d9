package events

import (
	"bytes"
	"strings"
)

// Diff names what differs between two events, their CloudEvents
// attributes and data but not the content mode they travelled in, as a
// comma-separated list ("source, data"), or "" when they are the same
// event. Publishers use it to tell a duplicate (source, id) that is the
// same event from another event under the same (source, id).
func Diff(a, b *Event) string {
	var d []string
	for _, f := range []struct {
		name string
		same bool
	}{
		{"source", a.Source == b.Source},
		{"id", a.ID == b.ID},
		{"type", a.Type == b.Type},
		{"subject", a.Subject == b.Subject},
		{"time", a.Time.Equal(b.Time)},
		{"data", bytes.Equal(a.Data, b.Data)},
	} {
		if !f.same {
			d = append(d, f.name)
		}
	}
	return strings.Join(d, ", ")
}
