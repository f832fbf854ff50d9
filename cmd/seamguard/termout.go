package main

import (
	"bytes"
	"encoding/json"
	"io"

	"github.com/seamguard/seamguard/internal/termtext"
)

// What seamguard prints for a terminal holds strings from the wire (request
// ids, event ids, sources, field names, messages): text goes through
// termtext.Escape as it is formatted, JSON through termtext.JSON, which
// keeps the document's meaning. Transcripts (spill get) are data and are
// written as they are.

// writeJSON prints v as indented JSON, with every string safe for a
// terminal (encoding/json escapes the C0 controls, but not DEL, the C1
// controls or the bidi characters).
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b, _ := termtext.JSON(buf.Bytes())
	_, err := w.Write(b)
	return err
}

// jsonLines passes JSON Lines to w, each line through termtext.JSON. It
// keeps a line that does not end yet until the next Write or Flush.
type jsonLines struct {
	w    io.Writer
	line []byte
}

func (j *jsonLines) Write(p []byte) (int, error) {
	j.line = append(j.line, p...)
	for {
		i := bytes.IndexByte(j.line, '\n')
		if i < 0 {
			return len(p), nil
		}
		safe, _ := termtext.JSON(j.line[:i])
		if _, err := j.w.Write(append(safe, '\n')); err != nil {
			return 0, err
		}
		j.line = j.line[i+1:]
	}
}

// Flush writes what is left of an unfinished last line.
func (j *jsonLines) Flush() error {
	if len(j.line) == 0 {
		return nil
	}
	safe, _ := termtext.JSON(j.line)
	j.line = nil
	_, err := j.w.Write(safe)
	return err
}
