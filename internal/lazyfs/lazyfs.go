package lazyfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrNotMounted is returned by DropUnsynced after Unmount.
var ErrNotMounted = errors.New("lazyfs: not mounted")

// FS is a mounted lazy filesystem. Its zero value is not usable; Mount
// makes one.
type FS struct {
	dir, backing string
	opts         Options
	server       *fuse.Server

	mu      sync.Mutex
	files   map[key]*file // every file written, resized or opened through the mount
	mounted bool

	syncs   atomic.Int64 // fsync and fdatasync calls
	flushed atomic.Int64 // of those, the ones that had pending data to write
}

// Stats counts what the filesystem was asked to do.
type Stats struct {
	Syncs   int64 // fsync and fdatasync calls (and O_SYNC writes)
	Flushed int64 // syncs that wrote pending data to the backing directory
	Pending int64 // bytes of pending data now (whole pages)
}

// Options tune a mount. The zero value is the model the package describes.
type Options struct {
	// NoBackingSync leaves out the fsync of the backing file when a sync
	// writes to it. The power cut this package makes loses only what it
	// holds in memory, so what reached the backing file survives it
	// either way; leaving the fsync out makes a server that syncs every
	// write much faster, at the price of what a real power cut of the
	// machine running the test would lose.
	NoBackingSync bool
}

// Mount mounts a lazy filesystem over backing at dir (both must be
// directories) and returns once it serves. It needs root: it mounts with
// mount(2), without fusermount.
func Mount(dir, backing string, o Options) (*FS, error) {
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: backing directory: %w", err)
	}
	l := &FS{dir: dir, backing: backing, opts: o, files: map[key]*file{}}
	zero := time.Duration(0)
	opts := &fs.Options{
		// No kernel caching of names or attributes: sizes change
		// under the kernel when the power is cut.
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true,
			FsName:            backing,
			Name:              "lazyfs",
		},
	}
	server, err := fs.Mount(dir, &node{LoopbackNode: root.(*fs.LoopbackNode), lfs: l}, opts)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: mount %s on %s: %w", backing, dir, err)
	}
	l.server, l.mounted = server, true
	closeFuseOnExec()
	return l, nil
}

// closeFuseOnExec marks this process's descriptors of /dev/fuse
// close-on-exec. go-fuse opens the device without O_CLOEXEC when it mounts
// by itself, so every process started afterwards would hold every mount's
// connection open, and an unmount would wait for the last of them to exit.
func closeFuseOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && target == "/dev/fuse" {
			syscall.CloseOnExec(fd)
		}
	}
}

// Options returns the options it was mounted with.
func (l *FS) Options() Options { return l.opts }

// Dir is where the filesystem is mounted.
func (l *FS) Dir() string { return l.dir }

// Backing is the directory it stores what was synced in.
func (l *FS) Backing() string { return l.backing }

// state returns the state of the file k, made from f if there is none;
// fresh discards any there is (a new file on a reused inode).
func (l *FS) state(k key, f *os.File, fresh bool) (*file, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st, ok := l.files[k]; ok && !fresh {
		return st, nil
	}
	st, err := newFile(f)
	if err != nil {
		return nil, err
	}
	l.files[k] = st
	return st, nil
}

// size is the size readers see of the file k, if it has a state.
func (l *FS) size(k key) (uint64, bool) {
	l.mu.Lock()
	st, ok := l.files[k]
	l.mu.Unlock()
	if !ok {
		return 0, false
	}
	return uint64(st.visibleSize()), true
}

// DropUnsynced is the power cut: every write and size change not synced
// is discarded, in every file at once. It returns how many files lost
// something and the bytes of pending data discarded (whole pages). Stop
// the processes writing to the mount first.
func (l *FS) DropUnsynced() (files int, bytes int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mounted {
		return 0, 0, ErrNotMounted
	}
	for _, st := range l.files {
		n, lost := st.drop()
		bytes += n
		if lost {
			files++
		}
	}
	return files, bytes, nil
}

// Stats returns the counts so far.
func (l *FS) Stats() Stats {
	s := Stats{Syncs: l.syncs.Load(), Flushed: l.flushed.Load()}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, st := range l.files {
		st.mu.Lock()
		s.Pending += int64(len(st.pages)) * pageSize
		st.mu.Unlock()
	}
	return s
}

// Unmount unmounts the filesystem, detaching it lazily (umount -l) when it
// is busy. It does not sync: data not synced is gone with the mount, as if
// the power had been cut. It waits up to 5s for the server to stop (the
// kernel may hold the connection a while after the unmount); the mount is
// gone from the directory either way. Calling it again does nothing.
func (l *FS) Unmount() error {
	l.mu.Lock()
	was := l.mounted
	l.mounted = false
	l.mu.Unlock()
	if !was {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- l.server.Unmount() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		// Unmounted, the server still waits for the kernel to end the
		// connection; its goroutines end when it does.
	}
	if err != nil {
		if derr := syscall.Unmount(l.dir, syscall.MNT_DETACH); derr != nil {
			return fmt.Errorf("lazyfs: unmount %s: %w (lazy detach: %v)", l.dir, err, derr)
		}
		err = nil
	}
	l.mu.Lock()
	l.files = map[key]*file{}
	l.mu.Unlock()
	return err
}
