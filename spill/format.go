package spill

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// Errors of the spill package.
var (
	ErrDigestMismatch = errors.New("spill: digest mismatch")
	ErrIncomplete     = errors.New("spill: transcript incomplete")
	// ErrUnavailable means the transcript could not be read now although
	// nothing shows it is gone (a lagging replica, a leader election): a
	// caller should try again later rather than give the session up.
	ErrUnavailable = errors.New("spill: transcript unavailable for now")
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
func (w *Writer) WriteLine(line []byte) error {
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
