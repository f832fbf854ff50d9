package spill

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// Dir keeps spills as files below a directory, with the same names, format
// and digests as the object store: the offline `check` command writes here.
// Write keeps each spill's handle beside it, in "<name>.handle.json", which
// is what GetChain follows. The zero value is not usable; Path must name a
// directory. A Dir's methods may be called from any number of goroutines,
// but not for the same name at once.
type Dir struct {
	Path string
}

// Stats describes a written spill.
type Stats struct {
	Digest string
	Size   uint64
	Events uint64
}

// handleSuffix ends the name of the file that holds a spill's handle.
const handleSuffix = ".handle.json"

func (d Dir) path(name string) (string, error) {
	if name == "" || strings.Contains(name, "..") || filepath.IsAbs(name) || strings.ContainsRune(name, '\\') {
		return "", fmt.Errorf("spill: object name %q is not a relative path below the spill directory", name)
	}
	return filepath.Join(d.Path, filepath.FromSlash(name)), nil
}

// Put writes the spill called name with fill, durably: into a temporary file
// that is synced and then renamed, so a reader never sees half a spill.
func (d Dir) Put(name string, fill func(*Writer) error) (Stats, error) {
	return d.put(name, 0, fill)
}

// put is Put with a byte limit (0: none): a line past it fails fill with
// ErrQuota, and nothing is written.
func (d Dir) put(name string, limit uint64, fill func(*Writer) error) (Stats, error) {
	p, err := d.path(name)
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	err = writeAtomic(p, func(f io.Writer) error {
		w := NewWriter(f)
		w.max = limit
		if err := fill(w); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
		st = Stats{Digest: w.Digest(), Size: w.Size(), Events: w.Events()}
		return nil
	})
	return st, err
}

// writeAtomic writes the file p with fill into a temporary file beside it,
// synced and then renamed.
func writeAtomic(p string, fill func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".spill-*")
	if err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	defer f.Close()
	if err := fill(f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("spill: sync %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("spill: close %s: %w", p, err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("spill: %w", err)
	}
	return nil
}

// Write writes the spill req asks for, as Store.Write does into a bucket:
// fill must write the session's accepted events from req.FirstSeq to
// req.LastSeq (req.Events of them, else the error wraps ErrIncomplete),
// and more than req.MaxBytes (when not 0) fails with ErrQuota. The handle,
// naming bucket, is kept beside the spill, which is then part of its
// chain (see GetChain). Nothing is left of a spill that failed.
func (d Dir) Write(req ledger.SpillRequest, bucket string, fill func(*Writer) error) (events.SpillHandle, error) {
	if err := checkRequest(req); err != nil {
		return events.SpillHandle{}, err
	}
	p, err := d.path(req.Name)
	if err != nil {
		return events.SpillHandle{}, err
	}
	// The old handle goes first, so that a handle never describes other
	// bytes than its file's.
	_ = os.Remove(p + handleSuffix)
	st, err := d.put(req.Name, req.MaxBytes, func(w *Writer) error {
		if err := fill(w); err != nil {
			return err
		}
		if w.Events() != req.Events {
			return fmt.Errorf("%w: %d accepted events of session %s between sequences %d and %d were written, but the ledger counted %d",
				ErrIncomplete, w.Events(), req.Session, req.FirstSeq, req.LastSeq, req.Events)
		}
		return nil
	})
	if err != nil {
		return events.SpillHandle{}, err
	}
	h := events.SpillHandle{
		Bucket: bucket, Name: req.Name, Digest: st.Digest, Size: st.Size,
		Range: req.Range, Events: st.Events, FirstSeq: req.FirstSeq, LastSeq: req.LastSeq,
	}
	if req.Previous != "" {
		prev := req.Previous
		h.Previous = &prev
	}
	b, err := json.Marshal(h)
	if err != nil {
		return events.SpillHandle{}, fmt.Errorf("spill: %w", err)
	}
	if err := writeAtomic(p+handleSuffix, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	}); err != nil {
		_ = os.Remove(p)
		return events.SpillHandle{}, err
	}
	return h, nil
}

// Handle reads the handle Write kept beside the spill called name.
func (d Dir) Handle(name string) (events.SpillHandle, error) {
	p, err := d.path(name)
	if err != nil {
		return events.SpillHandle{}, err
	}
	b, err := os.ReadFile(p + handleSuffix)
	if err != nil {
		return events.SpillHandle{}, fmt.Errorf("spill: the handle of %s: %w", name, err)
	}
	var h events.SpillHandle
	if err := json.Unmarshal(b, &h); err != nil {
		return events.SpillHandle{}, fmt.Errorf("spill: the handle of %s: %w", name, err)
	}
	if h.Name != name {
		return events.SpillHandle{}, fmt.Errorf("spill: the handle kept with %s names %s", name, h.Name)
	}
	return h, nil
}

// GetChain copies the whole chain of the spill called name to w, oldest
// spill first, verifying each against its handle, and returns the handles
// in that order. It fails as Store.GetChain does: a missing or unreadable
// handle of a previous spill, links out of order, a loop or a chain longer
// than DefaultMaxChain wrap ErrChain, before any byte is copied; a digest
// or size that does not match wraps ErrDigestMismatch (after the bytes
// were copied). A missing name itself matches fs.ErrNotExist.
func (d Dir) GetChain(name string, w io.Writer) ([]events.SpillHandle, error) {
	walk := events.ChainWalk{Max: DefaultMaxChain, Broken: ErrChain, Get: func(_ context.Context, next string) (events.SpillHandle, string, error) {
		h, err := d.Handle(next)
		return h, "", err // a Dir keeps no session
	}}
	hs, err := walk.Walk(context.Background(), name)
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		n, err := d.Get(h.Name, h.Digest, w)
		if err != nil {
			return hs, err
		}
		if n != h.Size {
			return hs, fmt.Errorf("%w: %s holds %d bytes, its handle says %d", ErrDigestMismatch, h.Name, n, h.Size)
		}
	}
	return hs, nil
}

// Get copies the spill called name to w and verifies it against digest. On a
// mismatch the bytes were copied all the same and ErrDigestMismatch is
// returned. A missing name matches fs.ErrNotExist.
func (d Dir) Get(name, digest string, w io.Writer) (uint64, error) {
	p, err := d.path(name)
	if err != nil {
		return 0, err
	}
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("spill: %w", err)
	}
	defer f.Close()
	got, n, err := Digest(io.TeeReader(f, w))
	if err != nil {
		return n, err
	}
	if got != digest {
		return n, fmt.Errorf("%w: %s has %s, the handle says %s", ErrDigestMismatch, name, got, digest)
	}
	return n, nil
}
