package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/events"
)

// SessionConfig describes a session to open. The zero value is not usable:
// ID and Span are required.
type SessionConfig struct {
	// ID is the session id, 1 to 128 of A-Z, a-z, 0-9, '_' and '-'.
	ID string
	// Unit is what offsets count; empty means turns.
	Unit events.Unit
	// Span is the recovery floor: how many of the latest offsets (in Unit)
	// every compaction must keep verbatim. It must be more than 0.
	Span uint64
	// Window and Trigger are the context window and the compaction
	// threshold, in tokens; informational, nil leaves them out.
	Window, Trigger *uint64
	// Head resumes a session opened before, by this or an earlier process,
	// whose transcript is [0, Head): Open publishes session.opened again
	// (seamguard accepts an unchanged configuration and changes nothing)
	// and Append continues at offset Head. 0 starts a new session.
	Head uint64
	// OnRejected, when set, is called with every rejection of one of this
	// session's own events other than compaction requests (whose
	// rejections RequestCompaction returns as a *RejectedError): an
	// event.rejected verdict, verified as any verdict is, that names an
	// event this session published (by its causationid, or its
	// Nats-Msg-Id or ce-id when the event did not decode that far).
	// Without it such a rejection (a turn of a closed or unknown session,
	// an offset conflict, a second open with another floor) is seen only
	// by subscribers and operators: the publish itself succeeded, since
	// the events stream stored the event before seamguard read it.
	//
	// The session then listens on <prefix>.verdicts.<session>.rejected
	// (core NATS; the agent identity may subscribe to it) from before its
	// session.opened until Close has stored the close: a rejection that
	// arrives later (of the close itself, or of an event just before it)
	// is not reported. OnRejected is called on the subscription's
	// goroutine, one rejection at a time, and should return quickly (send
	// to a buffered channel, say); a message on that subject that fails
	// verification goes to Config.OnUnattributed instead.
	OnRejected func(*RejectedError)
}

// Validate reports every problem with sc at once.
func (sc SessionConfig) Validate() error {
	var errs []error
	if !events.ValidSessionID(sc.ID) {
		errs = append(errs, fmt.Errorf("%w: session ID %q: use 1 to %d of the characters A-Z, a-z, 0-9, '_' and '-'", ErrInvalid, sc.ID, events.MaxSessionIDLen))
	}
	if sc.Unit != "" && !sc.Unit.Valid() {
		errs = append(errs, fmt.Errorf("%w: Unit %q: use %q, %q or %q (empty means turns)", ErrInvalid, sc.Unit, events.UnitTurns, events.UnitTokens, events.UnitMessages))
	}
	if sc.Span == 0 {
		errs = append(errs, fmt.Errorf("%w: Span is 0: set how many of the latest offsets must survive every compaction verbatim", ErrInvalid))
	}
	if sc.Span > events.MaxOffset || sc.Head > events.MaxOffset {
		errs = append(errs, fmt.Errorf("%w: Span and Head must be at most 2^53", ErrInvalid))
	}
	return errors.Join(errs...)
}

// Session is one open agent session. It publishes the session's events in
// order, each stored in the events stream (its JetStream ack received)
// before the next is sent, and tracks the head so that callers never
// compute offsets.
//
// A Session is safe for concurrent use: its events are published one at a
// time, in the order the calls take its lock. RequestCompaction holds the
// lock only while it publishes, not while it waits for the verdict.
type Session struct {
	c    *Client
	id   string
	unit events.Unit

	mu         sync.Mutex
	head       uint64
	pending    *outEvent // an event whose ack never came; sent again first
	closed     bool
	rejections *nats.Subscription // with OnRejected, until the close is stored

	onRejected func(*RejectedError)
	rmu        sync.Mutex        // guards ours, byMsgID, order
	ours       map[string]string // event id → its Nats-Msg-Id, for OnRejected
	byMsgID    map[string]string // the reverse
	order      []string          // the ids in ours, oldest first
}

// rememberedIDs bounds the event ids a session with OnRejected keeps to
// match rejections against: rejections come within moments, so the latest
// few thousand events are enough.
const rememberedIDs = 4096

