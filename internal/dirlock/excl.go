//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package dirlock

import (
	"errors"
	"os"
)

// kernelLock: without flock the lock is the file's existence, which
// outlives a process that dies holding it.
const kernelLock = false

func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		return nil, ErrLocked
	}
	return f, err
}

func unlockFile(f *os.File, path string) error {
	err := f.Close()
	if rerr := os.Remove(path); err == nil {
		err = rerr
	}
	return err
}
