package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// Defaults and bounds of Config.
const (
	// DefaultMaxBatchEvents is the most events one batch may hold: the
	// most a JetStream atomic batch may (a later version may publish a
	// batch as one).
	DefaultMaxBatchEvents = 1000
	// DefaultMaxBatchBytes bounds a batch's body.
	DefaultMaxBatchBytes = 8 << 20
	// DefaultAckTimeout is how long each event's publish waits for the
	// stream's ack.
	DefaultAckTimeout = 5 * time.Second
	// MaxWait is the longest ?wait= a request may ask for.
	MaxWait = 60 * time.Second
	// DefaultMaxWaiting is how many ?wait= requests may wait at once.
	DefaultMaxWaiting = 1024
)

// Config is what a Server needs. Agent is required; the zero value of
// every other field means its default.
type Config struct {
	// Subjects names the deployment's subjects (its prefix and
	// partitions), as the processor's.
	Subjects events.Subjects
	// EventsStream and VerdictsStream are the names of the two streams
	// (default SEAMGUARD_EVENTS and SEAMGUARD_VERDICTS for the default
	// prefix): every event's publish must land in EventsStream.
	EventsStream, VerdictsStream string
	// Agent publishes events (never control events) and subscribes to
	// verdicts: the shipped agent identity, or any identity as narrow.
	Agent *nats.Conn
	// Operator publishes control events (session.resumed), for operator
	// tokens only. Nil: the gateway refuses control events (403).
	Operator *nats.Conn
	// Reader reads the events stream (STREAM.INFO and STREAM.MSG.GET, as
	// the processor and operator identities may) to tell a duplicate of an
	// event from another event under the same (source, id). Nil: every
	// duplicate is answered 409.
	Reader jetstream.JetStream
	// Verdicts reads the verdict stream's last verdicts (STREAM.INFO and
	// direct get, as the operator identity may) to answer ?wait= for a
	// request stored before, whose verdict may be out already. Nil: such a
	// request waits for a verdict to come.
	Verdicts jetstream.JetStream
	// Auth decides who may do what; nil or nil Tokens: every caller is
	// the operator (serve then listens on loopback only).
	Auth *Auth
	// MaxEventBytes bounds one event as a NATS message (body and
	// headers); 0 means Agent's max_payload, as NATS bounds it.
	MaxEventBytes int64
	// MaxBatchEvents and MaxBatchBytes bound one batch (defaults
	// DefaultMaxBatchEvents and DefaultMaxBatchBytes).
	MaxBatchEvents int
	MaxBatchBytes  int64
	// AckTimeout bounds the wait for each event's ack (default
	// DefaultAckTimeout).
	AckTimeout time.Duration
	// MaxWaiting bounds the ?wait= requests waiting at once (default
	// DefaultMaxWaiting); one more is answered 503 before anything is
	// published.
	MaxWaiting int
	// Logger receives a line per failed publish; nil discards.
	Logger *slog.Logger
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Agent == nil {
		errs = append(errs, errors.New("gateway: Agent: a NATS connection is required"))
	}
	if err := c.Subjects.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("gateway: Subjects: %w", err))
	}
	if c.MaxEventBytes < 0 || c.MaxBatchBytes < 0 || c.MaxBatchEvents < 0 || c.AckTimeout < 0 || c.MaxWaiting < 0 {
		errs = append(errs, errors.New("gateway: MaxEventBytes, MaxBatchBytes, MaxBatchEvents, AckTimeout and MaxWaiting must not be negative"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.EventsStream == "" {
		c.EventsStream = streamName(c.Subjects, "EVENTS")
	}
	if c.VerdictsStream == "" {
		c.VerdictsStream = streamName(c.Subjects, "VERDICTS")
	}
	if c.MaxEventBytes == 0 && c.Agent != nil {
		c.MaxEventBytes = c.Agent.MaxPayload()
	}
	if c.MaxEventBytes <= 0 {
		c.MaxEventBytes = 1 << 20
	}
	if c.MaxBatchEvents == 0 {
		c.MaxBatchEvents = DefaultMaxBatchEvents
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = DefaultMaxWaiting
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// streamName is the processor's naming (processor.Config.Names): the
// prefix upper-cased with '.' and '-' as '_', then the stream's part.
func streamName(s events.Subjects, part string) string {
	p := s.Prefix
	if p == "" {
		p = events.DefaultPrefix
	}
	b := []byte(p)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case c == '.' || c == '-':
			b[i] = '_'
		}
	}
	return string(b) + "_" + part
}

// ErrNotLoopback: an address to listen on that is not loopback, with no
// token file.
var ErrNotLoopback = errors.New("gateway: without a token file the HTTP gateway listens on a loopback address only")

// CheckListen checks addr (HOST:PORT) as a place to listen: with no token
// file (tokens false) only a loopback host is accepted (127.0.0.1, ::1,
// localhost), since every caller would be the operator.
func CheckListen(addr string, tokens bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("gateway: listen address %q: %w; use HOST:PORT such as 127.0.0.1:8480", addr, err)
	}
	if tokens {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w: %q is not loopback; give a token file (--http-tokens) to listen there, or listen on 127.0.0.1", ErrNotLoopback, addr)
}
