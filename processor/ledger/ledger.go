package ledger

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/seamguard/seamguard/events"
)

// Errors Step returns when the caller breaks its protocol. They never depend on
// the input's content: any decoded event gets an output, never an error.
var (
	ErrSpillPending   = errors.New("ledger: a spill is pending: step its result first")
	ErrNoSpillPending = errors.New("ledger: a spill result arrived but no spill was asked for")
	ErrEmptyInput     = errors.New("ledger: input holds neither an event nor a spill result")
	ErrWrongSession   = errors.New("ledger: event belongs to another session")
)

// Policy says what to do when a compaction puts offsets at risk that no
// lossless path covers yet.
type Policy uint8

const (
	// PolicySpill (the zero value) writes the transcript to the object store
	// and refuses, so that a retry is allowed (rule 4).
	PolicySpill Policy = iota
	// PolicyHalt halts the session instead of spilling (rule 5).
	PolicyHalt
)

// Config holds the decision settings. The zero value spills.
type Config struct {
	Policy Policy
}

// Validate reports a Config that cannot be used.
func (c Config) Validate() error {
	if c.Policy > PolicyHalt {
		return fmt.Errorf("ledger: unknown policy %d", c.Policy)
	}
	return nil
}

type status uint8

const (
	statusNew status = iota // no session.opened accepted yet
	statusOpen
	statusHalted
	statusClosed
)

var statusNames = [...]string{"new", "open", "halted", "closed"}

func (s status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", s)
}

// unitCode packs a Unit into a byte; 0 is "no unit".
type unitCode uint8

var unitNames = [...]events.Unit{"", events.UnitTurns, events.UnitTokens, events.UnitMessages}

func codeOf(u events.Unit) unitCode {
	for i, n := range unitNames {
		if i > 0 && n == u {
			return unitCode(i)
		}
	}
	return 0
}

func (c unitCode) unit() events.Unit {
	if int(c) < len(unitNames) {
		return unitNames[c]
	}
	return ""
}

// recentIDs is how many event ids a ledger remembers to drop duplicates.
const recentIDs = 8

// maxEvalIDs bounds how many event ids one request_id remembers, for its
// requests and for its commits.
const maxEvalIDs = 16

// maxResumeIDs bounds how many session.resumed ids a ledger remembers.
const maxResumeIDs = 64

// request is what the ledger remembers of one request_id.
type request struct {
	evaluated bool     // some evaluation under rules 2 to 5 happened
	allowed   bool     // the latest such evaluation allowed it
	coverage  RangeSet // C of the latest such evaluation
	ids       []uint64 // hashes of the event ids that asked for it
	commits   []uint64 // hashes of the event ids that committed it
}

// pending is a compaction waiting for its spill (rule 4).
type pending struct {
	cause     events.Cause
	requestID string
	reasons   []events.Reason
	atRisk    RangeSet
}

// Ledger is the coverage ledger of one session. Its zero value is a session
// that has not been opened. A Ledger is owned by one goroutine at a time; Step
// changes it in place.
type Ledger struct {
	session   string
	status    status
	unit      unitCode
	floorUnit unitCode
	span      uint64
	head      uint64
	firstSeq  uint64 // stream sequence of session.opened
	lastSeq   uint64 // stream sequence of the last accepted event
	accepted  uint64 // accepted events, the lines a spill will hold

	received  RangeSet // offsets of the turns received
	truncated RangeSet // T
	committed RangeSet // K
	spilled   RangeSet // P
	waived    RangeSet // W

	spills    uint32              // spills written
	lastSpill *events.SpillHandle // the newest spill; it holds every spilled offset
	halt      *RangeSet           // unrecoverable ranges while halted
	haltReq   string              // request that halted the session
	requests  map[string]*request // by request_id
	pending   *pending            // the compaction waiting for its spill
	resumes   []uint64            // hashes of the session.resumed ids applied
	recent    [recentIDs]uint64   // hashes of the last accepted event ids
	recentPos uint8
}

// Input is one thing Step consumes: an input event, or the result of the spill
// the previous Step asked for.
type Input struct {
	Event *events.Event
	Spill *SpillResult
}

// SpillResult reports the spill a SpillRequest asked for. Failure is empty
// when the spill was written and verified, and says why not otherwise.
type SpillResult struct {
	Handle  events.SpillHandle
	Failure string
}

