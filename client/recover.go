package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/seamguard/seamguard/events"
)

// Errors of Recover. Every error Recover returns wraps ErrNotRecovered;
// the others say why.
var (
	// ErrNotRecovered: the spill's transcript was not recovered whole. What
	// was written to the writer before the error is not to be trusted.
	ErrNotRecovered = errors.New("client: spill not recovered")
	// ErrSpillNotFound: the session has no spill of that name (seamguard's
	// recover service answered 404).
	ErrSpillNotFound = errors.New("client: no such spill")
	// ErrSpillForbidden: the spill is not one of the session asked for
	// (the recover service answered 403).
	ErrSpillForbidden = errors.New("client: spill of another session")
	// ErrDigestMismatch: what was read is not what the spill's handle
	// names: another size or SHA-256 digest, for one object of the chain
	// or for the object the caller's handle names.
	ErrDigestMismatch = errors.New("client: spill digest mismatch")
	// ErrBrokenChain: the spills' chain cannot be followed (a loop, links
	// out of order, more than events.MaxRecoverChain spills), or the
	// service's answers do not fit the protocol.
	ErrBrokenChain = errors.New("client: broken spill chain")
)

// RecoverError is a refusal by seamguard's recover service, with the code
// and message it sent (micro's Nats-Service-Error-Code and
// Nats-Service-Error headers). It matches ErrNotRecovered, and
// ErrSpillNotFound (404) or ErrSpillForbidden (403).
type RecoverError struct {
	Session string // the session asked on
	Name    string // the spill asked for
	Code    int    // 400, 403, 404, 409, 413, 500 or 503
	Message string
}

func (e *RecoverError) Error() string {
	return fmt.Sprintf("client: seamguard's recover service refused spill %s of session %s: %d %s", e.Name, e.Session, e.Code, e.Message)
}

// Is makes errors.Is match the sentinel of the refusal's code.
func (e *RecoverError) Is(target error) bool {
	switch target {
	case ErrNotRecovered:
		return true
	case ErrSpillNotFound:
		return e.Code == 404
	case ErrSpillForbidden:
		return e.Code == 403
	}
	return false
}

// recoverAttempts bounds how often one request is sent while the service
// does not answer (no processor running, or one restarting) or answers 503
// (busy, stopping, JetStream not answering); ctx bounds it too.
const recoverAttempts = 5

// Recover reads the transcript that spill h of this session holds, with
// its whole chain (h and the spills before it, oldest first), and writes
// it to w: JSON Lines, one accepted event of the session a line, from its
// session.opened to the compaction request that caused h, as `seamguard
// spill get` writes it. It returns the chain's handles, oldest first.
//
// The spills are read through seamguard's recover service, with requests
// on <prefix>.recover.<session>: the agent needs no JetStream access, only
// publish permission on that subject. h is usually the spill of a refusal
// (Verdict.Refused().Spill) or of an allowed verdict's recovered_by.
// Recover checks each object's size and SHA-256 digest against its
// handle, and the newest object's against h (when h has a digest).
//
// Every error wraps ErrNotRecovered and names the spill: a *RecoverError
// for the service's refusals (errors.Is ErrSpillNotFound,
// ErrSpillForbidden), ErrDigestMismatch, ErrBrokenChain, or the context's
// error when ctx ends first (also while no processor answers). The bytes
// of an object are written as they arrive, and its digest is checked at its
// end: after an error, discard what w received.
//
// Recover does not take the session's lock: it may run while other
// goroutines publish.
func (s *Session) Recover(ctx context.Context, h events.SpillHandle, w io.Writer) ([]events.SpillHandle, error) {
	return s.c.Recover(ctx, s.id, h, w)
}

// Recover is Session.Recover for a session this client has no Session of
// (an agent that restarted): session is the session id the request's
// subject names, and h must be a spill of it.
func (c *Client) Recover(ctx context.Context, session string, h events.SpillHandle, w io.Writer) ([]events.SpillHandle, error) {
	switch {
	case !events.ValidSessionID(session):
		return nil, fmt.Errorf("%w: %w: session id %q", ErrNotRecovered, ErrInvalid, session)
	case h.Name == "" || len(h.Name) > events.MaxRecoverNameBytes:
		return nil, fmt.Errorf("%w: %w: spill name %q: use the name of a spill handle", ErrNotRecovered, ErrInvalid, h.Name)
	case w == nil:
		return nil, fmt.Errorf("%w: %w: the writer is nil", ErrNotRecovered, ErrInvalid)
	}
	rc := recovery{c: c, session: session, subject: c.subjects.Recover(session)}
	chain, err := rc.chain(ctx, h)
	if err != nil {
		return nil, err
	}
	for _, o := range chain {
		if err := rc.object(ctx, o, w); err != nil {
			return chain, err
		}
	}
	return chain, nil
}

