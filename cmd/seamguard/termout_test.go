package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJSONLogsEscape: serve's JSON log lines carry no raw control
// character of what they quote (a session id from the wire, an error's
// text), DEL, C1 and bidi controls included, which encoding/json leaves raw;
// the line stays valid JSON.
func TestJSONLogsEscape(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", "info")
	require.NoError(t, err)
	hostile := "a\x1b[2J\x7f\u0085\u202e b"
	log.Info("session stuck", "session", hostile, "err", errors.New("bad "+hostile))
	line := buf.Bytes()
	var m map[string]any
	require.NoError(t, json.Unmarshal(line, &m), "%s", line)
	for _, r := range string(line) {
		require.False(t, r < 0x20 && r != '\n' || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x202e, "raw %U in %q", r, line)
	}
	require.Contains(t, m["session"], `\x1b[2J`)
	require.Contains(t, m["err"], `\u202e`)
}
