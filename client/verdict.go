package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// Verdict is seamguard's answer to one compaction request: allowed,
// refused or halted. The embedded events.Verdict is the verdict event as
// it arrived (its Cause.ID, the causationid, is EventID).
type Verdict struct {
	*events.Verdict
	// Request is the compaction request this verdict answers, with its
	// request id filled in.
	Request events.CompactionRequested
	// EventID is the id of the compaction.requested event that was
	// published.
	EventID string
	// Previous is, for a verdict returned by Compact after a retry or
	// after carrying pins, the refusal that came before it (with the spill
	// handle, if one was written; its own Previous the one before); nil
	// otherwise.
	Previous *Verdict
	// Signer is the public NKey whose signature the verdict carries, and
	// Trusted whether it is one of Config.TrustedKeys (false when none
	// are configured: the signature was checked, not who made it).
	Signer  string
	Trusted bool
	// Unattributed are the messages that claimed to answer this request
	// while the client waited, and failed verification (forgeries, or a
	// verdict signed by a key not yet trusted): they were not taken for
	// the answer.
	Unattributed []Unattributed
}

// Unattributed is a message on a session's verdict subjects that failed
// verification (package attest): it is not a verdict the processor
// decided, or not one about this subject.
type Unattributed struct {
	// Subject is the NATS subject it arrived on.
	Subject string
	// Err says why: an *attest.Error, whose Reason is unsigned,
	// bad_signature, untrusted_signer, misrouted or malformed;
	// errors.Is(Err, ErrUnattributed) holds.
	Err error
	// Claims is its body decoded as a verdict, or nil when it is none.
	Claims *events.Verdict
}

// Kind returns what the verdict says, the last token of its subject:
// events.KindAllowed ("allowed"), events.KindRefused ("refused") or
// events.KindHalted ("halted"), the same as Type names in full. Switch on
// it, or on the data's type:
//
//	switch v.Kind() {
//	case events.KindAllowed: // v.Allowed() is the data; apply it, then Commit
//	case events.KindRefused: // v.Refused().Next, .Reasons, .Spill
//	case events.KindHalted:  // v.Halted().Unrecoverable
//	}
//
//	switch d := v.Data.(type) {
//	case *events.CompactionAllowed:
//	case *events.CompactionRefused:
//	case *events.SessionHalted:
//	}
func (v *Verdict) Kind() string { return v.Output.Kind() }

// Allowed returns the verdict's data if the compaction was allowed, else nil.
func (v *Verdict) Allowed() *events.CompactionAllowed {
	d, _ := v.Data.(*events.CompactionAllowed)
	return d
}

// Refused returns the verdict's data if the compaction was refused, else nil.
func (v *Verdict) Refused() *events.CompactionRefused {
	d, _ := v.Data.(*events.CompactionRefused)
	return d
}

// Halted returns the verdict's data if the session was halted, else nil.
func (v *Verdict) Halted() *events.SessionHalted {
	d, _ := v.Data.(*events.SessionHalted)
	return d
}

// Retryable reports whether the verdict is a refusal whose next step is
// "retry": seamguard wrote a spill that covers what the compaction puts at
// risk, and the same compaction requested again will be allowed (unless
// the session changed in between).
func (v *Verdict) Retryable() bool {
	r := v.Refused()
	return r != nil && r.Next == events.NextRetry
}

// MustCarryPins reports whether the verdict is a refusal whose next step is
// "carry_pins": the compaction would drop pinned turns from the working
// context. DroppedPins names them; CarryPins requests the compaction again
// with them carried.
func (v *Verdict) MustCarryPins() bool {
	r := v.Refused()
	return r != nil && r.Next == events.NextCarryPins
}

// DroppedPins returns the pinned offsets a refusal says the compaction
// would drop (the at-risk ranges of its pin_dropped reason), and whether
// that list is complete (false when the refusal cut it short).
func (v *Verdict) DroppedPins() (pins []events.Range, complete bool) {
	r := v.Refused()
	if r == nil {
		return nil, true
	}
	for _, reason := range r.Reasons {
		if reason.Code == events.ReasonPinDropped {
			return reason.AtRisk, !reason.AtRiskTruncated
		}
	}
	return nil, true
}