// RecoveredTranscript is a spill's transcript recovered whole, as
// RecoverTranscript returns it.
type RecoveredTranscript struct {
	// Chain is the spills read, oldest first; the last is the one asked
	// for.
	Chain []events.SpillHandle
	// Transcript is the chain's objects together: JSON Lines, every
	// accepted event of the session from its session.opened to the
	// request that caused the newest spill, one structured CloudEvent a
	// line (events.DecodeJSON reads one back).
	Transcript []byte
}

// RecoverTranscript is Recover into memory: it returns the transcript and
// the chain once every object's digest has been checked, or an error (as
// Recover's) and nothing.
func (s *Session) RecoverTranscript(ctx context.Context, h events.SpillHandle) (*RecoveredTranscript, error) {
	return s.c.RecoverTranscript(ctx, s.id, h)
}

// RecoverTranscript is Client.Recover into memory, as
// Session.RecoverTranscript.
func (c *Client) RecoverTranscript(ctx context.Context, session string, h events.SpillHandle) (*RecoveredTranscript, error) {
	var buf bytes.Buffer
	chain, err := c.Recover(ctx, session, h, &buf)
	if err != nil {
		return nil, err
	}
	return &RecoveredTranscript{Chain: chain, Transcript: buf.Bytes()}, nil
}

// recovery is one Recover call.
type recovery struct {
	c       *Client
	session string
	subject string
}

// brokenChain is what the errors of a chain's links that do not hold wrap.
var brokenChain = fmt.Errorf("%w: %w", ErrNotRecovered, ErrBrokenChain)

