package inspect

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// hostileText is what an agent could put in any string it chooses (a
// request id, an event id, a field name) to act on an operator's
// terminal: clear the screen, set the title, return to the start of the
// line, reverse what follows, and a C1 CSI.
const hostileText = "X\x1b[2J\x1b]0;pwned\x07\r\u202eY\u009b31m\x7f"

// stripSGR removes the colour sequences WriteText draws with.
var stripSGR = regexp.MustCompile("\x1b\\[[0-9;]*m")

// fillStrings sets every settable string of v, through pointers, slices
// and interfaces, to s; a nil pointer gets a new value and an empty slice
// one element, so that every string a verdict can carry is set.
func fillStrings(v reflect.Value, s string, depth int) {
	if depth > 8 {
		return
	}
	switch v.Kind() {
	case reflect.String:
		if v.CanSet() {
			v.SetString(s)
		}
	case reflect.Pointer:
		if v.IsNil() && v.CanSet() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		if !v.IsNil() {
			fillStrings(v.Elem(), s, depth+1)
		}
	case reflect.Interface:
		if !v.IsNil() {
			fillStrings(v.Elem(), s, depth+1)
		}
	case reflect.Slice:
		if v.Len() == 0 && v.CanSet() {
			v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
		}
		for i := range v.Len() {
			fillStrings(v.Index(i), s, depth+1)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillStrings(v.Field(i), s, depth+1)
			}
		}
	}
}

// hostileModel is a model whose every string, and every string of a
// verdict of each kind in its history, is hostileText.
func hostileModel() *Model {
	m := &Model{Head: 40, Context: []Segment{{Class: Tail, Start: 0, End: 40}}, Backup: []Segment{{Class: Hole, Start: 3, End: 9}}}
	fillStrings(reflect.ValueOf(m).Elem(), hostileText, 0)
	// Classes pick styles: keep them real.
	m.Context[0].Class, m.Backup[0].Class = Tail, Hole
	m.Pins, m.History = nil, nil
	m.Halt.Unrecoverable = []Range{{Start: 3, End: 9}}
	when := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	for i, d := range []any{&events.CompactionAllowed{}, &events.CompactionRefused{}, &events.SpillHandle{}, &events.SessionHalted{},
		&events.EventRejected{}, &events.CompactionViolation{}, nil} {
		e := Entry{Seq: uint64(i + 1), Time: when, Data: d}
		fillStrings(reflect.ValueOf(&e).Elem(), hostileText, 0)
		m.History = append(m.History, e)
	}
	return m
}

// assertInert fails if out holds a byte that could act on a terminal:
// a C0 control other than LF (and, with colours, the SGR sequences the
// picture draws with), DEL, a C1 control or a bidi character.
func assertInert(t *testing.T, out string, sgr bool) {
	t.Helper()
	if sgr {
		out = stripSGR.ReplaceAllString(out, "")
	}
	for i, r := range out {
		bad := r < 0x20 && r != '\n' || r >= 0x7f && r <= 0x9f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 || r == 0xfffd
		if bad {
			t.Fatalf("raw %U at byte %d: %q", r, i, out[max(0, i-40):min(len(out), i+40)])
		}
	}
	assert.Contains(t, out, `X\x1b[2J\x1b]0;pwned\x07\x0d\u202eY\u009b31m\x7f`, "the escaped form shows what was sent")
}

// TestWriteTextEscapes: no string of the model, whatever it holds, reaches
// the terminal raw, in plain text, with colours, or in the SVG (which must
// also stay well-formed XML).
func TestWriteTextEscapes(t *testing.T) {
	m := hostileModel()
	var plain, colored, svg bytes.Buffer
	require.NoError(t, WriteText(&plain, m, TextOptions{}))
	require.NoError(t, WriteText(&colored, m, TextOptions{Color: true}))
	require.NoError(t, WriteSVG(&svg, m))
	t.Log(plain.String())
	assertInert(t, plain.String(), false)
	assertInert(t, colored.String(), true)
	assert.Contains(t, colored.String(), "\x1b[", "the colours are still drawn")
	assertInert(t, svg.String(), false)
	assert.Equal(t, strings.Count(plain.String(), "pwned"), strings.Count(stripSGR.ReplaceAllString(colored.String(), ""), "pwned"))
	// The header names the session, the halt's request, the pending one
	// and the spills; each history line at least its event (the cause).
	assert.Greater(t, strings.Count(plain.String(), "pwned"), 6+len(m.History))
	dec := xml.NewDecoder(&svg)
	texts := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG is not well-formed XML")
		if cd, ok := tok.(xml.CharData); ok && bytes.Contains(cd, []byte("pwned")) {
			texts++
		}
	}
	assert.Greater(t, texts, len(m.History), "the hostile strings are drawn, escaped")
}
