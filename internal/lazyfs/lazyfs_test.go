package lazyfs

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// mountT mounts a lazy filesystem for the test and unmounts it when the
// test ends. It skips where mounting is not possible.
func mountT(t *testing.T) *FS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("lazyfs mounts a FUSE filesystem: needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("lazyfs needs /dev/fuse: %v", err)
	}
	dir, backing := t.TempDir(), t.TempDir()
	l, err := Mount(dir, backing, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return l
}

// powerCut drops what was not synced, unmounts and mounts the same backing
// directory again, as a machine coming back up would.
func powerCut(t *testing.T, l *FS) *FS {
	t.Helper()
	if _, _, err := l.DropUnsynced(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unmount(); err != nil {
		t.Fatal(err)
	}
	l2, err := Mount(l.Dir(), l.Backing(), l.Options())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Unmount() })
	return l2
}

func write(t *testing.T, path string, data []byte, off int64, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUnsyncedWriteIsLost(t *testing.T) {
	l := mountT(t)
	p := filepath.Join(l.Dir(), "a")
	write(t, p, []byte("not synced"), 0, false)
	// Reads see it; the backing directory does not have it.
	if got := read(t, p); string(got) != "not synced" {
		t.Fatalf("read before the drop: %q", got)
	}
	if got := read(t, filepath.Join(l.Backing(), "a")); len(got) != 0 {
		t.Fatalf("backing file holds %q before any sync", got)
	}
	files, _, err := l.DropUnsynced()
	if err != nil || files != 1 {
		t.Fatalf("DropUnsynced: %d files, %v; want 1", files, err)
	}
	l = powerCut(t, l)
	// The file was created (metadata is eager), its data is gone.
	if got := read(t, filepath.Join(l.Dir(), "a")); len(got) != 0 {
		t.Fatalf("after the power cut: %q, want an empty file", got)
	}
}

func TestSyncedWriteSurvives(t *testing.T) {
	l := mountT(t)
	p := filepath.Join(l.Dir(), "a")
	write(t, p, []byte("synced"), 0, true)
	if got := read(t, filepath.Join(l.Backing(), "a")); string(got) != "synced" {
		t.Fatalf("backing file after fsync: %q", got)
	}
	l = powerCut(t, l)
	if got := read(t, filepath.Join(l.Dir(), "a")); string(got) != "synced" {
		t.Fatalf("after the power cut: %q", got)
	}
	if s := l.Stats(); s.Syncs != 0 {
		t.Errorf("a fresh mount counts %d syncs", s.Syncs)
	}
}

func TestPartlySyncedFileKeepsItsSyncedPart(t *testing.T) {
	l := mountT(t)
	p := filepath.Join(l.Dir(), "log")
	synced := bytes.Repeat([]byte("0123456789"), 1000) // crosses pages
	write(t, p, synced, 0, true)
	// Overwrite across a page boundary and append; close without a sync.
	write(t, p, bytes.Repeat([]byte("x"), 3000), 3000, false)
	write(t, p, bytes.Repeat([]byte("y"), 9000), int64(len(synced)), false)
	want := append(bytes.Clone(synced), bytes.Repeat([]byte("y"), 9000)...)
	copy(want[3000:], bytes.Repeat([]byte("x"), 3000))
	if got := read(t, p); !bytes.Equal(got, want) {
		t.Fatalf("read before the drop: %d bytes, not what was written", len(got))
	}
	if s := l.Stats(); s.Pending == 0 || s.Flushed != 1 {
		t.Errorf("stats %+v: want pending data and one flushing sync", s)
	}
	l = powerCut(t, l)
	if got := read(t, filepath.Join(l.Dir(), "log")); !bytes.Equal(got, synced) {
		t.Fatalf("after the power cut: %d bytes, want exactly the %d synced", len(got), len(synced))
	}
}

func TestCloseIsNotASync(t *testing.T) {
	l := mountT(t)
	p := filepath.Join(l.Dir(), "a")
	if err := os.WriteFile(p, []byte("written and closed"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another handle's fsync syncs the file, whoever wrote it.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(l.Dir(), "b"), []byte("closed only"), 0o644); err != nil {
		t.Fatal(err)
	}
	l = powerCut(t, l)
	if got := read(t, filepath.Join(l.Dir(), "a")); string(got) != "written and closed" {
		t.Errorf("a, synced through another handle: %q", got)
	}
	if got := read(t, filepath.Join(l.Dir(), "b")); len(got) != 0 {
		t.Errorf("b, closed without a sync: %q, want empty", got)
	}
}

func TestOSyncWritesAreSynced(t *testing.T) {
	l := mountT(t)
	p := filepath.Join(l.Dir(), "a")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_SYNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("o_sync")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l = powerCut(t, l)
	if got := read(t, filepath.Join(l.Dir(), "a")); string(got) != "o_sync" {
		t.Fatalf("after the power cut: %q", got)
	}
}

func TestTruncateIsLazy(t *testing.T) {
	l := mountT(t)
	p := filepath.Join(l.Dir(), "a")
	data := bytes.Repeat([]byte("abcdefgh"), 2000)
	write(t, p, data, 0, true)
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	// Grow it again: the bytes between are zeros, not the old data.
	write(t, p, []byte("z"), 9000, false)
	want := make([]byte, 9001)
	copy(want, data[:100])
	want[9000] = 'z'
	if got := read(t, p); !bytes.Equal(got, want) {
		t.Fatalf("read after truncate and write: %d bytes, not as written", len(got))
	}
	if fi, err := os.Stat(p); err != nil || fi.Size() != 9001 {
		t.Fatalf("stat: %v, %v; want size 9001", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(l.Backing(), "a")); err != nil || fi.Size() != int64(len(data)) {
		t.Fatalf("backing file: %v, %v; want it untouched", fi, err)
	}
	l = powerCut(t, l)
	p = filepath.Join(l.Dir(), "a")
	if got := read(t, p); !bytes.Equal(got, data) {
		t.Fatalf("after the power cut: %d bytes, want the %d synced", len(got), len(data))
	}
	// A synced truncate stays.
	f, err := os.OpenFile(p, os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l = powerCut(t, l)
	if got := read(t, filepath.Join(l.Dir(), "a")); len(got) != 0 {
		t.Fatalf("after a synced O_TRUNC and a power cut: %d bytes", len(got))
	}
}

func TestMetadataIsEager(t *testing.T) {
	l := mountT(t)
	d := filepath.Join(l.Dir(), "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// The write-to-temp-and-rename pattern without a sync: the name
	// survives, the data does not.
	write(t, filepath.Join(d, "old"), []byte("old, synced"), 0, true)
	write(t, filepath.Join(d, "tmp"), []byte("new, not synced"), 0, false)
	if err := os.Rename(filepath.Join(d, "tmp"), filepath.Join(d, "old")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(d, "gone"), []byte("x"), 0, true)
	if err := os.Remove(filepath.Join(d, "gone")); err != nil {
		t.Fatal(err)
	}
	l = powerCut(t, l)
	entries, err := os.ReadDir(filepath.Join(l.Dir(), "d"))
	if err != nil || len(entries) != 1 || entries[0].Name() != "old" {
		t.Fatalf("directory after the power cut: %v, %v; want only old", entries, err)
	}
	if got := read(t, filepath.Join(l.Dir(), "d", "old")); len(got) != 0 {
		t.Fatalf("renamed file: %q, want empty (its data was never synced)", got)
	}
}

// TestAgainstOracle plays random writes, truncates, syncs and power cuts on
// a few files and checks every read against a brute-force model: the bytes
// readers should see and the bytes a power cut keeps.
func TestAgainstOracle(t *testing.T) {
	l := mountT(t)
	r := rand.New(rand.NewPCG(15, 2))
	const files = 3
	visible, durable := make([][]byte, files), make([][]byte, files)
	handles := make([]*os.File, files)
	open := func() {
		for i := range handles {
			f, err := os.OpenFile(filepath.Join(l.Dir(), string(rune('a'+i))), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			handles[i] = f
		}
	}
	closeAll := func() {
		for _, f := range handles {
			f.Close()
		}
	}
	open()
	for step := range 600 {
		i := r.IntN(files)
		f := handles[i]
		switch op := r.IntN(20); {
		case op < 11:
			off := r.IntN(3 * pageSize)
			if len(visible[i]) > 0 && r.IntN(2) == 0 {
				off = len(visible[i]) // append
			}
			data := make([]byte, 1+r.IntN(2*pageSize))
			for k := range data {
				data[k] = byte(r.IntN(256))
			}
			if _, err := f.WriteAt(data, int64(off)); err != nil {
				t.Fatal(err)
			}
			if need := off + len(data); need > len(visible[i]) {
				visible[i] = append(visible[i], make([]byte, need-len(visible[i]))...)
			}
			copy(visible[i][off:], data)
		case op < 14:
			size := r.IntN(4 * pageSize)
			if err := f.Truncate(int64(size)); err != nil {
				t.Fatal(err)
			}
			if size <= len(visible[i]) {
				visible[i] = visible[i][:size]
			} else {
				visible[i] = append(visible[i], make([]byte, size-len(visible[i]))...)
			}
		case op < 18:
			if err := syscall.Fdatasync(int(f.Fd())); err != nil {
				t.Fatal(err)
			}
			durable[i] = bytes.Clone(visible[i])
		case op < 19:
			closeAll()
			l = powerCut(t, l)
			for k := range visible {
				visible[k] = bytes.Clone(durable[k])
			}
			open()
		default:
			// Reads through a handle opened earlier, at an offset.
			buf := make([]byte, 5000)
			off := r.IntN(2 * pageSize)
			n, _ := f.ReadAt(buf, int64(off))
			var want []byte
			if off < len(visible[i]) {
				want = visible[i][off:min(off+len(buf), len(visible[i]))]
			}
			if !bytes.Equal(buf[:n], want) {
				t.Fatalf("step %d: file %d read at %d: %d bytes differ from the model's %d", step, i, off, n, len(want))
			}
		}
		got := read(t, f.Name())
		if !bytes.Equal(got, visible[i]) {
			t.Fatalf("step %d: file %d reads %d bytes that differ from the model's %d", step, i, len(got), len(visible[i]))
		}
	}
	closeAll()
}
