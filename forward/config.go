package forward

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// Defaults of the zero Config.
const (
	DefaultMaxAttempts = 10
	DefaultConcurrency = 1
	DefaultTimeout     = 10 * time.Second
	DefaultMinBackoff  = 500 * time.Millisecond
	DefaultMaxBackoff  = 30 * time.Second
	// DefaultMaxRetryAfter bounds how long a Retry-After makes a
	// forwarder wait before its next attempt.
	DefaultMaxRetryAfter = 5 * time.Minute
)

// Kinds are the verdict kinds a forwarder may select.
var Kinds = []string{events.KindAllowed, events.KindRefused, events.KindSpilled, events.KindHalted, events.KindRejected, events.KindViolation}

// Config is one forwarder. The zero value is not usable: To is required;
// every other zero field means its default. Validate reports every problem
// at once.
type Config struct {
	// To is the http or https URL each verdict is POSTed to.
	To string
	// Prefix is the deployment's subject prefix; "" means "seamguard".
	Prefix string
	// Name is the durable consumer's name, shared by every forwarder
	// process that shares the work; "" means DefaultName(To, Kinds, Session).
	Name string
	// Kinds selects verdict kinds (see Kinds); empty means every kind.
	Kinds []string
	// Session selects one session's verdicts; "" means every session.
	Session string
	// From is where a new consumer starts: "new" (or ""), verdicts
	// decided after it is created; "start", the first verdict the stream
	// holds; a stream sequence; or an RFC 3339 time. An existing consumer
	// resumes where it stands, whatever From says.
	From string
	// MaxAttempts bounds the attempts to deliver one verdict per delivery;
	// 0 means DefaultMaxAttempts.
	MaxAttempts int
	// Concurrency is how many verdicts one forwarder delivers at once; 0
	// means DefaultConcurrency (1: in stream order).
	Concurrency int
	// Timeout bounds one HTTP request; 0 means DefaultTimeout.
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between attempts; 0 means
	// DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// MaxRetryAfter bounds the wait a Retry-After asks for; 0 means
	// DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// Header holds extra request headers, such as Authorization.
	Header map[string]string
	// Replicas of the undeliverable stream when the forwarder creates it;
	// 0 means 1.
	Replicas int
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.To == "" {
		errs = append(errs, fmt.Errorf("%w: no URL to deliver to", ErrConfig))
	} else if u, err := url.Parse(c.To); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("%w: %q is not an http or https URL", ErrConfig, c.To))
	}
	if err := (events.Subjects{Prefix: c.Prefix}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %v", ErrConfig, err))
	}
	if c.Name != "" && !nameRE.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("%w: name %q: use 1 to 64 of A-Z a-z 0-9 _ -", ErrConfig, c.Name))
	}
	for _, k := range c.Kinds {
		if !slices.Contains(Kinds, k) {
			errs = append(errs, fmt.Errorf("%w: kind %q: use %s", ErrConfig, k, strings.Join(Kinds, ", ")))
		}
	}
	if c.Session != "" && !events.ValidSessionID(c.Session) {
		errs = append(errs, fmt.Errorf("%w: session %q is not a session id", ErrConfig, c.Session))
	}
	if _, err := c.deliverPolicy(); err != nil {
		errs = append(errs, err)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"max attempts", int64(c.MaxAttempts)}, {"concurrency", int64(c.Concurrency)}, {"timeout", int64(c.Timeout)},
		{"min backoff", int64(c.MinBackoff)}, {"max backoff", int64(c.MaxBackoff)}, {"max retry-after", int64(c.MaxRetryAfter)}, {"replicas", int64(c.Replicas)}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%w: %s is negative", ErrConfig, f.name))
		}
	}
	if c.Concurrency > 1000 {
		errs = append(errs, fmt.Errorf("%w: concurrency %d: at most 1000", ErrConfig, c.Concurrency))
	}
	if c.minBackoff() > c.maxBackoff() {
		errs = append(errs, fmt.Errorf("%w: min backoff %s is more than max backoff %s", ErrConfig, c.minBackoff(), c.maxBackoff()))
	}
	for k, v := range c.Header {
		if k == "" || strings.ContainsAny(k+v, "\r\n") {
			errs = append(errs, fmt.Errorf("%w: header %q: a name, and no line breaks", ErrConfig, k))
		}
	}
	return errors.Join(errs...)
}

