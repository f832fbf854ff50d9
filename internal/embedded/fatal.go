package embedded

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrListen is what a start's error matches (errors.Is) when the server
// could not listen on its address (taken, not this host's, not permitted).
var ErrListen = errors.New("embedded: cannot listen")

// ListenError is a start's error when the server could not listen on Addr.
type ListenError struct {
	Addr string
	Err  error // the OS error, e.g. bind: address already in use
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("embedded: nats-server cannot listen on %s: %v", e.Addr, e.Err)
}

func (e *ListenError) Unwrap() []error { return []error{ErrListen, e.Err} }

// fatalCatcher is the server's logger while it starts: it passes every line
// on to the logger it wraps (none: the server logs nothing), except that a
// fatal one, which the server's own logger would end the process with, is
// logged as an error and kept for waitReady to return at once.
type fatalCatcher struct {
	server.Logger // nil: discard
	once          sync.Once
	fatal         chan error
}

// catchFatal installs a fatalCatcher on s, around the logger s has.
func catchFatal(s *server.Server) *fatalCatcher {
	c := &fatalCatcher{Logger: s.Logger(), fatal: make(chan error, 1)}
	s.SetLogger(c, false, false)
	return c
}

// listenFatal is the format of the server's fatal line when it cannot
// listen for clients (server.go, AcceptLoop).
const listenFatal = "Error listening on port: %s, %q"

func (c *fatalCatcher) Fatalf(format string, v ...any) {
	var err error
	if format == listenFatal && len(v) == 2 {
		addr, _ := v[0].(string)
		oserr, ok := v[1].(error)
		if ok {
			err = &ListenError{Addr: addr, Err: oserr}
		}
	}
	if err == nil {
		err = fmt.Errorf("embedded: nats-server failed to start: %s", fmt.Sprintf(format, v...))
	}
	c.once.Do(func() { c.fatal <- err })
	if c.Logger != nil {
		c.Logger.Errorf(format, v...)
	}
}

func (c *fatalCatcher) Noticef(format string, v ...any) {
	if c.Logger != nil {
		c.Logger.Noticef(format, v...)
	}
}

func (c *fatalCatcher) Warnf(format string, v ...any) {
	if c.Logger != nil {
		c.Logger.Warnf(format, v...)
	}
}

func (c *fatalCatcher) Errorf(format string, v ...any) {
	if c.Logger != nil {
		c.Logger.Errorf(format, v...)
	}
}

func (c *fatalCatcher) Debugf(format string, v ...any) {
	if c.Logger != nil {
		c.Logger.Debugf(format, v...)
	}
}

func (c *fatalCatcher) Tracef(format string, v ...any) {
	if c.Logger != nil {
		c.Logger.Tracef(format, v...)
	}
}

// startAndWait starts s (its logger already configured, if any) and waits
// at most wait for it to accept clients on addr. A fatal error while it starts,
// such as an address it cannot listen on, is returned at once, not after
// wait. On error s is shut down.
func startAndWait(s *server.Server, addr string, wait time.Duration) error {
	c := catchFatal(s)
	go s.Start()
	deadline := time.Now().Add(wait)
	for {
		select {
		case err := <-c.fatal:
			s.Shutdown()
			s.WaitForShutdown()
			return err
		default:
		}
		left := time.Until(deadline)
		if left <= 0 {
			s.Shutdown()
			return fmt.Errorf("embedded: nats-server on %s not ready after %s", addr, wait)
		}
		if s.ReadyForConnections(min(left, 50*time.Millisecond)) {
			return nil
		}
	}
}
