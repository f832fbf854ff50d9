// Package lazyfs is a FUSE filesystem for tests that loses what was not
// synced, in the spirit of Jepsen's LazyFS: it makes a power cut something
// a test can do on purpose.
//
// Mount puts it over a backing directory. The model:
//
//   - File data is lazy. Every write is kept in memory, per file, and
//     reads through the mount see it. Fsync and fdatasync of any handle
//     of a file write all of that file's pending data to the backing file
//     and fsync the backing file. A write on a handle opened with O_SYNC
//     or O_DSYNC is synced at once. Flush (close) is not a sync, and
//     neither is closing the last handle: closed files keep their
//     pending data until a sync or the power cut.
//   - A size change (truncate, ftruncate, O_TRUNC) is file data too: it
//     is applied to the backing file by the next sync and lost with the
//     rest by a power cut.
//   - Metadata is eager: create, mkdir, rename, unlink, rmdir, link,
//     symlink, chmod, chown and utimes go to the backing directory at
//     once and survive a power cut, fsynced directory or not. A file
//     created and never synced therefore survives empty (or with what
//     its last sync wrote), and a file renamed over another keeps only
//     its synced data: the outcome of a power cut on a filesystem that
//     orders metadata before data it has not flushed.
//
// DropUnsynced is the power cut: it discards every pending write and size
// change of every file at once. Stop the processes that use the mount
// first; then Unmount, and Mount again (or read the backing directory) to
// see what survived. Descriptors opened before the drop may still read the
// kernel's cached pages.
//
// Options.NoBackingSync leaves out the fsync of the backing file: the cut
// this package makes loses only what it holds, so a test that does not cut
// the power of the machine itself loses nothing by it and runs a server
// that syncs every write much faster.
//
// The filesystem never hands a descriptor to the kernel for passthrough,
// so every read and write goes through it; it offers no mmap-visible
// writeback cache, no fallocate and no copy_file_range (the kernel falls
// back to reads and writes). Mount needs root and /dev/fuse; it calls
// mount(2) itself, without fusermount, and marks the process's descriptors
// of /dev/fuse close-on-exec (go-fuse leaves them inheritable), so that
// the processes a test starts do not hold the mounts open.
//
// An FS is safe for concurrent use: the kernel calls it from many
// goroutines, and a test may call DropUnsynced, Stats and Unmount from
// any goroutine.
package lazyfs