// SpillRequest asks the runtime to write the session's transcript losslessly:
// every accepted event from FirstSeq to LastSeq (Events of them), which hold
// every received offset of Range. The result must be the next Step's input.
type SpillRequest struct {
	Cause    events.Cause // the compaction request the spill is for
	Session  string
	N        uint32 // the spill's number within the session, from 1
	Name     string // object name: "<session>/<n>.jsonl"
	Range    Range
	FirstSeq uint64
	LastSeq  uint64
	Events   uint64
	// Previous is the name of the session's spill before this one, "" for
	// the first: this object holds only the events after the previous
	// one's LastSeq (an incremental spill), and Range is what the chain
	// makes recoverable.
	Previous string
	// MaxBytes is the most this object may hold (what is left of the
	// session's spill quota); 0 means no limit. A writer that would exceed
	// it fails the spill, which halts the session (rule 5).
	MaxBytes uint64
}

// Result is what one Step produced. Outputs must be published, and a Spill
// written and stepped, before the input is acknowledged.
type Result struct {
	Outputs []events.Output
	Spill   *SpillRequest
	// Accepted is true when the event belongs to the session's transcript: it
	// was neither rejected nor a duplicate.
	Accepted bool
	// Duplicate is true when the event's (source, id) was applied before; it
	// then produces no output and changes nothing.
	Duplicate bool
}

// Session returns the session id, empty for a ledger that saw no event.
func (l *Ledger) Session() string { return l.session }

// Head returns the end offset of the last turn received.
func (l *Ledger) Head() uint64 { return l.head }

// Opened reports whether a session.opened was accepted.
func (l *Ledger) Opened() bool { return l.status != statusNew }

// Halted reports whether the session refuses compactions until resumed.
func (l *Ledger) Halted() bool { return l.status == statusHalted }

// Closed reports whether the session was closed.
func (l *Ledger) Closed() bool { return l.status == statusClosed }

// Pending reports whether a spill was asked for and its result not yet stepped.
func (l *Ledger) Pending() bool { return l.pending != nil }

// Step applies one input to the ledger and returns what must happen because of
// it. It never does I/O and never reads a clock: the same ledger and input
// always give the same result. An error means the caller broke the protocol
// (see the Err variables); the ledger is then unchanged.
func Step(l *Ledger, in Input, cfg Config) (Result, error) {
	switch {
	case in.Spill != nil && in.Event == nil:
		if l.pending == nil {
			return Result{}, ErrNoSpillPending
		}
		return l.spillDone(in.Spill), nil
	case in.Event != nil && in.Spill == nil:
		if l.pending != nil {
			return Result{}, ErrSpillPending
		}
		ev := in.Event
		if l.session != "" && ev.Subject != l.session {
			return Result{}, fmt.Errorf("%w: ledger of %q, event for %q", ErrWrongSession, l.session, ev.Subject)
		}
		return l.step(ev, cfg), nil
	}
	return Result{}, ErrEmptyInput
}

func (l *Ledger) step(ev *events.Event, cfg Config) Result {
	h := idHash(ev.Source, ev.ID)
	if l.seen(h) {
		return Result{Duplicate: true}
	}
	var res Result
	switch b := ev.Body.(type) {
	case *events.SessionOpened:
		res = l.open(ev, b)
	case *events.TurnAppended:
		res = l.turn(ev, b)
	case *events.ContextTruncated:
		res = l.truncate(ev, b)
	case *events.CompactionRequested:
		res = l.request(ev, b, h, cfg)
	case *events.CompactionCommitted:
		res = l.commit(ev, b, h)
	case *events.SessionResumed:
		res = l.resume(ev, b, h)
	case *events.SessionClosed:
		res = l.close(ev)
	default:
		res = reject(ev, events.Errorf(events.CodeUnknownType, "type", "type %q has no data seamguard can apply; use one of the io.seamguard input types", ev.Type))
	}
	if res.Accepted {
		if l.session == "" {
			l.session = ev.Subject
		}
		l.remember(h)
		l.accepted++
		l.lastSeq = ev.Meta.Seq
	}
	return res
}

