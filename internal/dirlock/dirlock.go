package dirlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FileName is the lock file's name inside the directory.
const FileName = "LOCK"

// ErrLocked is what a refused Acquire's error matches (errors.Is): another
// process holds the directory.
var ErrLocked = errors.New("dirlock: directory in use")

// Holder is what the process holding a directory writes into its lock file.
// The zero value is an unknown holder.
type Holder struct {
	PID    int       `json:"pid"`
	Host   string    `json:"host,omitempty"`
	Listen []string  `json:"listen,omitempty"` // addresses, each optionally prefixed by what listens ("nats 127.0.0.1:4222")
	Since  time.Time `json:"since"`
}

// Self is a Holder for this process, started now, listening on listen.
func Self(listen ...string) Holder {
	host, _ := os.Hostname()
	return Holder{PID: os.Getpid(), Host: host, Listen: listen, Since: time.Now().UTC().Truncate(time.Second)}
}

// String says who the holder is in words, e.g. "pid 123 on host h,
// listening on nats 127.0.0.1:4222, since 2025-01-02T03:04:05Z".
func (h Holder) String() string {
	if h.PID == 0 {
		return "a process that has not written who it is"
	}
	s := fmt.Sprintf("pid %d", h.PID)
	if h.Host != "" {
		s += " on host " + h.Host
	}
	if len(h.Listen) > 0 {
		s += ", listening on " + strings.Join(h.Listen, " and ")
	}
	if !h.Since.IsZero() {
		s += ", since " + h.Since.Format(time.RFC3339)
	}
	return s
}

// LockedError is Acquire's error when another process holds the directory.
type LockedError struct {
	Dir    string
	Holder Holder // zero when the holder wrote nothing readable
	// Stale is set where the lock is a file that outlives its process (no
	// flock): removing it is the fix once the holder is gone.
	Stale bool
}

func (e *LockedError) Error() string {
	s := fmt.Sprintf("dirlock: %s is in use by %s", e.Dir, e.Holder)
	if e.Stale {
		s += fmt.Sprintf(" (if that process is no longer running, remove %s)", filepath.Join(e.Dir, FileName))
	}
	return s
}

// Is makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Lock is a directory held by this process. Its methods may not be called
// concurrently.
type Lock struct {
	f    *os.File
	path string
}

// Acquire takes dir (creating it if need be) for this process, at once or
// not at all: when another process holds it, it returns a *LockedError
// naming that process and does not wait. On success it writes h into the
// lock file.
func Acquire(dir string, h Holder) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("dirlock: %w", err)
	}
	path := filepath.Join(dir, FileName)
	f, err := lockFile(path)
	if errors.Is(err, ErrLocked) {
		return nil, &LockedError{Dir: dir, Holder: readHolder(path), Stale: !kernelLock}
	}
	if err != nil {
		return nil, fmt.Errorf("dirlock: %s: %w", path, err)
	}
	l := &Lock{f: f, path: path}
	if err := l.Update(h); err != nil {
		_ = l.Release()
		return nil, err
	}
	return l, nil
}

// Update replaces what the lock file says about the holder, e.g. with the
// addresses it listens on once it knows them.
func (l *Lock) Update(h Holder) error {
	b, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("dirlock: %w", err)
	}
	b = append(b, '\n')
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("dirlock: %s: %w", l.path, err)
	}
	if _, err := l.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("dirlock: %s: %w", l.path, err)
	}
	return nil
}

// Path is the lock file's path.
func (l *Lock) Path() string { return l.path }

// Release gives the directory up. The process exiting releases it too.
func (l *Lock) Release() error {
	if l.f == nil {
		return nil
	}
	err := unlockFile(l.f, l.path)
	l.f = nil
	return err
}

// readHolder reads what the holder wrote. A holder that has just taken the
// lock may not have written yet: it is given a moment.
func readHolder(path string) Holder {
	var h Holder
	for range 10 {
		b, err := os.ReadFile(path)
		if err == nil && json.Unmarshal(b, &h) == nil && h.PID != 0 {
			return h
		}
		time.Sleep(20 * time.Millisecond)
	}
	return Holder{}
}
