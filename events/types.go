package events

import (
	"encoding/json"
	"strconv"
	"time"
)

// TypePrefix starts the type of every seamguard event, input or output.
const TypePrefix = "io.seamguard."

// Input event types (docs/contract.md, Inputs).
const (
	TypeSessionOpened       = TypePrefix + "session.opened"
	TypeTurnAppended        = TypePrefix + "turn.appended"
	TypeContextTruncated    = TypePrefix + "context.truncated"
	TypeContextPinned       = TypePrefix + "context.pinned"   // pinned turns
	TypeContextUnpinned     = TypePrefix + "context.unpinned" // pinned turns
	TypeCompactionRequested = TypePrefix + "compaction.requested"
	TypeCompactionCommitted = TypePrefix + "compaction.committed"
	TypeSessionResumed      = TypePrefix + "session.resumed"
	TypeSessionClosed       = TypePrefix + "session.closed"
)

// Output event types (docs/contract.md, Outputs).
const (
	TypeCompactionAllowed   = TypePrefix + "compaction.allowed"
	TypeCompactionRefused   = TypePrefix + "compaction.refused"
	TypeTranscriptSpilled   = TypePrefix + "transcript.spilled"
	TypeSessionHalted       = TypePrefix + "session.halted"
	TypeEventRejected       = TypePrefix + "event.rejected"
	TypeCompactionViolation = TypePrefix + "compaction.violation"
)

// Verdict kinds: the last token of a verdict subject.
const (
	KindAllowed   = "allowed"
	KindRefused   = "refused"
	KindSpilled   = "spilled"
	KindHalted    = "halted"
	KindRejected  = "rejected"
	KindViolation = "violation"
)

// MaxOffset is the largest offset, size or range bound seamguard accepts: 2^53,
// the largest integer every JSON implementation represents exactly. Bounding it
// also keeps offset+size from overflowing.
const MaxOffset = uint64(1) << 53

// Unit is what a session's offsets count.
type Unit string

// The units a session may declare.
const (
	UnitTurns    Unit = "turns"
	UnitTokens   Unit = "tokens"
	UnitMessages Unit = "messages"
)

// Valid reports whether u is one of the contract's units.
func (u Unit) Valid() bool {
	return u == UnitTurns || u == UnitTokens || u == UnitMessages
}

// Range is the half-open offset interval [Start, End). It is empty when
// Start == End. Which code a reversed range earns depends on the event:
// decoding rejects a reversed context.truncated range (bad_data), while a
// reversed compaction.requested range decodes and the ledger refuses it
// (invalid_request).
type Range struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

// Empty reports whether r holds no offset (including reversed ranges).
func (r Range) Empty() bool { return r.End <= r.Start }

// String returns r as a half-open interval, "[0, 5)", as verdict messages
// and the CLI write ranges (a list of them with %v prints "[[0, 5) [8, 9)]").
func (r Range) String() string {
	b := make([]byte, 0, 24)
	b = append(b, '[')
	b = strconv.AppendUint(b, r.Start, 10)
	b = append(b, ", "...)
	b = strconv.AppendUint(b, r.End, 10)
	return string(append(b, ')'))
}

// Len is the number of offsets in r, 0 for empty or reversed ranges.
func (r Range) Len() uint64 {
	if r.End <= r.Start {
		return 0
	}
	return r.End - r.Start
}

// Floor is a session's recovery floor: the last Span offsets must survive.
type Floor struct {
	Span uint64 `json:"span"`
	Unit Unit   `json:"unit"`
}

// SessionOpened is the data of io.seamguard.session.opened.
type SessionOpened struct {
	Unit          Unit    `json:"unit"`
	RecoveryFloor Floor   `json:"recovery_floor"`
	Window        *uint64 `json:"window,omitempty"`
	Trigger       *uint64 `json:"trigger,omitempty"`
}

// TurnAppended is the data of io.seamguard.turn.appended. Content is kept as
// raw JSON: seamguard never interprets it, spills preserve it.
type TurnAppended struct {
	Offset  uint64          `json:"offset"`
	Size    uint64          `json:"size"`
	Role    string          `json:"role,omitempty"`
	Tokens  *uint64         `json:"tokens,omitempty"`
	Content json.RawMessage `json:"content,omitempty"`
	// Pinned marks the turn as a rule that must stay in the agent's
	// working context.
	Pinned bool `json:"pinned,omitempty"`
}