func (l *Ledger) seen(h uint64) bool {
	for _, x := range l.recent {
		if x == h && h != 0 {
			return true
		}
	}
	return false
}

func (l *Ledger) remember(h uint64) {
	l.recent[l.recentPos%recentIDs] = h
	l.recentPos = (l.recentPos + 1) % recentIDs
}

// idHash is FNV-1a over source, a zero byte and id; 0 is kept for "no id".
func idHash(source, id string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	x := uint64(offset)
	for i := 0; i < len(source); i++ {
		x = (x ^ uint64(source[i])) * prime
	}
	x *= prime
	for i := 0; i < len(id); i++ {
		x = (x ^ uint64(id[i])) * prime
	}
	if x == 0 {
		x = 1
	}
	return x
}

func accepted(outs ...events.Output) Result { return Result{Outputs: outs, Accepted: true} }

func reject(ev *events.Event, e *events.Error) Result {
	return Result{Outputs: []events.Output{Rejection(events.CauseOf(ev), ev.Subject, e)}}
}

// Rejection builds the event.rejected output for an input that failed, in
// decoding or in the ledger. session may be empty when it is unknown.
func Rejection(c events.Cause, session string, e *events.Error) events.Output {
	meta := c.Meta
	if meta.Headers == nil {
		meta.Headers = map[string][]string{}
	}
	return events.Output{
		Type:    events.TypeEventRejected,
		Session: session,
		Cause:   c,
		Data:    &events.EventRejected{Code: e.Code, Field: e.Field, Message: e.Message, Input: meta},
	}
}

// lifecycle rejects events for sessions that are not open (or halted).
func (l *Ledger) lifecycle(ev *events.Event) *events.Error {
	switch l.status {
	case statusNew:
		return events.Errorf(events.CodeUnknownSession, "subject", "session %q has not been opened; publish io.seamguard.session.opened first", ev.Subject)
	case statusClosed:
		return events.Errorf(events.CodeSessionClosed, "subject", "session %q is closed; start a new session id for new work", ev.Subject)
	}
	return nil
}

func (l *Ledger) open(ev *events.Event, b *events.SessionOpened) Result {
	if !b.Unit.Valid() {
		return reject(ev, events.Errorf(events.CodeBadData, "data.unit", "unit %q is not one of turns, tokens, messages", b.Unit))
	}
	if !b.RecoveryFloor.Unit.Valid() {
		return reject(ev, events.Errorf(events.CodeBadData, "data.recovery_floor.unit", "unit %q is not one of turns, tokens, messages", b.RecoveryFloor.Unit))
	}
	if b.RecoveryFloor.Span > events.MaxOffset {
		return reject(ev, events.Errorf(events.CodeBadData, "data.recovery_floor.span", "span %d is above the maximum %d", b.RecoveryFloor.Span, events.MaxOffset))
	}
	switch l.status {
	case statusClosed:
		return reject(ev, l.lifecycle(ev))
	case statusOpen, statusHalted:
		if l.unit.unit() == b.Unit && l.floorUnit.unit() == b.RecoveryFloor.Unit && l.span == b.RecoveryFloor.Span {
			return accepted() // the same configuration again changes nothing
		}
		return reject(ev, events.Errorf(events.CodeAlreadyOpen, "data",
			"session %q is already open with unit %s and a recovery floor of %d %s; a session keeps its configuration, use a new session id for another",
			l.session, l.unit.unit(), l.span, l.floorUnit.unit()))
	}
	l.status = statusOpen
	l.unit = codeOf(b.Unit)
	l.floorUnit = codeOf(b.RecoveryFloor.Unit)
	l.span = b.RecoveryFloor.Span
	l.firstSeq = ev.Meta.Seq
	return accepted()
}

func (l *Ledger) turn(ev *events.Event, b *events.TurnAppended) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	if b.Size == 0 {
		return reject(ev, events.Errorf(events.CodeBadData, "data.size", "size must be greater than 0"))
	}
	if b.Offset > events.MaxOffset || b.Size > events.MaxOffset-b.Offset {
		return reject(ev, events.Errorf(events.CodeBadData, "data.size", "offset + size is above the maximum offset %d", events.MaxOffset))
	}
	r := Range{Start: b.Offset, End: b.Offset + b.Size}
	if l.received.Overlaps(r) {
		clash := l.received.Within(r)
		return reject(ev, events.Errorf(events.CodeOffsetConflict, "data.offset",
			"turn [%d, %d) overlaps offsets %s already received (head is %d); a turn may only fill a gap, send the next turn at offset %d",
			r.Start, r.End, FormatRanges(clash.Ranges()), l.head, l.head))
	}
	l.received.Add(r)
	l.head = max(l.head, r.End)
	return accepted()
}

