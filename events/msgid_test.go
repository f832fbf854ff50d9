package events_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

var updateMsgIDs = flag.Bool("update-msgids", false, "rewrite testdata/msgid.json from MsgID")

// msgIDCase is one line of testdata/msgid.json, which the TypeScript
// client's tests read too: both derive the same message ids.
type msgIDCase struct {
	Source string `json:"source"`
	ID     string `json:"id"`
	MsgID  string `json:"msgid"`
}

func TestMsgIDGolden(t *testing.T) {
	path := filepath.Join("testdata", "msgid.json")
	if *updateMsgIDs {
		inputs := [][2]string{
			{"urn:agent:a", "1"},
			{"urn:agent:b", "1"},
			{"urn:agent:a", "2"},
			{"a:b", "c"},
			{"a", "b:c"},
			{"", ""},
			{"https://example.com/agents/é", "id with spaces \"quoted\" 100%"},
			{strings.Repeat("s", 256), strings.Repeat("i", 256)},
		}
		var cases []msgIDCase
		for _, in := range inputs {
			cases = append(cases, msgIDCase{Source: in[0], ID: in[1], MsgID: events.MsgID(in[0], in[1])})
		}
		raw, err := json.MarshalIndent(cases, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, append(raw, '\n'), 0o644))
	}
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var cases []msgIDCase
	require.NoError(t, json.Unmarshal(raw, &cases))
	require.NotEmpty(t, cases)
	for _, c := range cases {
		assert.Equal(t, c.MsgID, events.MsgID(c.Source, c.ID), "source %q id %q", c.Source, c.ID)
	}
}

// TestMsgID: deterministic, one per (source, id), unambiguous where the
// separator could shift, and always a short printable header value.
func TestMsgID(t *testing.T) {
	a1 := events.MsgID("urn:agent:a", "1")
	assert.Equal(t, a1, events.MsgID("urn:agent:a", "1"))
	assert.NotEqual(t, a1, events.MsgID("urn:agent:b", "1"), "the same id from another source")
	assert.NotEqual(t, a1, events.MsgID("urn:agent:a", "2"))
	assert.NotEqual(t, events.MsgID("a:b", "c"), events.MsgID("a", "b:c"))
	assert.NotEqual(t, events.MsgID("a,1:b", ""), events.MsgID("a", "b"))
	assert.NotEqual(t, events.MsgID("ab", ""), events.MsgID("a", "b"))
	// sha256("11:urn:agent:a,1:1,"), as sha256sum prints it.
	assert.Equal(t, "ce1-7dbf34753ce10695baf67e73fa9663f526679f1585aaf4ee86df690df85cd247", a1)
	for _, in := range [][2]string{{"", ""}, {strings.Repeat("\xff", 256), "\r\n" + strings.Repeat(" ", 254)}} {
		got := events.MsgID(in[0], in[1])
		assert.Len(t, got, 68)
		assert.False(t, strings.ContainsFunc(got, func(r rune) bool { return r <= ' ' || r >= 0x7f }), got)
	}
}
