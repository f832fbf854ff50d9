package spill

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// JetStream error codes (nats-server's server/jetstream_errors_generated.go)
// that say the storage is exhausted, or that the message can never be
// stored.
const (
	codeAccountResourcesExceeded = 10002 // JSAccountResourcesExceededErr
	codeInsufficientResources    = 10023 // JSInsufficientResourcesErr
	codeMemoryResourcesExceeded  = 10028 // JSMemoryResourcesExceededErr
	codeStorageResourcesExceeded = 10047 // JSStorageResourcesExceededErr
	codeMessageExceedsMaximum    = 10054 // JSStreamMessageExceedsMaximumErr
	codeStreamStoreFailed        = 10077 // JSStreamStoreFailedF: the store's own error as description
	codeHeaderExceedsMaximum     = 10097 // JSStreamHeaderExceedsMaximumErr
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
// ErrStorageFull or ErrPermanent ones; others are returned as they are.
// conn is asked for the last permission violation the server reported:
// a publish the server refuses for permissions gets no ack at all, only
// a timeout, so a timeout while such a violation names the bucket's
// subjects is taken as that refusal.
func classify(err error, conn *nats.Conn, bucket string) error {
	if err == nil || errors.Is(err, ErrPermanent) || errors.Is(err, ErrIncomplete) ||
		errors.Is(err, context.Canceled) {
		return err
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case codeAccountResourcesExceeded, codeInsufficientResources, codeMemoryResourcesExceeded, codeStorageResourcesExceeded:
			return storageFull(err)
		case codeMessageExceedsMaximum, codeHeaderExceedsMaximum:
			return permanent(err)
		case codeStreamStoreFailed:
			d := strings.ToLower(api.Description)
			switch {
			case strings.Contains(d, "maximum bytes") || strings.Contains(d, "maximum messages"):
				return storageFull(err) // a DiscardNew stream at its limits
			case strings.Contains(d, "too large"):
				return permanent(err)
			}
		}
		if api.Code == 403 {
			return permanent(err)
		}
	}
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrAuthorization) ||
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		return permanent(err)
	}
	// The same refusals where they arrive as text only.
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"insufficient resources", "insufficient storage", "maximum bytes exceeded", "maximum messages exceeded", "resource limits exceeded"} {
		if strings.Contains(msg, s) {
			return storageFull(err)
		}
	}
	for _, s := range []string{"maximum payload", "permissions violation", "exceeds maximum allowed"} {
		if strings.Contains(msg, s) {
			return permanent(err)
		}
	}
	if conn != nil && (errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)) {
		if le := conn.LastError(); errors.Is(le, nats.ErrPermissionViolation) &&
			strings.Contains(le.Error(), `"$O.`+bucket+`.`) {
			// Not wrapped: a timeout would read as "NATS did not answer".
			return permanent(fmt.Errorf("%w: %v, after the server refused a publish to the bucket: %v", nats.ErrPermissionViolation, err, le))
		}
	}
	return err
}

// Permanent reports whether err is a failure of JetStream that retrying
// cannot cure: storage or an account's resources exhausted, a stream or
// bucket at its limits, a message or header over the server's limits, a
// permission denied. The processor classifies its own failures with it.
func Permanent(err error) bool {
	return errors.Is(classify(err, nil, ""), ErrPermanent)
}

func retryable(err error) bool {
	return !errors.Is(err, ErrIncomplete) && !errors.Is(err, ErrPermanent) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