// ContextTruncated is the data of io.seamguard.context.truncated.
type ContextTruncated struct {
	Range Range  `json:"range"`
	Stage string `json:"stage,omitempty"`
}

// ContextPinned is the data of io.seamguard.context.pinned: the received
// offsets in Range become pinned.
type ContextPinned struct {
	Range Range `json:"range"`
}

// ContextUnpinned is the data of io.seamguard.context.unpinned: the offsets
// in Range are pinned no more.
type ContextUnpinned struct {
	Range Range `json:"range"`
}

// CompactionRequested is the data of io.seamguard.compaction.requested.
type CompactionRequested struct {
	RequestID           string  `json:"request_id"`
	SummarizerInput     Range   `json:"summarizer_input"`
	SummaryRange        Range   `json:"summary_range"`
	TailStart           uint64  `json:"tail_start"`
	CarriesPriorSummary bool    `json:"carries_prior_summary"`
	Occupancy           *uint64 `json:"occupancy,omitempty"`
	Threshold           *uint64 `json:"threshold,omitempty"`
	// CarriedPins are the ranges the agent puts back into the new context
	// verbatim, outside the summary. A reversed
	// range decodes; the ledger refuses the request (invalid_request).
	CarriedPins []Range `json:"carried_pins,omitempty"`
	// CarriedPinsInvalid says why carried_pins was not a list of ranges
	// ("" when it was, or was absent); the ledger refuses such a request
	// with invalid_request. It is never encoded.
	CarriedPinsInvalid string `json:"-"`
}

// CompactionCommitted is the data of io.seamguard.compaction.committed.
type CompactionCommitted struct {
	RequestID string `json:"request_id"`
}

// SessionResumed is the data of io.seamguard.session.resumed.
type SessionResumed struct {
	Note string `json:"note"`
}

// SessionClosed is the data of io.seamguard.session.closed (it carries nothing).
type SessionClosed struct{}

// Event is one decoded, validated input event. Body holds a pointer to one of
// the data types above, chosen by Type. The envelope fields are kept so that a
// spill can write the event back as a structured CloudEvent whatever content
// mode it arrived in.
type Event struct {
	ID              string
	Source          string
	Type            string
	Subject         string
	Time            time.Time // zero when the event carried no time
	DataContentType string    // as received; empty means application/json
	// Extensions are the extension attributes other than the contract's own,
	// by lower-case name. Values are JSON: strings in binary mode, any JSON
	// scalar in structured mode.
	Extensions map[string]json.RawMessage
	Data       json.RawMessage // the data exactly as received, compacted
	Body       any

	Meta Meta // where the event came from; not part of the CloudEvent
}

// Meta says where an input came from, so that a rejection can point at it.
// Seq is the JetStream stream sequence, or the line number for offline input.
type Meta struct {
	Subject string              `json:"subject"`
	Seq     uint64              `json:"stream_seq"`
	Headers map[string][]string `json:"headers"`
	// HeadersOmitted counts the header values an event.rejected left out
	// of Headers to stay small (see EchoHeaders); 0 everywhere else.
	HeadersOmitted int `json:"headers_omitted,omitempty"`
	// Control is true for an input that arrived on its session's control
	// subject (Subjects.Control), which deployments grant to operators
	// alone, or that an operator's own input file holds. Only there does a
	// session.resumed count.
	Control bool `json:"-"`
}

// Cause identifies the input an output answers. Output ids are derived from it.
type Cause struct {
	ID     string // the input's CloudEvents id; empty when it had none
	Source string
	Meta   Meta
	// ReadID is the id read from an input that could not be decoded (see
	// ReadableID), when ID is empty: outputs carry it as their
	// causationid, but their own ids still derive from the subject and
	// sequence.
	ReadID string
}

// CauseOf returns the cause that identifies ev.
func CauseOf(ev *Event) Cause {
	return Cause{ID: ev.ID, Source: ev.Source, Meta: ev.Meta}
}

// Output is one event seamguard emits. Data is a pointer to one of the output
// data types below, chosen by Type. Session may be empty only for a rejection
// of an input whose session could not be determined.
type Output struct {
	Type    string
	Session string
	Cause   Cause
	Data    any
}

