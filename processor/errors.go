package processor

import "errors"

// The processor's errors, all in one place. The exported ones are returned
// (wrapped) to callers; match them with errors.Is.
var (
	// ErrNotReady wraps what Ready reports while the processor consumes but
	// cannot do all of its work.
	ErrNotReady = errors.New("processor: not ready")

	// ErrIncompatible is returned (wrapped) when an existing stream, bucket or
	// object store cannot serve seamguard as configured. Provision never
	// reconfigures such a resource: an operator must decide.
	ErrIncompatible = errors.New("processor: incompatible existing resource")

	// ErrBadState is returned (wrapped) for a session bucket value this build
	// cannot read.
	ErrBadState = errors.New("processor: unreadable session state")

	// ErrStoreMissing is wrapped in what Ready reports while a stream, bucket
	// or object store the processor needs does not exist.
	ErrStoreMissing = errors.New("processor: store missing")
)

// Errors the processor's parts hand to one another.
var (
	// errAtomicDisabled is the server's answer to a batch on a stream that does
	// not allow atomic batches (jsfail.CodeAtomicPublishDisabled).
	errAtomicDisabled = errors.New("processor: the stream does not allow atomic batch publishes")

	// errStopped means the fetcher stopped before it took the consumer over.
	errStopped = errors.New("processor: stopped")

	// errGaveUp wraps a transient failure that outlasted the retry budget.
	errGaveUp = errors.New("processor: retried too long")

	// errPermanent wraps a failure that retrying cannot fix.
	errPermanent = errors.New("processor: failure retrying cannot fix")

	// errPositionAnswer means an answer not in the expected form: it is read
	// the general way.
	errPositionAnswer = errors.New("processor: a lookup's answer is not in the usual form")

	// errLeaderBehind means the events stream's leader has not applied
	// what it holds up to a delivered input yet (elected a moment ago).
	errLeaderBehind = errors.New("processor: the events stream's leader is behind its log")

	// errFenced means another writer changed a session's stored state.
	errFenced = errors.New("processor: session state changed by another writer")
)