func (l *Ledger) truncate(ev *events.Event, b *events.ContextTruncated) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	r := b.Range
	if r.Start > r.End {
		return reject(ev, events.Errorf(events.CodeBadData, "data.range", "range start %d is after its end %d", r.Start, r.End))
	}
	if r.End > l.head {
		return reject(ev, events.Errorf(events.CodeRangeOutOfBounds, "data.range",
			"truncated range [%d, %d) reaches beyond head %d; only received offsets can be truncated", r.Start, r.End, l.head))
	}
	l.truncated.Add(r)
	return accepted()
}

func (l *Ledger) resume(ev *events.Event, b *events.SessionResumed, h uint64) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	if strings.TrimSpace(b.Note) == "" {
		return reject(ev, events.Errorf(events.CodeBadData, "data.note", "note is required: say why the lost offsets are accepted"))
	}
	// An operator's resume is applied once, however late a copy arrives:
	// a stale copy must never lift a later halt.
	if slices.Contains(l.resumes, h) {
		return Result{Duplicate: true}
	}
	l.resumes = appendBounded(l.resumes, h, maxResumeIDs)
	if l.status == statusHalted {
		if l.halt != nil {
			l.waived.AddSet(*l.halt)
		}
		l.status = statusOpen
		l.halt = nil
		l.haltReq = ""
	}
	return accepted()
}

func (l *Ledger) close(ev *events.Event) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	l.status = statusClosed
	return accepted()
}

func (l *Ledger) commit(ev *events.Event, b *events.CompactionCommitted, h uint64) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	if b.RequestID == "" {
		return reject(ev, events.Errorf(events.CodeBadData, "data.request_id", "request_id is required: name the compaction that was applied"))
	}
	rec := l.requests[b.RequestID]
	if rec == nil || !rec.evaluated {
		return accepted(violation(ev, b.RequestID, fmt.Sprintf(
			"compaction %q was committed but seamguard never decided it; nothing changed. Publish io.seamguard.compaction.requested and wait for its verdict before committing",
			b.RequestID)))
	}
	// A late copy of an old commit must not put back an older coverage.
	if slices.Contains(rec.commits, h) {
		return Result{Duplicate: true}
	}
	rec.commits = appendBounded(rec.commits, h, maxEvalIDs)
	l.committed = rec.coverage.Clone()
	if rec.allowed {
		return accepted()
	}
	return accepted(violation(ev, b.RequestID, fmt.Sprintf(
		"compaction %q was committed although its latest verdict refused it; the summary coverage is now %s and offsets outside it and the tail may be lost. Re-read the spilled transcript or stop the agent",
		b.RequestID, FormatRanges(rec.coverage.Ranges()))))
}

// appendBounded appends x to ids, dropping the oldest beyond limit.
func appendBounded(ids []uint64, x uint64, limit int) []uint64 {
	if len(ids) >= limit {
		ids = slices.Delete(ids, 0, len(ids)-limit+1)
	}
	return append(ids, x)
}

func violation(ev *events.Event, requestID, msg string) events.Output {
	return events.Output{
		Type:    events.TypeCompactionViolation,
		Session: ev.Subject,
		Cause:   events.CauseOf(ev),
		Data:    &events.CompactionViolation{RequestID: requestID, Message: msg},
	}
}

func refused(c events.Cause, session, requestID string, reasons []events.Reason, spill *events.SpillHandle, next string) events.Output {
	return events.Output{
		Type:    events.TypeCompactionRefused,
		Session: session,
		Cause:   c,
		Data:    &events.CompactionRefused{RequestID: requestID, Reasons: reasons, Spill: spill, Next: next},
	}
}