// chain follows h's chain back through the service's handles and returns
// it oldest first, checking the links as the spill package does (with its
// walk), and the newest spill's size and digest against h's when h has a
// digest.
func (rc *recovery) chain(ctx context.Context, h events.SpillHandle) ([]events.SpillHandle, error) {
	walk := events.ChainWalk{Max: events.MaxRecoverChain, Broken: brokenChain, GetSaysWhy: true,
		Get: func(ctx context.Context, name string) (events.SpillHandle, string, error) {
			got, err := rc.info(ctx, name)
			if err == nil && name == h.Name && h.Digest != "" && (got.Size != h.Size || !events.SameDigest(got.Digest, h.Digest)) {
				err = fmt.Errorf("%w: %w: spill %s of session %s holds %d bytes with digest %s, but the handle names %d bytes with digest %s (was it written again?)",
					ErrNotRecovered, ErrDigestMismatch, h.Name, rc.session, got.Size, got.Digest, h.Size, h.Digest)
			}
			return got, "", err // the service answers for the session's spills only
		}}
	chain, err := walk.Walk(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	return chain, nil
}

// info asks for the handle of the spill called name.
func (rc *recovery) info(ctx context.Context, name string) (events.SpillHandle, error) {
	m, err := rc.request(ctx, events.RecoverRequest{Op: events.RecoverOpInfo, Name: name})
	if err != nil {
		return events.SpillHandle{}, err
	}
	var h events.SpillHandle
	if err := json.Unmarshal(m.Data, &h); err != nil || h.Name != name {
		return events.SpillHandle{}, fmt.Errorf("%w: %w: the recover service answered the info of %s with %q (%v)",
			ErrNotRecovered, ErrBrokenChain, name, events.Excerpt(string(m.Data)), err)
	}
	return h, nil
}

// object reads the object o describes, one reply at a time, into w, and
// checks its size and digest.
func (rc *recovery) object(ctx context.Context, o events.SpillHandle, w io.Writer) error {
	sum := sha256.New()
	var (
		off      uint64
		cursor   string
		restarts int
	)
	// Each pass either moves off forward by at least a byte or uses up one
	// of at most 3 restarts of the object's version.
	for off < o.Size {
		m, err := rc.request(ctx, events.RecoverRequest{Op: events.RecoverOpRead, Name: o.Name, Offset: off, Cursor: cursor})
		var re *RecoverError
		if errors.As(err, &re) && re.Code == 409 && restarts < 3 {
			restarts++ // written again: read on without the cursor; the headers say whether it is the same
			cursor = ""
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s from byte %d of %d: %w", o.Name, off, o.Size, err)
		}
		size, _ := strconv.ParseUint(m.Header.Get(events.HeaderSpillSize), 10, 64)
		if digest := m.Header.Get(events.HeaderSpillDigest); size != o.Size || !events.SameDigest(digest, o.Digest) {
			return fmt.Errorf("%w: %w: spill %s of session %s now holds %d bytes with digest %s, but its handle names %d bytes with digest %s (was it written again?)",
				ErrNotRecovered, ErrDigestMismatch, o.Name, rc.session, size, digest, o.Size, o.Digest)
		}
		n := uint64(len(m.Data))
		if m.Header.Get(events.HeaderSpillName) != o.Name || m.Header.Get(events.HeaderOffset) != strconv.FormatUint(off, 10) ||
			n == 0 || n > o.Size-off {
			return fmt.Errorf("%w: %w: the recover service answered a read of %s at byte %d with %d bytes at byte %q of %q",
				ErrNotRecovered, ErrBrokenChain, o.Name, off, n, m.Header.Get(events.HeaderOffset), m.Header.Get(events.HeaderSpillName))
		}
		sum.Write(m.Data)
		if _, err := w.Write(m.Data); err != nil {
			return fmt.Errorf("%w: write spill %s of session %s: %w", ErrNotRecovered, o.Name, rc.session, err)
		}
		off += n
		cursor = m.Header.Get(events.HeaderCursor)
	}
	want, err := events.DecodeDigest(o.Digest)
	if err != nil {
		return fmt.Errorf("%w: %w: spill %s of session %s: digest %q: %w", ErrNotRecovered, ErrDigestMismatch, o.Name, rc.session, o.Digest, err)
	}
	if got := sum.Sum(nil); !bytes.Equal(got, want) {
		return fmt.Errorf("%w: %w: spill %s of session %s: read %d bytes with digest SHA-256=%s, but its handle names %s",
			ErrNotRecovered, ErrDigestMismatch, o.Name, rc.session, off, base64.URLEncoding.EncodeToString(got), o.Digest)
	}
	return nil
}

// request sends one request, again while no processor answers or one
// answers 503, at most recoverAttempts times, each waiting AckTimeout.
func (rc *recovery) request(ctx context.Context, rq events.RecoverRequest) (*nats.Msg, error) {
	body, err := json.Marshal(rq)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotRecovered, err)
	}
	var last error
	attempt := 0
	for ; attempt < recoverAttempts; attempt++ {
		if attempt > 0 {
			wait := min(100*time.Millisecond<<(attempt-1), 2*time.Second)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, rc.gaveUp(rq, attempt, errors.Join(last, ctx.Err()))
			case <-t.C:
			}
		}
		actx, cancel := context.WithTimeout(ctx, rc.c.cfg.AckTimeout)
		m, err := rc.c.nc.RequestWithContext(actx, rc.subject, body)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				// Cut short by the caller's context: what the
				// attempts before saw says more than the cut.
				if last == nil || !errors.Is(err, ctx.Err()) {
					last = errors.Join(last, err)
				}
				return nil, rc.gaveUp(rq, attempt+1, errors.Join(last, ctx.Err()))
			}
			last = err
			if !transient(err) {
				return nil, rc.gaveUp(rq, attempt+1, err)
			}
			continue
		}
		code := m.Header.Get(micro.ErrorCodeHeader)
		if code == "" {
			return m, nil
		}
		n, _ := strconv.Atoi(code)
		re := &RecoverError{Session: rc.session, Name: rq.Name, Code: n, Message: m.Header.Get(micro.ErrorHeader)}
		if n != 503 {
			return nil, re
		}
		last = re
	}
	return nil, rc.gaveUp(rq, attempt, last)
}

func (rc *recovery) gaveUp(rq events.RecoverRequest, attempts int, err error) error {
	return fmt.Errorf("%w: spill %s of session %s: no answer from seamguard's recover service on %s after %d attempt(s): %w",
		ErrNotRecovered, rq.Name, rc.session, rc.subject, attempts, err)
}