// RejectedError is an event.rejected verdict about one of the session's
// events (seamguard could not accept it: malformed, out of bounds, of a
// closed or unknown session, ...), verified as any verdict is.
// RequestCompaction returns it when the compaction.requested event itself
// was rejected; SessionConfig.OnRejected is given it for the session's
// other events.
type RejectedError struct {
	Session   string
	EventID   string // the id of the rejected event
	Rejection *events.EventRejected
	// Signer is the key that signed the rejection; Unattributed, as for
	// Verdict (RequestCompaction's only).
	Signer       string
	Unattributed []Unattributed
}

func (e *RejectedError) Error() string {
	r := e.Rejection
	return fmt.Sprintf("client: seamguard rejected event %s of session %s: %s (field %q): %s",
		e.EventID, e.Session, r.Code, r.Field, r.Message)
}

// NoVerdictError is the error of RequestCompaction (and Compact, Retry,
// CarryPins) when the context ended before the verdict came;
// errors.Is(err, ErrNoVerdict) holds, and errors.Is(err, ErrUnattributed)
// when messages claiming to answer the request failed verification. The
// verdict, once the processor decides it, is still in the verdict stream.
type NoVerdictError struct {
	Session   string
	RequestID string // the compaction's request id
	EventID   string // the id of the compaction.requested event that was published
	// Unattributed are the messages that claimed to answer the request
	// and failed verification.
	Unattributed []Unattributed
	// Err is why the wait ended: the context's error.
	Err error

	subject string // where the verdict comes
}

func (e *NoVerdictError) Error() string {
	msg := fmt.Sprintf("%v for compaction request %q of session %s (event %s) before the context ended: %v",
		ErrNoVerdict, e.RequestID, e.Session, e.EventID, e.Err)
	if len(e.Unattributed) > 0 {
		u := e.Unattributed[0]
		return msg + fmt.Sprintf("; %d message(s) claiming to answer it failed verification, the first on %s: %v",
			len(e.Unattributed), u.Subject, u.Err)
	}
	return msg + "; is the seamguard processor running? The verdict, once decided, is on " + e.subject + " and in the verdict stream"
}

// Is makes errors.Is match ErrNoVerdict.
func (e *NoVerdictError) Is(target error) bool { return target == ErrNoVerdict }

// Unwrap returns the context's error and, when there is one, the first
// unattributed message's error (an *attest.Error, matching ErrUnattributed).
func (e *NoVerdictError) Unwrap() []error {
	if len(e.Unattributed) > 0 {
		return []error{e.Err, e.Unattributed[0].Err}
	}
	return []error{e.Err}
}