func (l *Ledger) request(ev *events.Event, b *events.CompactionRequested, h uint64, cfg Config) Result {
	c := events.CauseOf(ev)
	// Rule 1: unknown or closed sessions. The event is no part of a transcript.
	switch l.status {
	case statusNew:
		return Result{Outputs: []events.Output{refused(c, ev.Subject, b.RequestID, []events.Reason{{
			Code: events.ReasonUnknownSession, AtRisk: []Range{},
			Message: fmt.Sprintf("session %q has not been opened; publish io.seamguard.session.opened and its turns first", ev.Subject),
		}}, nil, events.NextNone)}}
	case statusClosed:
		return Result{Outputs: []events.Output{refused(c, ev.Subject, b.RequestID, []events.Reason{{
			Code: events.ReasonSessionClosed, AtRisk: []Range{},
			Message: fmt.Sprintf("session %q is closed; nothing can be compacted in it", ev.Subject),
		}}, nil, events.NextNone)}}
	}
	rec := l.requests[b.RequestID]
	if rec != nil && slices.Contains(rec.ids, h) {
		return Result{Duplicate: true}
	}
	if rec == nil {
		rec = &request{}
		if l.requests == nil {
			l.requests = make(map[string]*request)
		}
		l.requests[b.RequestID] = rec
	}
	rec.ids = appendBounded(rec.ids, h, maxEvalIDs)

	// Rule 1: invalid requests and halted sessions.
	if msg := l.invalid(b); msg != "" {
		return accepted(refused(c, ev.Subject, b.RequestID, []events.Reason{{
			Code: events.ReasonInvalidRequest, AtRisk: []Range{}, Message: msg,
		}}, nil, events.NextNone))
	}
	if l.status == statusHalted {
		var lost []Range
		if l.halt != nil {
			lost = l.halt.Ranges()
		}
		return accepted(refused(c, ev.Subject, b.RequestID, []events.Reason{{
			Code: events.ReasonSessionHalted, AtRisk: nonNil(lost),
			Message: fmt.Sprintf("session %q is halted since compaction %q: offsets %s cannot be recovered; an operator must publish io.seamguard.session.resumed to accept them as lost",
				ev.Subject, l.haltReq, FormatRanges(lost)),
		}}, nil, events.NextNone))
	}

	ev2 := l.Evaluate(b)
	rec.evaluated = true
	rec.coverage = ev2.Coverage
	rec.allowed = false

	// Rule 2.
	if len(ev2.Reasons) == 0 {
		rec.allowed = true
		return accepted(l.allowedOutput(c, b, ev2, nil, nil))
	}
	// Rule 3.
	rest := Diff(Diff(ev2.AtRisk, l.spilled), l.waived)
	if rest.IsEmpty() {
		rec.allowed = true
		var by []events.SpillHandle
		if l.lastSpill != nil && Intersects(ev2.AtRisk, l.spilled) {
			by = []events.SpillHandle{*l.lastSpill}
		}
		cured := make([]events.ReasonCode, len(ev2.Reasons))
		for i, r := range ev2.Reasons {
			cured[i] = r.Code
		}
		return accepted(l.allowedOutput(c, b, ev2, by, cured))
	}
	// Rule 5 before a spill is even tried.
	if unreceived := Diff(rest, l.received); !unreceived.IsEmpty() {
		return accepted(l.halted(c, b.RequestID, rest, fmt.Sprintf(
			"offsets %s were never received, so no spill can hold them", FormatRanges(unreceived.Ranges()))))
	}
	if cfg.Policy == PolicyHalt {
		return accepted(l.halted(c, b.RequestID, rest, "the policy halts instead of spilling"))
	}
	// Rule 4: ask for a spill; spillDone finishes the decision.
	l.pending = &pending{cause: c, requestID: b.RequestID, reasons: ev2.Reasons, atRisk: ev2.AtRisk}
	n := l.spills + 1
	res := accepted()
	res.Spill = &SpillRequest{
		Cause:    c,
		Session:  l.session,
		N:        n,
		Name:     fmt.Sprintf("%s/%d.jsonl", l.session, n),
		Range:    Range{Start: 0, End: l.head},
		FirstSeq: l.firstSeq,
		LastSeq:  ev.Meta.Seq,
		Events:   l.accepted + 1, // this request is part of the transcript
	}
	return res
}

