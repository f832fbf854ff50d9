package events

import (
	"errors"
	"fmt"
)

// Code is a rejection code of io.seamguard.event.rejected (docs/contract.md, Outputs).
type Code string

// Rejection codes.
const (
	CodeMalformed        Code = "malformed"
	CodeMissingAttribute Code = "missing_attribute"
	CodeBadSpecversion   Code = "bad_specversion"
	CodeBadSessionID     Code = "bad_session_id"
	CodeSubjectMismatch  Code = "subject_mismatch"
	CodeUnknownType      Code = "unknown_type"
	CodeBadData          Code = "bad_data"
	CodeUnknownSession   Code = "unknown_session"
	CodeAlreadyOpen      Code = "already_open"
	CodeSessionClosed    Code = "session_closed"
	CodeOffsetConflict   Code = "offset_conflict"
	CodeRangeOutOfBounds Code = "range_out_of_bounds"
	// CodeTooLarge: an attribute or field is over its bound (see MaxIDBytes,
	// MaxNoteBytes); the rejection names the field.
	CodeTooLarge Code = "too_large"
	// CodeStateLimit: applying the event would take the session's ledger
	// past one of its configured limits; the session is halted at once.
	CodeStateLimit Code = "state_limit"
	// CodeNotPermitted: the event came on a subject that does not give it
	// the authority it needs: a session.resumed on the events subject, or
	// anything but a session.resumed on the control subject.
	CodeNotPermitted Code = "not_permitted"
)

// Bounds on input and output (docs/contract.md, "Bounds and failing closed").
const (
	// MaxIDBytes bounds id, source, request_id and every extension value.
	MaxIDBytes = 256
	// MaxNoteBytes bounds the note of session.resumed.
	MaxNoteBytes = 4096
	// MaxQuoteBytes bounds how much of any input value an output quotes.
	MaxQuoteBytes = 256
	// MaxAtRiskRanges bounds the at-risk ranges one reason lists.
	MaxAtRiskRanges = 1000
	// MaxOutputBytes is the most an output event may take, encoded.
	MaxOutputBytes = 64 << 10
)

// ReasonCode names a failed check or a rule-1 refusal of a compaction request
// (docs/contract.md, The decision).
type ReasonCode string

// Reason codes of the checks, then of rule 1.
const (
	ReasonUnitMismatch    ReasonCode = "unit_mismatch"
	ReasonFloorNotInTail  ReasonCode = "floor_not_in_tail"
	ReasonFloorNotInInput ReasonCode = "floor_not_in_input"
	ReasonReachNotInInput ReasonCode = "reach_not_in_input"
	ReasonSeamGap         ReasonCode = "seam_gap"
	ReasonCoverageHole    ReasonCode = "coverage_hole"
	ReasonSequenceGap     ReasonCode = "sequence_gap"
	ReasonPinDropped      ReasonCode = "pin_dropped" // a pinned offset left the context
	ReasonInvalidRequest  ReasonCode = "invalid_request"
	ReasonUnknownSession  ReasonCode = "unknown_session"
	ReasonSessionClosed   ReasonCode = "session_closed"
	ReasonSessionHalted   ReasonCode = "session_halted"
)

// Error is why an input was rejected: the contract's code, the offending field
// ("id", "data.offset", "data.recovery_floor.span", or "" when the whole
// message is at fault) and a message that says what to fix.
type Error struct {
	Code    Code
	Field   string
	Message string
	Err     error // the underlying cause, if any
}

func (e *Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("events: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("events: %s: %s: %s", e.Code, e.Field, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error.
func Errorf(code Code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrBrokenChain is what ChainWalk's errors for a link that does not hold
// wrap, unless the walk names another error (ChainWalk.Broken).
var ErrBrokenChain = errors.New("events: broken spill chain")
