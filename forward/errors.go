package forward

import "errors"

// Errors of the package. Failures carry details with %w around these.
var (
	// ErrConfig: a Config that Validate refuses.
	ErrConfig = errors.New("forward: bad config")
	// ErrMalformed: a message on a verdict subject that is not a
	// structured CloudEvent with data; it cannot be forwarded.
	ErrMalformed = errors.New("forward: not a forwardable verdict")
	// ErrUnverifiable: a verdict whose signature fails verification.
	ErrUnverifiable = errors.New("forward: verdict not attributable")
	// ErrConsumerMismatch: the durable consumer of that name exists with
	// other filters.
	ErrConsumerMismatch = errors.New("forward: consumer exists with other filters")
	// ErrNotKept: no undeliverable record of that sequence.
	ErrNotKept = errors.New("forward: no such undeliverable verdict")
)

// Reasons a verdict is kept as undeliverable (the reason label of
// seamguard_forward_undeliverable_total).
const (
	ReasonRejected     = "rejected"     // the receiver answered a permanent 4xx
	ReasonExhausted    = "exhausted"    // every attempt failed with a transient failure
	ReasonUnverifiable = "unverifiable" // the signature failed verification
	ReasonMalformed    = "malformed"    // not a structured CloudEvent with data
)