// DefaultName is the consumer name of a forwarder given no name:
// "forward-" and 12 hex digits of a SHA-256 over the URL and filters, so
// that processes started alike share one consumer.
func DefaultName(to string, kinds []string, session string) string {
	k := slices.Clone(kinds)
	slices.Sort(k)
	k = slices.Compact(k)
	sum := sha256.Sum256([]byte(to + "\n" + strings.Join(k, ",") + "\n" + session))
	return "forward-" + hex.EncodeToString(sum[:6])
}

func (c Config) name() string {
	if c.Name != "" {
		return c.Name
	}
	return DefaultName(c.To, c.Kinds, c.Session)
}

func (c Config) subjects() events.Subjects { return events.Subjects{Prefix: c.Prefix} }

func (c Config) prefix() string {
	if c.Prefix == "" {
		return events.DefaultPrefix
	}
	return c.Prefix
}

// Filters are the verdict subjects the consumer selects.
func (c Config) Filters() []string {
	s := c.Session
	if s == "" {
		s = "*"
	}
	if len(c.Kinds) == 0 {
		return []string{c.prefix() + ".verdicts." + s + ".*"}
	}
	k := slices.Clone(c.Kinds)
	slices.Sort(k)
	k = slices.Compact(k)
	out := make([]string, len(k))
	for i, kind := range k {
		out[i] = c.prefix() + ".verdicts." + s + "." + kind
	}
	return out
}

// deliverPolicy reads From.
func (c Config) deliverPolicy() (jetstream.ConsumerConfig, error) {
	var cc jetstream.ConsumerConfig
	switch from := strings.TrimSpace(c.From); from {
	case "", "new":
		cc.DeliverPolicy = jetstream.DeliverNewPolicy
	case "start", "all":
		cc.DeliverPolicy = jetstream.DeliverAllPolicy
	default:
		if n, err := strconv.ParseUint(from, 10, 64); err == nil && n > 0 {
			cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
			cc.OptStartSeq = n
		} else if t, err := time.Parse(time.RFC3339Nano, from); err == nil {
			cc.DeliverPolicy = jetstream.DeliverByStartTimePolicy
			cc.OptStartTime = &t
		} else {
			return cc, fmt.Errorf("%w: from %q: use new, start, a stream sequence (1 or more) or an RFC 3339 time", ErrConfig, c.From)
		}
	}
	return cc, nil
}

func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

func (c Config) maxAttempts() int          { return orDefault(c.MaxAttempts, DefaultMaxAttempts) }
func (c Config) concurrency() int          { return orDefault(c.Concurrency, DefaultConcurrency) }
func (c Config) timeout() time.Duration    { return orDefault(c.Timeout, DefaultTimeout) }
func (c Config) minBackoff() time.Duration { return orDefault(c.MinBackoff, DefaultMinBackoff) }
func (c Config) maxBackoff() time.Duration { return orDefault(c.MaxBackoff, DefaultMaxBackoff) }
func (c Config) maxRetryAfter() time.Duration {
	return orDefault(c.MaxRetryAfter, DefaultMaxRetryAfter)
}

// ackWait is the consumer's AckWait: long enough for a request, with room;
// a message being retried is kept with InProgress at a third of it.
func (c Config) ackWait() time.Duration { return max(30*time.Second, 2*c.timeout()+5*time.Second) }

// UndeliverableStream is the name of the stream of a deployment with
// prefix (as processor.Config.Names derives names) that keeps what
// forwarders could not deliver: "seamguard" gives SEAMGUARD_UNDELIVERABLE.
func UndeliverableStream(prefix string) string {
	if prefix == "" {
		prefix = events.DefaultPrefix
	}
	return strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(prefix)) + "_UNDELIVERABLE"
}

// VerdictStream is the verdict stream of a deployment with prefix.
func VerdictStream(prefix string) string { return processor.Config{Prefix: prefix}.Names().Verdicts }