// Open publishes io.seamguard.session.opened for sc and returns the
// session; the recovery floor's unit is the session's unit:
//
//	s, err := c.Open(ctx, client.SessionConfig{ID: "ops-agent-42", Span: 12}) // turns; the last 12 survive
//
// On an error no session is returned and nothing is sent again: call Open
// again. With sc.OnRejected the session subscribes to its rejections
// first.
func (c *Client) Open(ctx context.Context, sc SessionConfig) (*Session, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if sc.Unit == "" {
		sc.Unit = events.UnitTurns
	}
	s := &Session{c: c, id: sc.ID, unit: sc.Unit, head: sc.Head, onRejected: sc.OnRejected}
	if s.onRejected != nil {
		s.ours, s.byMsgID = map[string]string{}, map[string]string{}
		subject := c.subjects.Verdict(s.id, events.KindRejected)
		sub, err := c.nc.Subscribe(subject, s.rejected)
		if err != nil {
			return nil, fmt.Errorf("client: subscribing to the rejections of session %s on %s: %w", s.id, subject, err)
		}
		// The server has the subscription before the open can be rejected.
		if err := c.nc.FlushWithContext(ctx); err != nil {
			_ = sub.Unsubscribe()
			return nil, fmt.Errorf("client: subscribing to the rejections of session %s on %s: %w", s.id, subject, err)
		}
		s.rejections = sub
	}
	err := s.send(ctx, events.TypeSessionOpened, newID(), &events.SessionOpened{
		Unit:          sc.Unit,
		RecoveryFloor: events.Floor{Span: sc.Span, Unit: sc.Unit},
		Window:        sc.Window,
		Trigger:       sc.Trigger,
	}, nil)
	if err != nil {
		s.mu.Lock()
		s.stopListeningLocked()
		s.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// rejected is the handler of the session's rejections (OnRejected).
func (s *Session) rejected(m *nats.Msg) {
	a, err := s.c.verifier.Verify(m.Subject, m.Header, m.Data)
	if err != nil {
		if s.c.cfg.OnUnattributed != nil {
			u := Unattributed{Subject: m.Subject, Err: err}
			u.Claims, _ = events.DecodeVerdict(m.Data)
			s.c.cfg.OnUnattributed(u)
		}
		return
	}
	d, ok := a.Verdict.Data.(*events.EventRejected)
	if !ok {
		return
	}
	s.rmu.Lock()
	id, mine := rejectedID(a.Verdict, d,
		func(id string) bool { _, ok := s.ours[id]; return ok },
		func(msgID string) (string, bool) { id, ok := s.byMsgID[msgID]; return id, ok })
	s.rmu.Unlock()
	if mine {
		s.onRejected(&RejectedError{Session: s.id, EventID: id, Rejection: d, Signer: a.Signer})
	}
}

// remember keeps the id of an event the session publishes, to match its
// rejection (OnRejected).
func (s *Session) remember(id, msgID string) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.ours[id], s.byMsgID[msgID] = msgID, id
	s.order = append(s.order, id)
	if len(s.order) > rememberedIDs {
		old := s.order[0]
		delete(s.byMsgID, s.ours[old])
		delete(s.ours, old)
		s.order = s.order[1:]
	}
}

// stopListeningLocked ends the subscription to the session's rejections.
func (s *Session) stopListeningLocked() {
	if s.rejections != nil {
		_ = s.rejections.Unsubscribe()
		s.rejections = nil
	}
}

// ID returns the session id.
func (s *Session) ID() string { return s.id }

// Unit returns the unit the session's offsets count.
func (s *Session) Unit() events.Unit { return s.unit }

// Head returns the end offset of the last turn appended: the transcript is
// [0, Head()).
func (s *Session) Head() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head
}

// Closed reports whether Close was called. Its session.closed may still be
// pending (see Pending): Close sends it again.
func (s *Session) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Pending reports whether an event whose publish failed waits to be sent
// again, same id: by the session's next call that publishes, or by Flush.
func (s *Session) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending != nil
}

// send publishes one event under the lock: first the pending event of an
// earlier failed call, then this one. A failed publish leaves the event
// pending (so it is not lost and keeps its place) and returns an error
// wrapping ErrNotPublished. after, when not nil, runs under the lock once
// the event is built (before it is published), to advance the head.
func (s *Session) send(ctx context.Context, typ, id string, data any, after func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.sendLocked(ctx, typ, id, data, after)
	return err
}

func (s *Session) sendLocked(ctx context.Context, typ, id string, data any, after func()) (*outEvent, error) {
	if s.closed {
		return nil, fmt.Errorf("%w: session %s: open a new session to publish more", ErrClosed, s.id)
	}
	if err := s.flushLocked(ctx, true); err != nil {
		return nil, err
	}
	ev, err := s.c.build(s.id, typ, id, data)
	if err != nil {
		return nil, err
	}
	if after != nil {
		after()
	}
	if s.onRejected != nil && typ != events.TypeCompactionRequested {
		s.remember(ev.id, ev.msgID)
	}
	if _, err := s.c.publish(ctx, ev); err != nil {
		s.pending = ev
		return ev, err
	}
	return ev, nil
}

// flushLocked publishes the pending event, if any. blocking: the caller
// has an event of its own to send after it, which the error then says
// was not sent (NotPublishedError.Kept false).
func (s *Session) flushLocked(ctx context.Context, blocking bool) error {
	if s.pending == nil {
		return nil
	}
	if _, err := s.c.publish(ctx, s.pending); err != nil {
		var npe *NotPublishedError
		if blocking && errors.As(err, &npe) {
			earlier := *npe
			earlier.Kept = false
			return &earlier
		}
		return err
	}
	s.pending = nil
	if s.closed {
		s.stopListeningLocked() // the close is stored
	}
	return nil
}

// Flush publishes again, with the same id, an event whose earlier publish
// failed. It returns nil when nothing is pending.
func (s *Session) Flush(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushLocked(ctx, false)
}