// RequestCompaction asks seamguard whether a compaction is safe and waits
// for its verdict. An empty req.RequestID is filled with a fresh id.
//
// It subscribes to the session's verdict subjects before it publishes the
// request (with a fresh event id), and returns the first verdict whose
// causationid is that event id and whose request_id is req.RequestID, or a
// *RejectedError if the event was rejected. When ctx ends first it returns
// an error wrapping ErrNoVerdict that names the request; the verdict, when
// the processor gets to it, is still in the verdict stream.
//
// A refused verdict may be retryable (see Retry and Compact). A halted
// session refuses every compaction until an operator resumes it.
func (s *Session) RequestCompaction(ctx context.Context, req events.CompactionRequested) (*Verdict, error) {
	if req.RequestID == "" {
		req.RequestID = newID()
	}
	eventID := newID()
	sub, err := s.publishRequest(ctx, eventID, req)
	if sub != nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err != nil {
		return nil, err
	}
	var forged []Unattributed // claimed to answer, failed verification
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if errors.Is(err, nats.ErrSlowConsumer) {
				continue // some verdicts were dropped; ours may still come
			}
			if ctx.Err() != nil {
				return nil, &NoVerdictError{Session: s.id, RequestID: req.RequestID, EventID: eventID,
					Unattributed: forged, Err: ctx.Err(), subject: s.c.subjects.Verdict(s.id, "<kind>")}
			}
			return nil, fmt.Errorf("client: waiting for the verdict of compaction request %q of session %s: %w", req.RequestID, s.id, err)
		}
		a, verr := s.c.verifier.Verify(m.Subject, m.Header, m.Data)
		if verr != nil {
			u := Unattributed{Subject: m.Subject, Err: verr}
			u.Claims, _ = events.DecodeVerdict(m.Data)
			if s.c.cfg.OnUnattributed != nil {
				s.c.cfg.OnUnattributed(u)
			}
			if u.Claims != nil && answers(u.Claims, events.MsgID(s.c.cfg.Source, eventID), eventID, req.RequestID) {
				forged = append(forged, u)
			}
			continue // never taken for an answer
		}
		v := a.Verdict
		if d, ok := v.Data.(*events.EventRejected); ok && rejects(v, d, events.MsgID(s.c.cfg.Source, eventID), eventID) {
			return nil, &RejectedError{Session: s.id, EventID: eventID, Rejection: d, Signer: a.Signer, Unattributed: forged}
		}
		if v.Cause.ID != eventID {
			continue // about another event
		}
		var requestID string
		switch d := v.Data.(type) {
		case *events.CompactionAllowed:
			requestID = d.RequestID
		case *events.CompactionRefused:
			requestID = d.RequestID
		case *events.SessionHalted:
			requestID = d.RequestID
		default:
			continue // transcript.spilled: the refusal that follows carries the handle
		}
		if requestID == req.RequestID {
			return &Verdict{Verdict: v, Request: req, EventID: eventID, Signer: a.Signer, Trusted: a.Trusted, Unattributed: forged}, nil
		}
	}
}

// publishRequest subscribes to the session's verdicts and then publishes
// the request, under the session's lock so that it keeps its place among
// the session's events.
func (s *Session) publishRequest(ctx context.Context, eventID string, req events.CompactionRequested) (*nats.Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: session %s: open a new session to compact", ErrClosed, s.id)
	}
	sub, err := s.c.nc.SubscribeSync(s.c.subjects.Verdict(s.id, "*"))
	if err != nil {
		return nil, fmt.Errorf("client: subscribing to the verdicts of session %s: %w", s.id, err)
	}
	// The server has the subscription before the request can be decided.
	if err := s.c.nc.FlushWithContext(ctx); err != nil {
		return sub, fmt.Errorf("client: subscribing to the verdicts of session %s: %w", s.id, err)
	}
	_, err = s.sendLocked(ctx, events.TypeCompactionRequested, eventID, &req, nil)
	return sub, err
}

// Retry requests again the compaction a retryable refusal answered, with
// the same request id and a fresh event id, and waits for its verdict.
// After a refusal with next "retry", seamguard has spilled the transcript,
// so the retry is allowed unless the session changed in between; the
// agent should keep the refusal's spill handle to re-read what the
// compaction drops. Retry of any other verdict returns ErrNotRetryable.
func (s *Session) Retry(ctx context.Context, refused *Verdict) (*Verdict, error) {
	if refused == nil || !refused.Retryable() {
		return nil, fmt.Errorf("%w: only a refusal with next %q can be retried", ErrNotRetryable, events.NextRetry)
	}
	return s.RequestCompaction(ctx, refused.Request)
}