// Kind returns the verdict kind of o, the last token of its subject.
func (o Output) Kind() string {
	switch o.Type {
	case TypeCompactionAllowed:
		return KindAllowed
	case TypeCompactionRefused:
		return KindRefused
	case TypeTranscriptSpilled:
		return KindSpilled
	case TypeSessionHalted:
		return KindHalted
	case TypeEventRejected:
		return KindRejected
	case TypeCompactionViolation:
		return KindViolation
	}
	return ""
}

// SpillHandle names a lossless transcript in the object store and proves it.
type SpillHandle struct {
	Bucket   string `json:"bucket"`
	Name     string `json:"name"`
	Digest   string `json:"digest"`
	Size     uint64 `json:"size"`
	Range    Range  `json:"range"`
	Events   uint64 `json:"events"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// Previous names the spill before this one in the session's chain, nil
	// for the first. Range covers the whole chain; FirstSeq, LastSeq,
	// Events, Size and Digest describe this object alone.
	Previous *string `json:"previous"`
}

// Reason is one failed check of a compaction request, or the rule-1 reason of
// a refusal, with the offsets it puts at risk.
type Reason struct {
	Code    ReasonCode `json:"code"`
	Message string     `json:"message"`
	AtRisk  []Range    `json:"at_risk"`
	// AtRiskTruncated is true when AtRisk lists only the first
	// MaxAtRiskRanges ranges; AtRiskTotal then counts them all.
	AtRiskTruncated bool         `json:"at_risk_truncated,omitempty"`
	AtRiskTotal     *AtRiskTotal `json:"at_risk_total,omitempty"`
}

// AtRiskTotal counts every range of a list that an output cut short: a
// reason's at_risk, a halt's unrecoverable, an allowed's summary_coverage.
type AtRiskTotal struct {
	Ranges uint64 `json:"ranges"`
	Units  uint64 `json:"units"`
}

// Next tells an agent what to do after a refusal.
const (
	NextRetry = "retry" // a retry of the same compaction will be allowed
	NextNone  = "none"  // a retry will not help as it stands
	// NextCarryPins: the compaction drops pinned turns; send it again with
	// them in carried_pins.
	NextCarryPins = "carry_pins"
)

// CompactionAllowed is the data of io.seamguard.compaction.allowed.
type CompactionAllowed struct {
	RequestID       string        `json:"request_id"`
	Head            uint64        `json:"head"`
	SummaryCoverage []Range       `json:"summary_coverage"`
	TailStart       uint64        `json:"tail_start"`
	RecoveredBy     []SpillHandle `json:"recovered_by"`
	Cured           []ReasonCode  `json:"cured"`
	// SummaryCoverageTruncated is true when SummaryCoverage lists only its
	// first MaxAtRiskRanges ranges; SummaryCoverageTotal then counts them all.
	SummaryCoverageTruncated bool         `json:"summary_coverage_truncated,omitempty"`
	SummaryCoverageTotal     *AtRiskTotal `json:"summary_coverage_total,omitempty"`
}

// CompactionRefused is the data of io.seamguard.compaction.refused.
type CompactionRefused struct {
	RequestID string       `json:"request_id"`
	Reasons   []Reason     `json:"reasons"`
	Spill     *SpillHandle `json:"spill"`
	Next      string       `json:"next"`
	// Cured names the failed checks that spills or waivers already cover,
	// on a refusal that pin_dropped alone causes; Reasons then lists
	// pin_dropped alone. Absent on every other
	// refusal.
	Cured []ReasonCode `json:"cured,omitempty"`
}

// SessionHalted is the data of io.seamguard.session.halted.
type SessionHalted struct {
	RequestID     string  `json:"request_id"`
	Unrecoverable []Range `json:"unrecoverable"`
	Message       string  `json:"message"`
	// UnrecoverableTruncated is true when Unrecoverable lists only its
	// first MaxAtRiskRanges ranges; UnrecoverableTotal then counts them all.
	UnrecoverableTruncated bool         `json:"unrecoverable_truncated,omitempty"`
	UnrecoverableTotal     *AtRiskTotal `json:"unrecoverable_total,omitempty"`
}

// EventRejected is the data of io.seamguard.event.rejected.
type EventRejected struct {
	Code    Code   `json:"code"`
	Field   string `json:"field"`
	Message string `json:"message"`
	Input   Meta   `json:"input"`
}

// CompactionViolation is the data of io.seamguard.compaction.violation.
type CompactionViolation struct {
	RequestID string `json:"request_id"`
	Message   string `json:"message"`
}
