package spill

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/seamguard/seamguard/internal/jsfail"
)

// Errors of the spill package.
var (
	ErrDigestMismatch = errors.New("spill: digest mismatch")
	// ErrIncomplete means the events stream no longer holds the whole
	// transcript (aged out, purged or deleted): no attempt can write it.
	ErrIncomplete = errors.New("spill: transcript incomplete")
	// ErrUnavailable means the transcript could not be read now although
	// nothing shows it is gone (a lagging replica, a leader election): a
	// caller should try again later rather than give the session up.
	ErrUnavailable = errors.New("spill: transcript unavailable for now")
	// ErrPermanent means a failure that another attempt cannot cure: a
	// bad request, a payload over the server's limit, a permission the
	// connection lacks, and every ErrStorageFull and ErrQuota. Write
	// returns it at once, without retrying.
	ErrPermanent = errors.New("spill: permanent failure")
	// ErrStorageFull means JetStream refused to store the spill: the
	// bucket is at its MaxBytes, or the server or account is out of
	// storage. The chunks written are purged; the bucket keeps every
	// spill it held. It matches ErrPermanent too.
	ErrStorageFull = errors.New("spill: storage full")
	// ErrQuota means the spill would exceed what is left of the session's
	// spill quota (SpillRequest.MaxBytes). It matches ErrPermanent too.
	ErrQuota = errors.New("spill: session spill quota exceeded")
	// ErrChain means a spill's chain cannot be followed: a previous spill
	// is missing or not a spill, the links are out of order or belong to
	// another session, they loop, or the chain is longer than MaxChain.
	ErrChain = errors.New("spill: broken chain")
)

// permanentError marks a failure that another attempt cannot cure; it
// matches ErrPermanent and what it wraps.
type permanentError struct{ err error }

func (e permanentError) Error() string   { return e.err.Error() }
func (e permanentError) Unwrap() []error { return []error{e.err, ErrPermanent} }

func permanent(err error) error { return permanentError{err} }

// storageFullError is a refusal for want of storage; it matches
// ErrStorageFull, ErrPermanent and what it wraps.
type storageFullError struct{ err error }

func (e storageFullError) Error() string {
	return e.err.Error() + " (storage full: the bucket is at its size limit, or JetStream is out of storage)"
}
func (e storageFullError) Unwrap() []error { return []error{e.err, ErrStorageFull, ErrPermanent} }

func storageFull(err error) error { return storageFullError{err} }

// classify turns the errors of JetStream that retrying cannot cure into
// ErrStorageFull or ErrPermanent ones (jsfail tells them apart); others
// are returned as they are. conn is asked for the last permission
// violation the server reported: a publish the server refuses for
// permissions gets no ack at all, only a timeout, so a timeout while such
// a violation names the bucket's subjects is taken as that refusal (the
// server names the subject only in the violation's text).
func classify(err error, conn *nats.Conn, bucket string) error {
	if err == nil || errors.Is(err, ErrPermanent) || errors.Is(err, ErrIncomplete) ||
		errors.Is(err, context.Canceled) {
		return err
	}
	switch {
	case jsfail.StorageFull(err):
		return storageFull(err)
	case jsfail.Permanent(err):
		return permanent(err)
	}
	if conn != nil && (errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)) {
		if le := conn.LastError(); errors.Is(le, nats.ErrPermissionViolation) &&
			strings.Contains(le.Error(), `"`+strings.TrimSuffix(Subjects(bucket), ">")) {
			// Not wrapped: a timeout would read as "NATS did not answer".
			return permanent(fmt.Errorf("%w: %v, after the server refused a publish to the bucket: %v", nats.ErrPermissionViolation, err, le))
		}
	}
	return err
}

// Permanent reports whether err is a failure that retrying cannot cure:
// one of this package's ErrPermanent, or a refusal of JetStream
// (jsfail.Permanent: storage or an account's resources exhausted, a stream
// or bucket at its limits, a message or header over the server's limits,
// a permission denied).
func Permanent(err error) bool {
	return errors.Is(err, ErrPermanent) || jsfail.Permanent(err)
}

func retryable(err error) bool {
	return !errors.Is(err, ErrIncomplete) && !errors.Is(err, ErrPermanent) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// ReadKind says why a Reader refused a read.
type ReadKind int

// The kinds of ReadError.
const (
	// ReadFailed: JetStream failed. Msg names what was being done, Err is
	// JetStream's error.
	ReadFailed ReadKind = iota + 1
	// ReadNotFound: the bucket has no object of the name (Err matches
	// jetstream.ErrObjectNotFound).
	ReadNotFound
	// ReadNotSpill: the object is a link, or not one Write wrote.
	ReadNotSpill
	// ReadOtherSession: the object is a spill of another session.
	ReadOtherSession
	// ReadBadRequest: the offset is past the spill's end, or the cursor is
	// not one a read of this spill returned for the offset.
	ReadBadRequest
	// ReadStale: the cursor was returned for another version of the spill
	// (its name was written again since).
	ReadStale
	// ReadDamaged: the spill's chunks do not fit its info.
	ReadDamaged
)

// ReadError is a read a Reader refused: Msg says what is wrong and what
// to do, as a service answers it; Err is the cause, when there is one.
type ReadError struct {
	Kind ReadKind
	Msg  string
	Err  error
}

// Error is Msg, and the cause's error when there is one.
func (e *ReadError) Error() string {
	if e.Err != nil {
		return "spill: " + e.Msg + ": " + e.Err.Error()
	}
	return "spill: " + e.Msg
}

// Unwrap returns the cause.
func (e *ReadError) Unwrap() error { return e.Err }
