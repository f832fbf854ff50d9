package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsfail"
)

// Errors of the client. Methods wrap them with what went wrong, so test
// them with errors.Is.
var (
	// ErrNoVerdict: the context ended before the verdict of a compaction
	// request arrived. The error is a *NoVerdictError.
	ErrNoVerdict = errors.New("client: no verdict")
	// ErrNotPublished: an event could not be stored in the events stream.
	// The session keeps it and publishes it again, with the same id,
	// before its next event (or on Flush). The error is a
	// *NotPublishedError.
	ErrNotPublished = errors.New("client: event not published")
	// ErrMsgIDTaken: the events stream answered an event's first publish
	// as a duplicate: it holds another message under the event's
	// Nats-Msg-Id (events.MsgID of the source and id) within its dedupe
	// window, and did not store this one. Errors wrapping it also wrap
	// ErrNotPublished.
	ErrMsgIDTaken = errors.New("client: the events stream holds another message under this event's message id")
	// ErrClosed: the session was closed with Close.
	ErrClosed = errors.New("client: session closed")
	// ErrNotRetryable: Retry was given a verdict that is not a refusal
	// with next "retry".
	ErrNotRetryable = errors.New("client: verdict is not a retryable refusal")
	// ErrInvalid: an argument is out of range; nothing was published.
	ErrInvalid = errors.New("client: invalid argument")
	// ErrUnattributed: a message claiming to answer a request failed
	// verification (attest.ErrUnattributed); ErrNoVerdict errors wrap it
	// when such messages came and no genuine verdict did.
	ErrUnattributed = attest.ErrUnattributed
)

// Client publishes the events of agent sessions to seamguard and waits for
// its verdicts. It holds no state of its own beyond its configuration: any
// goroutine may use it at any time, and it may open any number of sessions.
type Client struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	cfg      Config
	subjects events.Subjects
	verifier *attest.Verifier
	now      func() time.Time
}

// New returns a Client that publishes through nc with JetStream acks and
// listens to verdicts on nc. It needs no JetStream API access: an agent
// identity that may publish on <prefix>.events.> and subscribe to
// <prefix>.verdicts.> and _INBOX.> is enough. The caller keeps owning nc.
func New(nc *nats.Conn, cfg Config) (*Client, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: the NATS connection is nil; connect with nats.Connect first", ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	cfg = cfg.withDefaults()
	subjects := events.Subjects{Prefix: cfg.Prefix}
	ver, err := attest.NewVerifier(subjects, cfg.TrustedKeys...)
	if err != nil {
		return nil, fmt.Errorf("client: TrustedKeys: %w", err)
	}
	return &Client{nc: nc, js: js, cfg: cfg, subjects: subjects, verifier: ver, now: time.Now}, nil
}

// Config returns the client's configuration with every default filled in.
func (c *Client) Config() Config { return c.cfg }

// Subjects returns the subject names the client uses.
func (c *Client) Subjects() events.Subjects { return c.subjects }

// newID returns a fresh event id: a NUID, 22 characters unique across
// processes without coordination.
func newID() string { return nuid.Next() }

// publish stores ev in the events stream: up to PublishAttempts attempts,
// each waiting AckTimeout for the JetStream ack, all with Nats-Msg-Id =
// events.MsgID(source, id), so an attempt whose ack was lost is dropped by
// the stream's dedupe window instead of stored twice. Errors the next
// attempt cannot cure (a stream that refuses the message) end it at once.
//
// A duplicate ack is taken for this event's own earlier attempt only when
// one was stored or went unanswered. Otherwise the stream holds some other
// message under the message id (ids are fresh NUIDs, so no earlier event
// of this client has it), and publish returns an error wrapping ErrMsgIDTaken: the client
// cannot read the stream to compare (an agent has no JetStream API
// access), and it never counts such an ack as stored.
func (c *Client) publish(ctx context.Context, ev *outEvent) (*jetstream.PubAck, error) {
	var last error
	for attempt := 0; attempt < c.cfg.PublishAttempts; attempt++ {
		if attempt > 0 {
			wait := time.Duration(min(attempt, 5)) * 100 * time.Millisecond
			select {
			case <-ctx.Done():
				return nil, c.publishErr(ev, errors.Join(last, ctx.Err()))
			case <-time.After(wait):
			}
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
		ack, err := c.js.PublishMsg(actx, ev.msg,
			jetstream.WithMsgID(ev.msgID), jetstream.WithExpectStream(c.cfg.Stream))
		cancel()
		if err == nil && ack.Duplicate && !ev.mayBeStored {
			return nil, c.publishErr(ev, fmt.Errorf("%w (%s, stream sequence %d), and this event was never stored before: another publisher set the same Nats-Msg-Id; the session sends the event again once the stream's dedupe window has passed",
				ErrMsgIDTaken, ev.msgID, ack.Sequence))
		}
		if err == nil {
			ev.mayBeStored = true
			return ack, nil
		}
		var api *jetstream.APIError
		if !errors.As(err, &api) && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
			ev.mayBeStored = true // it may have reached the stream
		}
		last = err
		if ctx.Err() != nil {
			return nil, c.publishErr(ev, errors.Join(err, ctx.Err()))
		}
		if !transient(err) {
			break
		}
	}
	return nil, c.publishErr(ev, last)
}

func (c *Client) publishErr(ev *outEvent, err error) error {
	return &NotPublishedError{Session: ev.session, EventID: ev.id, EventType: ev.typ, Source: c.cfg.Source,
		Subject: ev.msg.Subject, Stream: c.cfg.Stream, Kept: true, Err: err}
}

// NotPublishedError is the error of a method whose event could not be
// stored in the events stream; errors.Is(err, ErrNotPublished) holds, and
// errors.Is(err, ErrMsgIDTaken) when the stream holds another message
// under the event's message id. Unwrap returns why (the last attempt's
// error, the context's).
type NotPublishedError struct {
	Session   string
	EventID   string // the event that was not stored
	EventType string // its CloudEvents type
	Source    string
	Subject   string // the subject it was published on
	Stream    string // the stream it was to land in
	// Kept is true when the event is the call's own: the session keeps it
	// (an appended turn counts, the head moved past it) and publishes it
	// again, same id, before its next event, or on Flush. It is false when
	// the call published nothing of its own and changed nothing, because
	// the earlier event EventID is still unpublished.
	Kept bool
	Err  error
}

func (e *NotPublishedError) Error() string {
	msg := fmt.Sprintf("%v: %s event %s of source %s, session %s, on %s (stream %s): %v",
		ErrNotPublished, e.EventType, e.EventID, e.Source, e.Session, e.Subject, e.Stream, e.Err)
	if !e.Kept {
		msg = "the earlier event is still unpublished, so nothing later is sent: " + msg
	}
	return msg
}

// Is makes errors.Is match ErrNotPublished.
func (e *NotPublishedError) Is(target error) bool { return target == ErrNotPublished }

// Unwrap returns why the event was not stored.
func (e *NotPublishedError) Unwrap() error { return e.Err }

// transient reports whether another attempt of a publish may succeed: it
// got no answer on a connection that may come back (jsfail.NoAnswer).
func transient(err error) bool { return jsfail.NoAnswer(err) }
