package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostileRequest is a request id an agent chose to act on the operator's
// terminal: clear the screen, set the window title, go back to the start
// of the line, and reverse what follows.
const hostileRequest = "r\x1b[2J\x1b]0;pwned\x07\r\u202eX"

// hostileLines is a session whose event ids, source, request id and an
// attribute name (which a rejection names as its field) hold control
// characters; the request is refused, spilled, and the two odd events
// rejected.
func hostileLines() []string {
	ev := func(id, typ, extra, data string) string {
		idj, _ := json.Marshal(id)
		typj, _ := json.Marshal("io.seamguard." + typ)
		return fmt.Sprintf(`{"specversion":"1.0","id":%s,"source":"urn:evil\u001b]0;pwned\u0007","type":%s,"subject":"hostile"%s,"data":%s}`, idj, typj, extra, data)
	}
	req, _ := json.Marshal(hostileRequest)
	return []string{
		ev("h-1\x1b[2J", "session.opened", "", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`),
		ev("h-2\r\u202e", "turn.appended", "", `{"offset":0,"size":1}`),
		ev("h-3", "turn.appended", "", `{"offset":1,"size":1}`),
		ev("h-4", "turn.appended", "", `{"offset":2,"size":1}`),
		ev("h-5\u009b2J", "compaction.requested", "", fmt.Sprintf(`{"request_id":%s,"summarizer_input":{"start":0,"end":1},"summary_range":{"start":0,"end":1},"tail_start":1}`, req)),
		ev("h-6", "turn.appended", `,"bad\u001b[2J":"x"`, `{"offset":3,"size":1}`),
		ev("h-7\x1b]0;pwned\x07", "turn.appended\u001b[2J", "", `{"offset":3,"size":1}`),
	}
}

// assertNoRaw fails if out holds anything that could act on a terminal:
// a C0 control but LF, DEL, a C1 control, a bidi override or isolate, or a
// byte that is not UTF-8.
func assertNoRaw(t *testing.T, what, out string) {
	t.Helper()
	require.True(t, utf8.ValidString(out), "%s: not UTF-8", what)
	for i, r := range out {
		if r < 0x20 && r != '\n' || r >= 0x7f && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			t.Fatalf("%s: raw %U at byte %d: %q", what, r, i, out[max(0, i-60):min(len(out), i+60)])
		}
	}
}

// TestTerminalInjection runs a session whose ids, source, request id and a
// field name hold ESC [ 2 J, an OSC title sequence, CR, a C1 CSI and a
// bidi override through a processor, then every command that prints it:
// inspect (text, colours, SVG, JSON), watch (text, JSON), replay and check.
// None prints a raw control character; the text shows the escaped form,
// the SVG is well-formed XML, and the JSON still says the same.
func TestTerminalInjection(t *testing.T) {
	d := startDeployment(t)
	lines := hostileLines()
	d.publish(t, lines)
	escapedRequest := `r\x1b[2J\x1b]0;pwned\x07\x0d\u202eX`

	svg := filepath.Join(t.TempDir(), "hostile.svg")
	code, text, errs := runCLI(t, "", "inspect", "hostile", "--nats-url", d.url, "--svg", svg)
	require.Equal(t, 0, code, errs)
	t.Log(text)
	assertNoRaw(t, "inspect", text)
	assertNoRaw(t, "inspect's stderr", errs)
	for _, want := range []string{escapedRequest, `(event h-5\u009b2J)`, `at bad\x1b[2J`, `the member "bad\x1b[2J"`, `(event h-7\x1b]0;pwned\x07)`} {
		assert.Contains(t, text, want)
	}

	code, colored, errs := runCLI(t, "", "inspect", "hostile", "--nats-url", d.url, "--color", "always")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, colored, "\x1b[", "the colours are drawn")
	assertNoRaw(t, "inspect --color always, its colours taken out", stripANSI.ReplaceAllString(colored, ""))
	assert.Equal(t, text, stripANSI.ReplaceAllString(colored, ""))

	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	assertNoRaw(t, "inspect --svg", string(b))
	assert.Contains(t, string(b), escapedRequest)
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG is not well-formed XML")
	}

	code, js, errs := runCLI(t, "", "inspect", "hostile", "--nats-url", d.url, "--json")
	require.Equal(t, 0, code, errs)
	assertNoRaw(t, "inspect --json", js)
	var m struct {
		History []struct {
			CausationID string `json:"causation_id"`
			Data        struct {
				RequestID string `json:"request_id"`
				Field     string `json:"field"`
			} `json:"data"`
		} `json:"history"`
	}
	require.NoError(t, json.Unmarshal([]byte(js), &m))
	var requests, causes, fields []string
	for _, e := range m.History {
		requests, causes, fields = append(requests, e.Data.RequestID), append(causes, e.CausationID), append(fields, e.Data.Field)
	}
	assert.Contains(t, requests, hostileRequest, "the JSON says the same as the events")
	assert.Contains(t, causes, "h-5\u009b2J")
	assert.Contains(t, fields, "bad\x1b[2J")
	n := len(m.History)
	require.GreaterOrEqual(t, n, 4, "a spill, a refusal and two rejections")

	code, out, errs := runCLI(t, "", "watch", "--nats-url", d.url, "--all", "--session", "hostile", "--max", fmt.Sprint(n))
	require.Equal(t, 0, code, errs)
	assertNoRaw(t, "watch", out)
	assert.Len(t, strings.Split(strings.TrimSpace(out), "\n"), n, "one line per verdict: a newline in an id does not start another")
	assert.Contains(t, out, escapedRequest)
	assert.Contains(t, out, `malformed bad\x1b[2J`)

	code, out, errs = runCLI(t, "", "watch", "--nats-url", d.url, "--all", "--session", "hostile", "--max", fmt.Sprint(n), "--json")
	require.Equal(t, 0, code, errs)
	assertNoRaw(t, "watch --json", out)
	found := false
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var v struct {
			Data struct {
				RequestID string `json:"request_id"`
			}
		}
		require.NoError(t, json.Unmarshal([]byte(l), &v), l)
		found = found || v.Data.RequestID == hostileRequest
	}
	assert.True(t, found, "watch --json says the same as the verdict")

	code, out, errs = runCLI(t, "", "replay", "--nats-url", d.url, "--session", "hostile")
	require.Equal(t, 0, code, "%s%s", out, errs)
	assertNoRaw(t, "replay", out+errs)

	code, out, errs = runCLI(t, strings.Join(lines, "\n")+"\n", "check", "--spill-dir", t.TempDir())
	require.Equal(t, 0, code, errs)
	assertNoRaw(t, "check", out+errs)
	assert.Contains(t, out, `"request_id":"r\u001b[2J\u001b]0;pwned\u0007\r\u202eX"`)
}
