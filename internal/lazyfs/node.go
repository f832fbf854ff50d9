package lazyfs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node with file data made lazy: it opens and
// creates files with its own handles, and reports the size readers see.
// Every other operation (lookup, mkdir, rename, unlink, ...) is the
// loopback's, applied to the backing directory at once.
type node struct {
	*fs.LoopbackNode
	lfs *FS
}

var (
	_ = (fs.NodeWrapChilder)((*node)(nil))
	_ = (fs.NodeOpener)((*node)(nil))
	_ = (fs.NodeCreater)((*node)(nil))
	_ = (fs.NodeLookuper)((*node)(nil))
	_ = (fs.NodeGetattrer)((*node)(nil))
	_ = (fs.NodeStatxer)((*node)(nil))
	_ = (fs.NodeSetattrer)((*node)(nil))
	_ = (fs.NodeCopyFileRanger)((*node)(nil))
	_ = (fs.NodeTmpfiler)((*node)(nil))
)

// WrapChild makes every node the loopback creates one of ours.
func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), lfs: n.lfs}
}

func (n *node) path() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

// key names a backing file the way go-fuse does: inode number and
// generation, so that a reused inode number is another file.
type key struct{ ino, gen uint64 }

func keyOf(in *fs.Inode) key {
	a := in.StableAttr()
	return key{a.Ino, a.Gen}
}

// openBacking opens the backing file at p read-write (a sync may need to
// write through any handle), or as asked where that is refused.
func openBacking(p string, flags uint32) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		f, err = os.OpenFile(p, int(flags)&syscall.O_ACCMODE, 0)
	}
	return f, err
}

func syncFlags(flags uint32) bool {
	return flags&(syscall.O_SYNC|syscall.O_DSYNC) != 0
}

func (n *node) Open(_ context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	f, err := openBacking(n.path(), flags)
	if err != nil {
		return nil, 0, fs.ToErrno(err)
	}
	st, err := n.lfs.state(keyOf(n.EmbeddedInode()), f, false)
	if err != nil {
		f.Close()
		return nil, 0, fs.ToErrno(err)
	}
	if flags&syscall.O_TRUNC != 0 {
		st.truncate(0)
	}
	return &handle{lfs: n.lfs, f: f, st: st, sync: syncFlags(flags)}, 0, fs.OK
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p := filepath.Join(n.path(), name)
	_, err := os.Lstat(p)
	existed := err == nil
	create := os.O_RDWR | os.O_CREATE
	if flags&syscall.O_EXCL != 0 {
		create |= os.O_EXCL
	}
	f, err := os.OpenFile(p, create, os.FileMode(mode&0o7777))
	if err != nil {
		return nil, nil, 0, fs.ToErrno(err)
	}
	// The loopback's lookup names the new node as every later lookup will.
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno != fs.OK {
		f.Close()
		return nil, nil, 0, errno
	}
	st, err := n.lfs.state(keyOf(ch), f, !existed)
	if err != nil {
		f.Close()
		return nil, nil, 0, fs.ToErrno(err)
	}
	if existed && flags&syscall.O_TRUNC != 0 {
		st.truncate(0)
	}
	out.Attr.Size = uint64(st.visibleSize())
	return ch, &handle{lfs: n.lfs, f: f, st: st, sync: syncFlags(flags)}, 0, fs.OK
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno == fs.OK {
		if size, ok := n.lfs.size(keyOf(ch)); ok {
			out.Attr.Size = size
		}
	}
	return ch, errno
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := f.(*handle); ok {
		var st syscall.Stat_t
		if err := syscall.Fstat(int(h.f.Fd()), &st); err != nil {
			return fs.ToErrno(err)
		}
		out.FromStat(&st)
	} else if errno := n.LoopbackNode.Getattr(ctx, nil, out); errno != fs.OK {
		return errno
	}
	if size, ok := n.lfs.size(keyOf(n.EmbeddedInode())); ok {
		out.Size = size
	}
	return fs.OK
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if h, ok := f.(*handle); ok {
		var st unix.Statx_t
		if err := unix.Statx(int(h.f.Fd()), "", unix.AT_EMPTY_PATH|int(flags), int(mask), &st); err != nil {
			return fs.ToErrno(err)
		}
		out.FromStatx(&st)
	} else if errno := n.LoopbackNode.Statx(ctx, nil, flags, mask, out); errno != fs.OK {
		return errno
	}
	if size, ok := n.lfs.size(keyOf(n.EmbeddedInode())); ok {
		out.Size = size
	}
	return fs.OK
}

// Setattr makes a size change lazy; mode, owner and times go to the
// backing file at once.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		var st *file
		if h, ok := f.(*handle); ok {
			st = h.st
		} else {
			bf, err := openBacking(n.path(), syscall.O_RDONLY)
			if err != nil {
				return fs.ToErrno(err)
			}
			st, err = n.lfs.state(keyOf(n.EmbeddedInode()), bf, false)
			bf.Close()
			if err != nil {
				return fs.ToErrno(err)
			}
		}
		st.truncate(int64(size))
		in.Valid &^= fuse.FATTR_SIZE
	}
	if in.Valid&(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID|fuse.FATTR_ATIME|fuse.FATTR_MTIME|fuse.FATTR_ATIME_NOW|fuse.FATTR_MTIME_NOW) != 0 {
		if errno := n.LoopbackNode.Setattr(ctx, nil, in, out); errno != fs.OK {
			return errno
		}
	}
	return n.Getattr(ctx, f, out)
}

// CopyFileRange is not offered: the kernel falls back to reads and writes.
func (n *node) CopyFileRange(context.Context, fs.FileHandle, uint64, *fs.Inode, fs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

// Tmpfile is not offered (O_TMPFILE fails with EOPNOTSUPP).
func (n *node) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}