// Turn is one turn to append. The zero value is a turn of size 1 with no
// content.
type Turn struct {
	// Size is the turn's length in the session's unit; 0 means 1 (a
	// session counting turns).
	Size uint64
	// Role is who spoke ("user", "assistant", "tool"); optional.
	Role string
	// Tokens is the turn's length in tokens; optional, informational.
	Tokens *uint64
	// Content is what the turn said: anything encoding/json can encode
	// (a json.RawMessage is sent as is). It is what a spill preserves.
	Content any
	// Pinned marks the turn as a rule that must stay in the agent's
	// working context for the session's life (a standing instruction, a
	// constraint, the task statement): seamguard then refuses every
	// compaction that neither keeps it in the tail nor carries it.
	Pinned bool
}

// Append publishes io.seamguard.turn.appended for the turn at the session's
// head and returns the range it occupies; the head moves past it.
//
// On an error wrapping ErrNotPublished the turn still counts as appended:
// the session publishes it again, with the same id, before anything else.
func (s *Session) Append(ctx context.Context, t Turn) (events.Range, error) {
	size := t.Size
	if size == 0 {
		size = 1
	}
	var content json.RawMessage
	if t.Content != nil {
		raw, err := json.Marshal(t.Content)
		if err != nil {
			return events.Range{}, fmt.Errorf("%w: turn content: %w", ErrInvalid, err)
		}
		content = raw
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := s.head
	if size > events.MaxOffset-start {
		return events.Range{}, fmt.Errorf("%w: a turn of size %d at offset %d ends beyond 2^53", ErrInvalid, size, start)
	}
	r := events.Range{Start: start, End: start + size}
	appended := false
	_, err := s.sendLocked(ctx, events.TypeTurnAppended, newID(), &events.TurnAppended{
		Offset: start, Size: size, Role: t.Role, Tokens: t.Tokens, Content: content, Pinned: t.Pinned,
	}, func() { s.head, appended = r.End, true })
	if !appended { // not built or an earlier event still pending: nothing changed
		return events.Range{}, err
	}
	return r, err
}

// Truncated reports that budget enforcement removed r from the working
// context: io.seamguard.context.truncated. r must lie within [0, Head());
// stage names the step that evicted it (such as "budget"), "" leaves it out.
func (s *Session) Truncated(ctx context.Context, r events.Range, stage string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Start > r.End || r.End > s.head {
		return fmt.Errorf("%w: truncated range [%d, %d) of session %s must lie within [0, %d), the turns appended so far",
			ErrInvalid, r.Start, r.End, s.id, s.head)
	}
	_, err := s.sendLocked(ctx, events.TypeContextTruncated, newID(), &events.ContextTruncated{Range: r, Stage: stage}, nil)
	return err
}

// Pin pins the turns in r: io.seamguard.context.pinned. seamguard refuses
// every later compaction that would drop them from the working context
// (next "carry_pins") until they are unpinned. r must lie within
// [0, Head()); offsets of r that were never appended are not pinned.
func (s *Session) Pin(ctx context.Context, r events.Range) error {
	return s.pin(ctx, r, events.TypeContextPinned)
}

// Unpin releases the turns in r: io.seamguard.context.unpinned, once they
// no longer bind the agent. r must lie within [0, Head()).
func (s *Session) Unpin(ctx context.Context, r events.Range) error {
	return s.pin(ctx, r, events.TypeContextUnpinned)
}

func (s *Session) pin(ctx context.Context, r events.Range, typ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Start > r.End || r.End > s.head {
		return fmt.Errorf("%w: range [%d, %d) to %s in session %s must lie within [0, %d), the turns appended so far",
			ErrInvalid, r.Start, r.End, strings.TrimPrefix(typ, events.TypePrefix), s.id, s.head)
	}
	var data any = &events.ContextPinned{Range: r}
	if typ == events.TypeContextUnpinned {
		data = &events.ContextUnpinned{Range: r}
	}
	_, err := s.sendLocked(ctx, typ, newID(), data, nil)
	return err
}

// Commit reports that the agent applied the compaction requestID:
// io.seamguard.compaction.committed. seamguard records the coverage of that
// request's latest verdict as the summary's; committing a compaction that
// was not allowed is recorded all the same and yields a
// compaction.violation verdict.
func (s *Session) Commit(ctx context.Context, requestID string) error {
	if requestID == "" {
		return fmt.Errorf("%w: Commit needs the request id of the compaction that was applied", ErrInvalid)
	}
	return s.send(ctx, events.TypeCompactionCommitted, newID(), &events.CompactionCommitted{RequestID: requestID}, nil)
}

// Close publishes io.seamguard.session.closed. Later calls that publish
// return ErrClosed. Close of a closed session only publishes what is still
// pending (the close itself, if its publish failed). Once the close is
// stored, the session no longer listens for rejections (OnRejected).
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.flushLocked(ctx, false)
	}
	_, err := s.sendLocked(ctx, events.TypeSessionClosed, newID(), struct{}{}, func() { s.closed = true })
	if err == nil {
		s.stopListeningLocked()
	}
	return err
}