func (l *Ledger) spillDone(r *SpillResult) Result {
	p := l.pending
	l.pending = nil
	if r.Failure != "" {
		rest := Diff(Diff(p.atRisk, l.spilled), l.waived)
		return Result{Outputs: []events.Output{l.halted(p.cause, p.requestID, rest, "the transcript could not be spilled: "+r.Failure)}}
	}
	l.spills++
	handle := r.Handle
	l.lastSpill = &handle
	l.spilled.AddSet(l.received.Within(Range{Start: 0, End: min(handle.Range.End, l.head)}))
	out := make([]events.Output, 0, 2)
	out = append(out, events.Output{Type: events.TypeTranscriptSpilled, Session: l.session, Cause: p.cause, Data: &handle})
	reasons := slices.Clone(p.reasons)
	out = append(out, refused(p.cause, l.session, p.requestID, reasons, &handle, events.NextRetry))
	return Result{Outputs: out}
}

func (l *Ledger) halted(c events.Cause, requestID string, lost RangeSet, why string) events.Output {
	l.status = statusHalted
	h := lost.Clone()
	l.halt = &h
	l.haltReq = requestID
	return events.Output{
		Type:    events.TypeSessionHalted,
		Session: l.session,
		Cause:   c,
		Data: &events.SessionHalted{
			RequestID:     requestID,
			Unrecoverable: nonNil(h.Ranges()),
			Message: fmt.Sprintf("session halted at compaction %q: offsets %s are at risk and cannot be recovered (%s). Every compaction is refused until an operator publishes io.seamguard.session.resumed with a note, accepting those offsets as lost",
				requestID, FormatRanges(h.Ranges()), why),
		},
	}
}

func (l *Ledger) allowedOutput(c events.Cause, b *events.CompactionRequested, e Evaluation, by []events.SpillHandle, cured []events.ReasonCode) events.Output {
	if by == nil {
		by = []events.SpillHandle{}
	}
	if cured == nil {
		cured = []events.ReasonCode{}
	}
	return events.Output{
		Type:    events.TypeCompactionAllowed,
		Session: l.session,
		Cause:   c,
		Data: &events.CompactionAllowed{
			RequestID:       b.RequestID,
			Head:            l.head,
			SummaryCoverage: nonNil(slices.Clone(e.Coverage.Ranges())),
			TailStart:       b.TailStart,
			RecoveredBy:     by,
			Cured:           cured,
		},
	}
}

// invalid returns why a request breaks rule 1, or "".
func (l *Ledger) invalid(b *events.CompactionRequested) string {
	var p []string
	if b.RequestID == "" {
		p = append(p, "request_id is empty")
	}
	if b.SummarizerInput.Start > b.SummarizerInput.End {
		p = append(p, fmt.Sprintf("summarizer_input starts at %d after its end %d", b.SummarizerInput.Start, b.SummarizerInput.End))
	}
	if b.SummaryRange.Start > b.SummaryRange.End {
		p = append(p, fmt.Sprintf("summary_range starts at %d after its end %d", b.SummaryRange.Start, b.SummaryRange.End))
	}
	if b.TailStart > l.head {
		p = append(p, fmt.Sprintf("tail_start %d is beyond head %d", b.TailStart, l.head))
	}
	if b.SummaryRange.End > l.head {
		p = append(p, fmt.Sprintf("summary_range ends at %d, beyond head %d", b.SummaryRange.End, l.head))
	}
	if len(p) == 0 {
		return ""
	}
	return "invalid compaction request: " + strings.Join(p, "; ") + ". Fix the request and send it again"
}

func nonNil(r []Range) []Range {
	if r == nil {
		return []Range{}
	}
	return r
}

// Intersects reports whether s and t share an offset.
func Intersects(s, t RangeSet) bool {
	if s.Len() > t.Len() {
		s, t = t, s
	}
	for _, r := range s.r {
		if t.Overlaps(r) {
			return true
		}
	}
	return false
}

// maxListed bounds how many ranges a message spells out.
const maxListed = 8

// FormatRanges writes ranges the way messages show them: "[0, 8), [12, 14)",
// "none" for no range, and "… and N more" past a few.
func FormatRanges(rs []Range) string {
	if len(rs) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, r := range rs {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more", len(rs)-maxListed)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%d, %d)", r.Start, r.End)
	}
	return b.String()
}
