//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package dirlock

import (
	"errors"
	"os"
	"syscall"
)

// kernelLock: the lock is flock(2), released by the kernel when the
// process exits.
const kernelLock = true

func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, err
	}
	return f, nil
}

// unlockFile empties the file (a holder that is gone is no one) and closes
// it, which drops the lock. The file stays: removing it would let a process
// that opened it just before lock a file no longer in the directory.
func unlockFile(f *os.File, _ string) error {
	_ = f.Truncate(0)
	return f.Close()
}
