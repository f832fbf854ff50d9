package lazyfs

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// pageSize is the unit pending data is kept in.
const pageSize = 4096

// file is the state of one backing file (one inode) that was written or
// resized through the mount. Its handles share it.
type file struct {
	mu sync.Mutex
	// disk is the backing file's size; base is the prefix of it that is
	// still visible (a truncate not yet synced hides the rest); size is
	// the size readers see. base <= disk and base <= size.
	disk, base, size int64
	// pages holds written data not yet synced, by page index. Bytes of a
	// page past size are zero.
	pages map[int64][]byte
}

func newFile(f *os.File) (*file, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	n := st.Size()
	return &file{disk: n, base: n, size: n}, nil
}

// visibleSize is the size readers see.
func (s *file) visibleSize() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// readBacking fills dst with the visible backing data at off: what the
// backing file holds below base, zeros past it.
func (s *file) readBacking(f *os.File, dst []byte, off int64) error {
	clear(dst)
	if off >= s.base {
		return nil
	}
	n := min(int64(len(dst)), s.base-off)
	_, err := f.ReadAt(dst[:n], off)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

func (s *file) read(f *os.File, buf []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off >= s.size {
		return 0, nil
	}
	end := min(off+int64(len(buf)), s.size)
	buf = buf[:end-off]
	if len(s.pages) == 0 {
		return len(buf), s.readBacking(f, buf, off)
	}
	for pos := off; pos < end; {
		idx, in := pos/pageSize, pos%pageSize
		n := min(pageSize-in, end-pos)
		dst := buf[pos-off : pos-off+n]
		if pg, ok := s.pages[idx]; ok {
			copy(dst, pg[in:in+n])
		} else if err := s.readBacking(f, dst, pos); err != nil {
			return 0, err
		}
		pos += n
	}
	return len(buf), nil
}

func (s *file) write(f *os.File, data []byte, off int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pages == nil {
		s.pages = map[int64][]byte{}
	}
	end := off + int64(len(data))
	for pos := off; pos < end; {
		idx, in := pos/pageSize, pos%pageSize
		n := min(pageSize-in, end-pos)
		pg, ok := s.pages[idx]
		if !ok {
			pg = make([]byte, pageSize)
			if n < pageSize {
				if err := s.readBacking(f, pg, idx*pageSize); err != nil {
					return err
				}
			}
			s.pages[idx] = pg
		}
		copy(pg[in:in+n], data[pos-off:])
		pos += n
	}
	s.size = max(s.size, end)
	return nil
}

func (s *file) truncate(size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if size < s.size {
		for idx, pg := range s.pages {
			switch start := idx * pageSize; {
			case start >= size:
				delete(s.pages, idx)
			case start+pageSize > size:
				clear(pg[size-start:])
			}
		}
		s.base = min(s.base, size)
	}
	s.size = size
}

// dirty reports whether the backing file differs from what readers see.
func (s *file) dirty() bool {
	return len(s.pages) > 0 || s.base != s.disk || s.size != s.disk
}

// sync writes the pending data and size to the backing file through f and,
// with fsync, fsyncs it. It reports whether there was anything to write.
func (s *file) sync(f *os.File, fsync bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty() {
		return false, nil
	}
	if s.base < s.disk {
		if err := f.Truncate(s.base); err != nil {
			return true, err
		}
	}
	for idx, pg := range s.pages {
		start := idx * pageSize
		if n := min(pageSize, s.size-start); n > 0 {
			if _, err := f.WriteAt(pg[:n], start); err != nil {
				return true, err
			}
		}
	}
	if err := f.Truncate(s.size); err != nil {
		return true, err
	}
	if fsync {
		if err := f.Sync(); err != nil {
			return true, err
		}
	}
	s.pages, s.disk, s.base = nil, s.size, s.size
	return true, nil
}

// drop discards what was not synced and returns the bytes of pending
// pages it discarded and whether anything was.
func (s *file) drop() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lost := s.dirty()
	n := int64(len(s.pages)) * pageSize
	s.pages, s.base, s.size = nil, s.disk, s.disk
	return n, lost
}

// handle is an open file: a descriptor of the backing file (read-write
// where it may be, for syncs) and the shared state. It offers no
// passthrough descriptor, so the kernel sends every read and write here.
type handle struct {
	lfs  *FS
	f    *os.File
	st   *file
	sync bool // opened with O_SYNC or O_DSYNC: every write is synced
}

var (
	_ = (fs.FileReader)((*handle)(nil))
	_ = (fs.FileWriter)((*handle)(nil))
	_ = (fs.FileFlusher)((*handle)(nil))
	_ = (fs.FileFsyncer)((*handle)(nil))
	_ = (fs.FileReleaser)((*handle)(nil))
)

func (h *handle) Read(_ context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := h.st.read(h.f, buf, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return fuse.ReadResultData(buf[:n]), fs.OK
}

func (h *handle) Write(_ context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if err := h.st.write(h.f, data, off); err != nil {
		return 0, fs.ToErrno(err)
	}
	if h.sync {
		if errno := h.Fsync(context.Background(), 0); errno != fs.OK {
			return 0, errno
		}
	}
	return uint32(len(data)), fs.OK
}

// Flush is called on every close. It is not a sync: the data stays pending.
func (h *handle) Flush(context.Context) syscall.Errno { return fs.OK }

// Fsync (fsync and fdatasync alike) writes the file's pending data and
// size to the backing file and fsyncs it.
func (h *handle) Fsync(context.Context, uint32) syscall.Errno {
	wrote, err := h.st.sync(h.f, !h.lfs.opts.NoBackingSync)
	if err != nil {
		return fs.ToErrno(err)
	}
	h.lfs.syncs.Add(1)
	if wrote {
		h.lfs.flushed.Add(1)
	}
	return fs.OK
}

func (h *handle) Release(context.Context) syscall.Errno {
	return fs.ToErrno(h.f.Close())
}