// CarryPins requests again the compaction a refusal with next
// "carry_pins" answered, with the same request id, a fresh event id, and
// the pinned turns it would drop added to carried_pins, and waits for its
// verdict. The agent must then put those turns back into its new context
// verbatim, outside the summary. CarryPins of any other verdict returns
// ErrNotRetryable.
func (s *Session) CarryPins(ctx context.Context, refused *Verdict) (*Verdict, error) {
	if refused == nil || !refused.MustCarryPins() {
		return nil, fmt.Errorf("%w: only a refusal with next %q asks to carry pins", ErrNotRetryable, events.NextCarryPins)
	}
	pins, _ := refused.DroppedPins()
	req := refused.Request
	req.CarriedPins = append(slices.Clone(req.CarriedPins), pins...)
	return s.RequestCompaction(ctx, req)
}

// maxCompactSteps bounds the requests Compact sends for one compaction:
// the request, a carry of its pins, a retry after a spill, and one more
// carry for pins a cut-short refusal did not list.
const maxCompactSteps = 4

// Compact requests a compaction and follows the contract's flows until it
// is allowed or refused for good: a refusal with next "retry" (seamguard
// spilled the transcript) is retried, and one with next "carry_pins" is
// requested again with the dropped pinned turns in carried_pins (so the
// agent must keep those turns, verbatim, in its new context: the
// allowed verdict's Request.CarriedPins says which). It sends at most a
// few requests, all with the same request id. It returns the last verdict;
// its Previous is the refusal before it, and so on.
func (s *Session) Compact(ctx context.Context, req events.CompactionRequested) (*Verdict, error) {
	v, err := s.RequestCompaction(ctx, req)
	for step := 1; err == nil && step < maxCompactSteps; step++ {
		var next *Verdict
		switch {
		case v.Retryable():
			next, err = s.Retry(ctx, v)
		case v.MustCarryPins():
			next, err = s.CarryPins(ctx, v)
		default:
			return v, nil
		}
		if err != nil {
			spill := "none"
			if h := v.Refused().Spill; h != nil {
				spill = h.Bucket + "/" + h.Name
			}
			return nil, fmt.Errorf("client: requesting compaction %q again after its refusal (next %s, spill %s): %w",
				v.Request.RequestID, v.Refused().Next, spill, err)
		}
		next.Previous = v
		v = next
	}
	return v, err
}

// answers reports whether v claims to answer the compaction request
// (requestID) published as event eventID under Nats-Msg-Id msgID: as its
// verdict or its rejection.
func answers(v *events.Verdict, msgID, eventID, requestID string) bool {
	if d, ok := v.Data.(*events.EventRejected); ok {
		return rejects(v, d, msgID, eventID)
	}
	if v.Cause.ID != eventID {
		return false
	}
	switch d := v.Data.(type) {
	case *events.CompactionAllowed:
		return d.RequestID == requestID
	case *events.CompactionRefused:
		return d.RequestID == requestID
	case *events.SessionHalted:
		return d.RequestID == requestID
	}
	return false
}

// rejects reports whether a rejection answers the event eventID, published
// under Nats-Msg-Id msgID (events.MsgID of its source and the event id).
func rejects(v *events.Verdict, d *events.EventRejected, msgID, eventID string) bool {
	_, ok := rejectedID(v, d,
		func(id string) bool { return id == eventID },
		func(m string) (string, bool) { return eventID, m == msgID })
	return ok
}

// rejectedID returns which of our events the rejection answers, if any: its
// id. A rejection has a causationid only when the event decoded far enough
// to have an id; otherwise it names the input by its headers: the client
// set Nats-Msg-Id to events.MsgID of its source and the event id (byMsgID
// maps it back) and, in binary mode, ce-id to the event id.
func rejectedID(v *events.Verdict, d *events.EventRejected, ours func(id string) bool, byMsgID func(msgID string) (string, bool)) (string, bool) {
	if v.Cause.ID != "" {
		return v.Cause.ID, ours(v.Cause.ID)
	}
	for name, vals := range d.Input.Headers {
		for _, val := range vals {
			switch {
			case strings.EqualFold(name, jetstream.MsgIDHeader):
				if id, ok := byMsgID(val); ok {
					return id, true
				}
			case strings.EqualFold(name, "ce-id"):
				if ours(val) {
					return val, true
				}
			}
		}
	}
	return "", false
}
