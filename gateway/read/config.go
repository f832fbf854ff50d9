package read

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
)

// Defaults of Config.
const (
	DefaultMaxStreams     = 256
	DefaultSessionStreams = 8
	DefaultMaxSpillReads  = 16
	DefaultHeartbeat      = 15 * time.Second
	DefaultWriteTimeout   = 30 * time.Second
	DefaultDigestCache    = 1024
)

// Config is what a Handler reads and how much it serves at once. Its zero
// value serves the default prefix "seamguard" with the defaults below and
// verifies signatures without trusting any key in particular; a
// deployment sets Trust to the processor's public key.
type Config struct {
	// Prefix is the deployment's subject prefix (serve's --prefix); empty
	// means "seamguard". It names the verdict stream, the verdict subjects
	// and the spill bucket, as processor.Config.Names does.
	Prefix string
	// Trust holds the public keys whose signature makes a verdict genuine
	// (attest.ParseKeys). Empty: a verdict's signature is checked against
	// the key it names, which proves nothing about who made it.
	Trust attest.Trust
	// MaxStreams bounds the verdict streams open at once over all callers;
	// 0 means DefaultMaxStreams.
	MaxStreams int
	// SessionStreams bounds the verdict streams open at once on one
	// session (and those of every session, an operator's, count as one
	// more session), so that one session's readers cannot take every
	// stream; 0 means DefaultSessionStreams.
	SessionStreams int
	// MaxSpillReads bounds the spill reads in flight at once; 0 means
	// DefaultMaxSpillReads.
	MaxSpillReads int
	// Heartbeat is the time between two ": ping" comments of an idle
	// verdict stream; 0 means DefaultHeartbeat.
	Heartbeat time.Duration
	// WriteTimeout bounds each write to a client (an event, a heartbeat, a
	// chunk of a spill); a client that reads nothing for that long is
	// dropped. 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// DigestCache is how many chains' digests are remembered; 0 means
	// DefaultDigestCache.
	DigestCache int
	// Poll is how often an idle verdict stream looks for new verdicts
	// when no message on its subjects wakes it (the identity may not
	// subscribe to them); 0 means jsread.DefaultPoll (1s).
	Poll time.Duration
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if err := (events.Subjects{Prefix: c.Prefix}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("read: Config.Prefix: %w", err))
	}
	if strings.ContainsAny(c.Prefix, "*>") {
		errs = append(errs, fmt.Errorf("read: Config.Prefix %q holds a wildcard", c.Prefix))
	}
	for _, f := range []struct {
		name string
		v    int
		def  int
	}{{"MaxStreams", c.MaxStreams, DefaultMaxStreams}, {"SessionStreams", c.SessionStreams, DefaultSessionStreams}, {"MaxSpillReads", c.MaxSpillReads, DefaultMaxSpillReads}, {"DigestCache", c.DigestCache, DefaultDigestCache}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("read: Config.%s is %d; use 0 for the default of %d, or a positive number", f.name, f.v, f.def))
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
		def  time.Duration
	}{{"Heartbeat", c.Heartbeat, DefaultHeartbeat}, {"WriteTimeout", c.WriteTimeout, DefaultWriteTimeout}, {"Poll", c.Poll, time.Second}} {
		if f.v < 0 || f.v > 0 && f.v < 10*time.Millisecond {
			errs = append(errs, fmt.Errorf("read: Config.%s is %s; use 0 for the default of %s, or 10ms or more", f.name, f.v, f.def))
		}
	}
	return errors.Join(errs...)
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// An Option changes what tests inject.
type Option func(*Handler)

// WithLogger logs through l (default: slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(h *Handler) { h.log = l }
}
