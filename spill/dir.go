package spill

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Dir keeps spills as files below a directory, with the same names, format
// and digests as the object store: the offline `check` command writes here.
// The zero value is not usable; Path must name a directory.
type Dir struct {
	Path string
}

// Stats describes a written spill.
type Stats struct {
	Digest string
	Size   uint64
	Events uint64
}

func (d Dir) path(name string) (string, error) {
	if name == "" || strings.Contains(name, "..") || filepath.IsAbs(name) || strings.ContainsRune(name, '\\') {
		return "", fmt.Errorf("spill: object name %q is not a relative path below the spill directory", name)
	}
	return filepath.Join(d.Path, filepath.FromSlash(name)), nil
}

// Put writes the spill called name with fill, durably: into a temporary file
// that is synced and then renamed, so a reader never sees half a spill.
func (d Dir) Put(name string, fill func(*Writer) error) (Stats, error) {
	p, err := d.path(name)
	if err != nil {
		return Stats{}, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return Stats{}, fmt.Errorf("spill: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".spill-*")
	if err != nil {
		return Stats{}, fmt.Errorf("spill: %w", err)
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	defer f.Close()
	w := NewWriter(f)
	if err := fill(w); err != nil {
		return Stats{}, err
	}
	if err := w.Flush(); err != nil {
		return Stats{}, err
	}
	if err := f.Sync(); err != nil {
		return Stats{}, fmt.Errorf("spill: sync %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return Stats{}, fmt.Errorf("spill: close %s: %w", p, err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return Stats{}, fmt.Errorf("spill: %w", err)
	}
	return Stats{Digest: w.Digest(), Size: w.Size(), Events: w.Events()}, nil
}

// Get copies the spill called name to w and verifies it against digest. On a
// mismatch the bytes were copied all the same and ErrDigestMismatch is returned.
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
