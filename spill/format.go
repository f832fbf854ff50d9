package spill

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// Bucket is the object store bucket spills go to, before a prefix is applied.
const Bucket = "seamguard-spills"

// Writer writes a transcript in the spill format, one structured CloudEvent
// per line, and keeps its digest, size and line count as it goes. The zero
// value is not usable: call NewWriter. Not safe for concurrent use.
type Writer struct {
	w      lineSink
	h      hash.Hash // nil when the sink hashes (an object store put)
	size   uint64
	events uint64
	max    uint64 // the most bytes it may hold (a session's quota); 0: no limit
}

// lineSink is where a Writer's bytes go: a buffer in front of a file, or
// the object store's chunks.
type lineSink interface {
	io.Writer
	io.ByteWriter
	Flush() error
}

// NewWriter returns a Writer onto w. Call Flush when done.
func NewWriter(w io.Writer) *Writer {
	h := sha256.New()
	return &Writer{w: bufio.NewWriterSize(io.MultiWriter(w, h), 64<<10), h: h}
}

// WriteEvent appends ev as one structured JSON line.
func (w *Writer) WriteEvent(ev *events.Event) error {
	line, err := events.MarshalStructured(ev)
	if err != nil {
		return fmt.Errorf("spill: encode event %q: %w", ev.ID, err)
	}
	return w.WriteLine(line)
}

// WriteLine appends one already-encoded event line (without its newline).
// A line that would take the spill past its byte limit is not written: the
// error wraps ErrQuota.
func (w *Writer) WriteLine(line []byte) error {
	if w.max > 0 && w.size+uint64(len(line))+1 > w.max {
		return permanent(fmt.Errorf("%w: the spill may hold at most %d bytes (what is left of the session's spill quota), and its transcript needs more: %d bytes in %d events, then an event of %d",
			ErrQuota, w.max, w.size, w.events, len(line)+1))
	}
	if _, err := w.w.Write(line); err != nil {
		return fmt.Errorf("spill: write: %w", err)
	}
	if err := w.w.WriteByte('\n'); err != nil {
		return fmt.Errorf("spill: write: %w", err)
	}
	w.size += uint64(len(line)) + 1
	w.events++
	return nil
}

// Flush writes out what is buffered. Digest, Size and Events are final only
// after it.
func (w *Writer) Flush() error {
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("spill: write: %w", err)
	}
	return nil
}

// Digest is the object store's digest of what was written: "SHA-256=" and
// the URL-safe base64 of the SHA-256 sum.
func (w *Writer) Digest() string {
	if w.h == nil {
		return ""
	}
	return jetstream.GetObjectDigestValue(w.h)
}

// Size is the number of bytes written.
func (w *Writer) Size() uint64 { return w.size }

// Events is the number of lines written.
func (w *Writer) Events() uint64 { return w.events }

// Digest returns the object store digest of everything r yields, and its size.
func Digest(r io.Reader) (string, uint64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", 0, fmt.Errorf("spill: read: %w", err)
	}
	return jetstream.GetObjectDigestValue(h), uint64(n), nil
}
