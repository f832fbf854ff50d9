package client

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
)

// Defaults of Config; a zero field means its default.
const (
	DefaultSource          = "urn:seamguard:client"
	DefaultAckTimeout      = 5 * time.Second
	DefaultPublishAttempts = 5
)

// Config configures a Client. Its zero value talks to a seamguard
// deployment with the default prefix "seamguard": events go to
// seamguard.events.<session> and must land in the stream SEAMGUARD_EVENTS,
// in binary content mode, with source DefaultSource. Call Validate to see
// every problem at once (New does).
type Config struct {
	// Prefix is the first token(s) of every subject, as the processor's
	// --prefix; empty means "seamguard".
	Prefix string
	// Stream is the events stream every publish must land in (JetStream
	// checks it through the Nats-Expected-Stream header, so a stray stream
	// capturing the subject is an error, not a silent loss); empty means
	// the name the processor derives from Prefix, "SEAMGUARD_EVENTS" for
	// the default prefix.
	Stream string
	// Source is the CloudEvents source of every event, naming the agent
	// (for example "urn:agent:billing/worker-3"); empty means
	// DefaultSource.
	Source string
	// Structured publishes events in structured content mode (the whole
	// event as JSON, Content-Type application/cloudevents+json) instead of
	// binary mode (ce-* headers, the data as the body).
	Structured bool
	// AckTimeout bounds the wait for the JetStream ack of one publish
	// attempt, and for the answer to one request of Recover; 0 means 5s.
	AckTimeout time.Duration
	// PublishAttempts is how many times one event is published before a
	// method gives up (a lost ack, no stream responding, a reconnect); 0
	// means 5. Every attempt carries the same Nats-Msg-Id.
	PublishAttempts int
	// TrustedKeys are the public NKeys (N…) of the processors whose
	// verdicts the client believes: what serve logs as signing_key. Give
	// several during a key rotation; an element may also hold several,
	// separated by commas or white space. Empty means that a verdict's
	// signature is checked against the key it names, whoever that is
	// (Verdict.Trusted is then false): set it in production. Either way
	// a verdict that fails verification is never returned as an answer;
	// see OnUnattributed.
	TrustedKeys []string
	// OnUnattributed, when set, is called (on the goroutine waiting for a
	// verdict) for every message on a session's verdict subjects that
	// fails verification: unsigned, signed by a key not trusted, changed
	// after signing, or a verdict of another session or kind.
	OnUnattributed func(Unattributed)
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	if err := (events.Subjects{Prefix: c.Prefix}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("client: Prefix: %w", err))
	}
	if c.Stream != "" && strings.ContainsFunc(c.Stream, func(r rune) bool {
		return r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r)
	}) {
		errs = append(errs, fmt.Errorf("client: Stream %q may not hold '.', '*', '>' or white space; use the events stream's name, such as SEAMGUARD_EVENTS", c.Stream))
	}
	if strings.ContainsFunc(c.Source, func(r rune) bool { return unicode.IsControl(r) }) {
		errs = append(errs, fmt.Errorf("client: Source %q holds a control character; use a URI such as urn:agent:<name>", c.Source))
	}
	if c.AckTimeout < 0 {
		errs = append(errs, fmt.Errorf("client: AckTimeout is %s; it must be 0 (the default, 5s) or more", c.AckTimeout))
	}
	if _, err := attest.ParseKeys(c.TrustedKeys...); err != nil {
		errs = append(errs, fmt.Errorf("client: TrustedKeys: %w", err))
	}
	if c.PublishAttempts < 0 {
		errs = append(errs, fmt.Errorf("client: PublishAttempts is %d; it must be 0 (the default, 5) or more", c.PublishAttempts))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Stream == "" {
		c.Stream = StreamName(c.Prefix)
	}
	if c.Source == "" {
		c.Source = DefaultSource
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.PublishAttempts == 0 {
		c.PublishAttempts = DefaultPublishAttempts
	}
	return c
}

// StreamName is the name of the events stream the processor provisions for
// prefix: the prefix upper-cased, '.' and '-' as '_', then "_EVENTS"
// ("SEAMGUARD_EVENTS" for the default prefix).
func StreamName(prefix string) string {
	if prefix == "" {
		prefix = events.DefaultPrefix
	}
	return strings.NewReplacer(".", "_", "-", "_").Replace(strings.ToUpper(prefix)) + "_EVENTS"
}
