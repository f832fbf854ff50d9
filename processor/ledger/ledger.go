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

// Config holds the decision settings. The zero value spills, with the
// default limits.
type Config struct {
	Policy Policy
	Limits Limits
}

// Validate reports every problem of a Config that cannot be used, at once.
func (c Config) Validate() error {
	var errs []error
	if c.Policy > PolicyHalt {
		errs = append(errs, fmt.Errorf("ledger: unknown policy %d", c.Policy))
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
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

// maxForgotten bounds how many hashes of forgotten request ids a ledger
// keeps, to tell a commit of a forgotten request from one never decided.
const maxForgotten = 1024

// request is what the ledger remembers of one request_id.
type request struct {
	evaluated bool     // some evaluation under rules 2 to 5 happened
	allowed   bool     // the latest such evaluation allowed it
	coverage  RangeSet // C of the latest such evaluation
	ids       []uint64 // hashes of the event ids that asked for it
	commits   []uint64 // hashes of the event ids that committed it
	used      uint64   // when it was last requested or committed (Ledger.tick)
}

// pending is a compaction waiting for its spill (rule 4).
type pending struct {
	cause     events.Cause
	requestID string
	reasons   []events.Reason // as the refusal will list them: cut short
	atRisk    RangeSet        // all of them
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
	pinned    RangeSet // N: received offsets pinned to the working context

	spills    uint32              // spills written
	lastSpill *events.SpillHandle // the newest spill; its chain holds every spilled offset
	// spillAccepted counts the accepted events the chain of spills holds
	// (those up to the newest spill's last_seq); spillBytes is the sum of
	// the spills' sizes, what the quota is held against.
	spillAccepted uint64
	spillBytes    uint64
	halt          *RangeSet           // unrecoverable ranges while halted
	haltReq       string              // request that halted the session; "" for a state limit
	requests      map[string]*request // by request_id
	tick          uint64              // the last request.used given out
	// forgotten holds the hashes (reqHash) of the evaluated request ids
	// forgotten most recently, oldest first; forgottenAll counts every one
	// ever forgotten.
	forgotten    []uint64
	forgottenAll uint64
	pending      *pending          // the compaction waiting for its spill
	resumes      []uint64          // hashes of the session.resumed ids applied
	recent       [recentIDs]uint64 // hashes of the last accepted event ids
	recentPos    uint8

	// The snapshot size estimate (see fits); not part of the snapshot.
	sized bool
	size  int // bytes when last measured
	slack int // bound on what was added since
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
	// OverQuota, with Failure, says the spill was not written because it
	// would hold more than the request's MaxBytes: the session's spill
	// quota is used up (rule 5).
	OverQuota bool
}

// SpillRequest asks the runtime to write the session's transcript losslessly,
// incrementally: the accepted events from FirstSeq to LastSeq (Events of
// them), the ones no earlier spill of the session holds. With the chain of
// spills before it (Previous, its Previous, ...) it holds every received
// offset of Range. The result must be the next Step's input.
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
	// it fails the spill with SpillResult.OverQuota, which halts the
	// session (rule 5); so does a handle larger than MaxBytes.
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
	lim := cfg.Limits.orDefaults()
	switch {
	case in.Spill != nil && in.Event == nil:
		if l.pending == nil {
			return Result{}, ErrNoSpillPending
		}
		return l.stepSpill(in.Spill, lim), nil
	case in.Event != nil && in.Spill == nil:
		if l.pending != nil {
			return Result{}, ErrSpillPending
		}
		ev := in.Event
		if l.session != "" && ev.Subject != l.session {
			return Result{}, fmt.Errorf("%w: ledger of %q, event for %q", ErrWrongSession, events.Excerpt(l.session), events.Excerpt(ev.Subject))
		}
		return l.step(ev, cfg, lim), nil
	}
	return Result{}, ErrEmptyInput
}

func (l *Ledger) step(ev *events.Event, cfg Config, lim Limits) Result {
	h := idHash(ev.Source, ev.ID)
	if l.seen(h) {
		return Result{Duplicate: true}
	}
	if e := authority(ev); e != nil {
		return reject(ev, e)
	}
	limit := lim.MaxSnapshotBytes - haltReserve
	growth := l.growth(ev)
	// A request that will be decided is evaluated first: what it may add
	// follows from its evaluation, which the decision then uses.
	var pre *prejudged
	if b, ok := ev.Body.(*events.CompactionRequested); ok && l.evaluates(b, h) {
		pre = l.prejudge(b)
		growth += l.requestGrowth(b, ev, pre, lim)
	}
	res, ok, size := l.fits(limit, growth, func(x *Ledger) Result { return x.apply(ev, h, cfg, lim, pre) })
	if !ok {
		return l.limitHit(ev, "ledger.snapshot", fmt.Sprintf(
			"applying this event would take the session's state to %d bytes, past its limit of %d bytes (%d less than MaxSnapshotBytes, kept for a halt)",
			size, limit, haltReserve), l.concerned(ev), lim)
	}
	return res
}

func (l *Ledger) stepSpill(r *SpillResult, lim Limits) Result {
	limit := lim.MaxSnapshotBytes - haltReserve
	res, ok, size := l.fits(limit, l.spillGrowth(r), func(x *Ledger) Result { return x.spillDone(r, lim) })
	if ok {
		return res
	}
	p := l.pending
	l.pending = nil
	return Result{Outputs: []events.Output{l.halted(p.cause, p.requestID, NewRangeSet(Range{Start: 0, End: l.head}), fmt.Sprintf(
		"recording the spill would take the session's state to %d bytes, past its limit of %d bytes", size, limit), lim)}}
}

// apply applies an event that is not a duplicate. pre, when not nil, is a
// compaction request prejudged against the ledger as it stands.
func (l *Ledger) apply(ev *events.Event, h uint64, cfg Config, lim Limits, pre *prejudged) Result {
	var res Result
	switch b := ev.Body.(type) {
	case *events.SessionOpened:
		res = l.open(ev, b)
	case *events.TurnAppended:
		res = l.turn(ev, b, lim)
	case *events.ContextTruncated:
		res = l.truncate(ev, b, lim)
	case *events.ContextPinned:
		res = l.pin(ev, b.Range, true, lim)
	case *events.ContextUnpinned:
		res = l.pin(ev, b.Range, false, lim)
	case *events.CompactionRequested:
		res = l.request(ev, b, h, cfg, lim, pre)
	case *events.CompactionCommitted:
		res = l.commit(ev, b, h, lim)
	case *events.SessionResumed:
		res = l.resume(ev, b, h, lim)
	case *events.SessionClosed:
		res = l.close(ev)
	default:
		res = reject(ev, events.Errorf(events.CodeUnknownType, "type", "type %q has no data seamguard can apply; use one of the io.seamguard input types", events.Excerpt(ev.Type)))
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

// reqHash names a forgotten request id: idHash with a source no event has.
func reqHash(requestID string) uint64 { return idHash("\x00request", requestID) }

func accepted(outs ...events.Output) Result { return Result{Outputs: outs, Accepted: true} }

// authority checks that ev came where its type may come from
// (docs/contract.md, Inputs; docs/security.md): a session.resumed only on
// the control subject,
// which deployments grant to operators alone, and nothing else there.
func authority(ev *events.Event) *events.Error {
	_, resumed := ev.Body.(*events.SessionResumed)
	switch {
	case resumed && !ev.Meta.Control:
		return events.Errorf(events.CodeNotPermitted, "type",
			"a session.resumed lifts a halt only when an operator publishes it on the session's control subject (seamguard resume does); on the events subject it is not permitted")
	case !resumed && ev.Meta.Control:
		return events.Errorf(events.CodeNotPermitted, "type",
			"the control subject carries session.resumed only; publish %s on the session's events subject", events.Excerpt(ev.Type))
	}
	return nil
}

func reject(ev *events.Event, e *events.Error) Result {
	return Result{Outputs: []events.Output{Rejection(events.CauseOf(ev), ev.Subject, e)}}
}

// Rejection builds the event.rejected output for an input that failed, in
// decoding or in the ledger. session may be empty when it is unknown. The
// input it echoes is bounded: the NATS subject through events.Excerpt, the
// headers through events.EchoHeaders, the field through events.Excerpt.
func Rejection(c events.Cause, session string, e *events.Error) events.Output {
	in := events.Meta{Subject: events.Excerpt(c.Meta.Subject), Seq: c.Meta.Seq}
	in.Headers, in.HeadersOmitted = events.EchoHeaders(c.Meta.Headers)
	return events.Output{
		Type:    events.TypeEventRejected,
		Session: session,
		Cause:   c,
		Data:    &events.EventRejected{Code: e.Code, Field: events.Excerpt(e.Field), Message: e.Message, Input: in},
	}
}

// lifecycle rejects events for sessions that are not open (or halted).
func (l *Ledger) lifecycle(ev *events.Event) *events.Error {
	switch l.status {
	case statusNew:
		return events.Errorf(events.CodeUnknownSession, "subject", "session %q has not been opened; publish io.seamguard.session.opened first", events.Excerpt(ev.Subject))
	case statusClosed:
		return events.Errorf(events.CodeSessionClosed, "subject", "session %q is closed; start a new session id for new work", events.Excerpt(ev.Subject))
	}
	return nil
}

func (l *Ledger) open(ev *events.Event, b *events.SessionOpened) Result {
	if !b.Unit.Valid() {
		return reject(ev, events.Errorf(events.CodeBadData, "data.unit", "unit %q is not one of turns, tokens, messages", events.Excerpt(string(b.Unit))))
	}
	if !b.RecoveryFloor.Unit.Valid() {
		return reject(ev, events.Errorf(events.CodeBadData, "data.recovery_floor.unit", "unit %q is not one of turns, tokens, messages", events.Excerpt(string(b.RecoveryFloor.Unit))))
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
			events.Excerpt(l.session), l.unit.unit(), l.span, l.floorUnit.unit()))
	}
	l.status = statusOpen
	l.unit = codeOf(b.Unit)
	l.floorUnit = codeOf(b.RecoveryFloor.Unit)
	l.span = b.RecoveryFloor.Span
	l.firstSeq = ev.Meta.Seq
	return accepted()
}

// tooMany is the state_limit of a range set that would hold n ranges.
func tooMany(set, what string, n int, lim Limits) string {
	return fmt.Sprintf("%s would give the ledger's %s set %d ranges, more than its limit of %d (MaxRanges)", what, set, n, lim.MaxRanges)
}

func (l *Ledger) turn(ev *events.Event, b *events.TurnAppended, lim Limits) Result {
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
	if n := l.received.LenAfterAdd(r); n > lim.MaxRanges {
		return l.limitHit(ev, "ledger.received", tooMany("received", fmt.Sprintf("the turn [%d, %d), leaving gaps,", r.Start, r.End), n, lim), NewRangeSet(r), lim)
	}
	if b.Pinned {
		if n := l.pinned.LenAfterAdd(r); n > lim.MaxRanges {
			return l.limitHit(ev, "ledger.pinned", tooMany("pinned", fmt.Sprintf("pinning the turn [%d, %d)", r.Start, r.End), n, lim), NewRangeSet(r), lim)
		}
	}
	l.received.Add(r)
	l.head = max(l.head, r.End)
	if b.Pinned {
		l.pinned.Add(r)
	}
	return accepted()
}

// pin applies context.pinned (on) or context.unpinned: the received offsets
// of r join the pinned set N, or every offset of r leaves it.
func (l *Ledger) pin(ev *events.Event, r Range, on bool, lim Limits) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	what := "unpinned"
	if on {
		what = "pinned"
	}
	if r.Start > r.End {
		return reject(ev, events.Errorf(events.CodeBadData, "data.range", "range start %d is after its end %d", r.Start, r.End))
	}
	if r.End > l.head {
		return reject(ev, events.Errorf(events.CodeRangeOutOfBounds, "data.range",
			"range [%d, %d) to be %s reaches beyond head %d; only received offsets can be %s", r.Start, r.End, what, l.head, what))
	}
	var next RangeSet
	if on {
		next = Union(l.pinned, l.received.Within(r))
	} else {
		next = Diff(l.pinned, NewRangeSet(r))
	}
	if n := next.Len(); n > lim.MaxRanges {
		return l.limitHit(ev, "ledger.pinned", tooMany("pinned", fmt.Sprintf("the range [%d, %d) %s", r.Start, r.End, what), n, lim), NewRangeSet(r), lim)
	}
	l.pinned = next
	return accepted()
}

func (l *Ledger) truncate(ev *events.Event, b *events.ContextTruncated, lim Limits) Result {
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
	if n := l.truncated.LenAfterAdd(r); n > lim.MaxRanges {
		return l.limitHit(ev, "ledger.truncated", tooMany("truncated", fmt.Sprintf("the truncation [%d, %d)", r.Start, r.End), n, lim), NewRangeSet(r), lim)
	}
	l.truncated.Add(r)
	return accepted()
}

func (l *Ledger) resume(ev *events.Event, b *events.SessionResumed, h uint64, lim Limits) Result {
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
	if l.status == statusHalted && l.halt != nil {
		if w := Union(l.waived, *l.halt); w.Len() > lim.MaxRanges {
			return l.limitHit(ev, "ledger.waived", tooMany("waived", "waiving the unrecoverable offsets", w.Len(), lim), *l.halt, lim)
		}
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

// wasForgotten says whether requestID is among the forgotten ids the ledger
// still holds hashes of (known), and whether some forgotten ids are not
// held any more (so an id not found may have been forgotten too).
func (l *Ledger) wasForgotten(requestID string) (known, unsure bool) {
	return slices.Contains(l.forgotten, reqHash(requestID)), l.forgottenAll > uint64(len(l.forgotten))
}

func (l *Ledger) commit(ev *events.Event, b *events.CompactionCommitted, h uint64, lim Limits) Result {
	if e := l.lifecycle(ev); e != nil {
		return reject(ev, e)
	}
	if b.RequestID == "" {
		return reject(ev, events.Errorf(events.CodeBadData, "data.request_id", "request_id is required: name the compaction that was applied"))
	}
	id := events.Excerpt(b.RequestID)
	rec := l.requests[b.RequestID]
	if rec == nil {
		known, unsure := l.wasForgotten(b.RequestID)
		switch {
		case known:
			// The agent's context changed in a way seamguard cannot know:
			// it credits no prior summary from now on (fail closed).
			l.committed = RangeSet{}
			return accepted(violation(ev, b.RequestID, fmt.Sprintf(
				"compaction %q was committed but seamguard no longer remembers that request: it keeps only the %d most recently used request ids. It cannot tell what the summary now covers, so it credits no prior summary from now on. Commit a compaction soon after its verdict",
				id, lim.MaxRequests)))
		case unsure:
			l.committed = RangeSet{}
			return accepted(violation(ev, b.RequestID, fmt.Sprintf(
				"compaction %q was committed but seamguard has no record of it: either it never decided it, or it decided it long ago and no longer remembers the request (it keeps the %d most recently used request ids). It cannot tell what the summary now covers, so it credits no prior summary from now on. Wait for a compaction's verdict and commit it soon after",
				id, lim.MaxRequests)))
		}
	}
	if rec == nil || !rec.evaluated {
		return accepted(violation(ev, b.RequestID, fmt.Sprintf(
			"compaction %q was committed but seamguard never decided it; nothing changed. Publish io.seamguard.compaction.requested and wait for its verdict before committing",
			id)))
	}
	// A late copy of an old commit must not put back an older coverage.
	if slices.Contains(rec.commits, h) {
		return Result{Duplicate: true}
	}
	if n := rec.coverage.Len(); n > lim.MaxRanges {
		return l.limitHit(ev, "ledger.committed", tooMany("committed", fmt.Sprintf("committing compaction %q", id), n, lim), NewRangeSet(Range{Start: 0, End: l.head}), lim)
	}
	rec.commits = appendBounded(rec.commits, h, maxEvalIDs)
	l.tick++
	rec.used = l.tick
	l.committed = rec.coverage.Clone()
	if rec.allowed {
		return accepted()
	}
	return accepted(violation(ev, b.RequestID, fmt.Sprintf(
		"compaction %q was committed although its latest verdict refused it; the summary coverage is now %s and offsets outside it and the tail may be lost. Re-read the spilled transcript or stop the agent",
		id, FormatRanges(rec.coverage.Ranges()))))
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
		Data:    &events.CompactionViolation{RequestID: events.Excerpt(requestID), Message: msg},
	}
}

func refused(c events.Cause, session, requestID string, reasons []events.Reason, spill *events.SpillHandle, next string, lim Limits) events.Output {
	return events.Output{
		Type:    events.TypeCompactionRefused,
		Session: session,
		Cause:   c,
		Data:    &events.CompactionRefused{RequestID: events.Excerpt(requestID), Reasons: cutReasons(reasons, lim.listed), Spill: spill, Next: next},
	}
}

// touch returns the record of requestID, made if need be, marked as used
// now and as asked for by the event whose id hashes to h. Making one beyond
// MaxRequests forgets the least recently used (the lowest used stamp).
func (l *Ledger) touch(requestID string, h uint64, lim Limits) *request {
	rec := l.requests[requestID]
	if rec == nil {
		for len(l.requests) >= lim.MaxRequests {
			l.forgetOldest()
		}
		rec = &request{}
		if l.requests == nil {
			l.requests = make(map[string]*request)
		}
		l.requests[requestID] = rec
	}
	rec.ids = appendBounded(rec.ids, h, maxEvalIDs)
	l.tick++
	rec.used = l.tick
	return rec
}

func (l *Ledger) forgetOldest() {
	var oldest string
	var at uint64
	first := true
	for id, r := range l.requests {
		if first || r.used < at || r.used == at && id < oldest {
			oldest, at, first = id, r.used, false
		}
	}
	if l.requests[oldest].evaluated {
		l.forgotten = appendBounded(l.forgotten, reqHash(oldest), maxForgotten)
		l.forgottenAll++
	}
	delete(l.requests, oldest)
}

func (l *Ledger) request(ev *events.Event, b *events.CompactionRequested, h uint64, cfg Config, lim Limits, pre *prejudged) Result {
	c := events.CauseOf(ev)
	// Rule 1: unknown or closed sessions. The event is no part of a transcript.
	if out, ok := l.notOpen(c, ev.Subject, b.RequestID, lim); ok {
		return Result{Outputs: []events.Output{out}}
	}
	if rec := l.requests[b.RequestID]; rec != nil && slices.Contains(rec.ids, h) {
		return Result{Duplicate: true}
	}

	// Rule 1: invalid requests and halted sessions.
	if msg := l.invalid(b); msg != "" {
		l.touch(b.RequestID, h, lim)
		return accepted(refused(c, ev.Subject, b.RequestID, []events.Reason{{
			Code: events.ReasonInvalidRequest, AtRisk: []Range{}, Message: msg,
		}}, nil, events.NextNone, lim))
	}
	if l.status == statusHalted {
		l.touch(b.RequestID, h, lim)
		return accepted(l.stillHalted(c, ev.Subject, b.RequestID, lim))
	}

	// The checks change nothing; the limits are checked before the ledger
	// is, so that an event over a limit leaves it as it was.
	if pre == nil {
		pre = l.prejudge(b)
	}
	e := pre.e
	whole := NewRangeSet(Range{Start: 0, End: l.head})
	if n := e.Coverage.Len(); n > lim.MaxRanges {
		return l.limitHit(ev, "ledger.coverage", tooMany("summary coverage", fmt.Sprintf("compaction %q", events.Excerpt(b.RequestID)), n, lim), whole, lim)
	}
	decided := func(allowed bool) {
		rec := l.touch(b.RequestID, h, lim)
		rec.evaluated, rec.allowed, rec.coverage = true, allowed, e.Coverage
	}

	// Rule 2.
	if len(e.Reasons) == 0 {
		decided(true)
		return accepted(l.allowedOutput(c, b, e, nil, nil, lim))
	}
	// Rules 3 to 5 are about the other checks alone: no spill or waiver
	// cures pin_dropped (docs/contract.md, The decision).
	rest := pre.rest
	if rest.IsEmpty() && !e.Dropped.IsEmpty() {
		decided(false)
		return accepted(pinsDropped(c, ev.Subject, b.RequestID, e, lim))
	}
	// Rule 3.
	if rest.IsEmpty() {
		decided(true)
		return accepted(l.allowedBySpills(c, b, e, lim))
	}
	// Rule 5 before a spill is even tried.
	if why := l.cannotSpill(rest, cfg, lim); why != "" {
		if n := rest.Len(); n > lim.MaxRanges {
			return l.limitHit(ev, "ledger.halt", tooMany("halt", fmt.Sprintf("halting at compaction %q (%s)", events.Excerpt(b.RequestID), why), n, lim), whole, lim)
		}
		decided(false)
		return accepted(l.halted(c, b.RequestID, rest, why, lim))
	}
	// Rule 4: ask for the spill of what no earlier spill holds; spillDone
	// finishes the decision.
	decided(false)
	return l.askSpill(c, ev, b, e, lim)
}

// notOpen is the refusal of a request in a session never opened or
// closed, and whether there is one.
func (l *Ledger) notOpen(c events.Cause, subject, requestID string, lim Limits) (events.Output, bool) {
	session := events.Excerpt(subject)
	switch l.status {
	case statusNew:
		return refused(c, subject, requestID, []events.Reason{{
			Code: events.ReasonUnknownSession, AtRisk: []Range{},
			Message: fmt.Sprintf("session %q has not been opened; publish io.seamguard.session.opened and its turns first", session),
		}}, nil, events.NextNone, lim), true
	case statusClosed:
		return refused(c, subject, requestID, []events.Reason{{
			Code: events.ReasonSessionClosed, AtRisk: []Range{},
			Message: fmt.Sprintf("session %q is closed; nothing can be compacted in it", session),
		}}, nil, events.NextNone, lim), true
	}
	return events.Output{}, false
}

// stillHalted is the refusal of a request in a halted session: the
// offsets lost, and how an operator resumes it.
func (l *Ledger) stillHalted(c events.Cause, subject, requestID string, lim Limits) events.Output {
	session := events.Excerpt(subject)
	var lost []Range
	if l.halt != nil {
		lost = l.halt.Ranges()
	}
	msg := fmt.Sprintf("session %q is halted since compaction %q: offsets %s cannot be recovered; an operator must publish io.seamguard.session.resumed on the session's control subject (seamguard resume) to accept them as lost",
		session, events.Excerpt(l.haltReq), FormatRanges(lost))
	if l.haltReq == "" {
		msg = fmt.Sprintf("session %q is halted since its ledger reached a limit: offsets %s cannot be vouched for; an operator must publish io.seamguard.session.resumed on the session's control subject (seamguard resume) to accept them as lost",
			session, FormatRanges(lost))
	}
	return refused(c, subject, requestID, []events.Reason{{
		Code: events.ReasonSessionHalted, AtRisk: nonNil(lost), Message: msg,
	}}, nil, events.NextNone, lim)
}

// pinsDropped is the refusal of a request that rule 2 or 3 would have
// allowed but for dropped pins: it lists pin_dropped alone, the one thing
// the agent must fix, and names the covered checks in cured, as allowed
// does (v1.3). No spill is asked for.
func pinsDropped(c events.Cause, subject, requestID string, e Evaluation, lim Limits) events.Output {
	var reasons []events.Reason
	var cured []events.ReasonCode
	for _, r := range e.Reasons {
		if r.Code == events.ReasonPinDropped {
			reasons = append(reasons, r)
		} else {
			cured = append(cured, r.Code)
		}
	}
	out := refused(c, subject, requestID, reasons, nil, events.NextCarryPins, lim)
	out.Data.(*events.CompactionRefused).Cured = cured
	return out
}

// allowedBySpills is rule 3's verdict: every offset at risk is held by
// the session's spills, which cure every reason.
func (l *Ledger) allowedBySpills(c events.Cause, b *events.CompactionRequested, e Evaluation, lim Limits) events.Output {
	var by []events.SpillHandle
	if l.lastSpill != nil && Intersects(e.AtRisk, l.spilled) {
		by = []events.SpillHandle{*l.lastSpill}
	}
	cured := make([]events.ReasonCode, len(e.Reasons))
	for i, r := range e.Reasons {
		cured[i] = r.Code
	}
	return l.allowedOutput(c, b, e, by, cured, lim)
}

// cannotSpill says why no spill can cure offsets rest (rule 5: the
// session halts), or "" when a spill may.
func (l *Ledger) cannotSpill(rest RangeSet, cfg Config, lim Limits) string {
	switch unreceived := Diff(rest, l.received); {
	case !unreceived.IsEmpty():
		return fmt.Sprintf("offsets %s were never received, so no spill can hold them", FormatRanges(unreceived.Ranges()))
	case cfg.Policy == PolicyHalt:
		return "the policy halts instead of spilling"
	case l.spillBytes >= lim.SpillQuota:
		return fmt.Sprintf("the session's spill quota of %d bytes is used up (%d bytes spilled)", lim.SpillQuota, l.spillBytes)
	}
	return ""
}

// askSpill is rule 4: the request waits for the spill of what no earlier
// spill holds, which spillDone turns into the verdict.
func (l *Ledger) askSpill(c events.Cause, ev *events.Event, b *events.CompactionRequested, e Evaluation, lim Limits) Result {
	l.pending = &pending{cause: c, requestID: b.RequestID, reasons: cutReasons(e.Reasons, lim.listed), atRisk: e.AtRisk}
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
		Events:   l.accepted + 1 - l.spillAccepted, // this request is part of the transcript
		MaxBytes: lim.SpillQuota - l.spillBytes,
	}
	if p := l.lastSpill; p != nil {
		res.Spill.FirstSeq = p.LastSeq + 1
		res.Spill.Previous = p.Name
	}
	return res
}

func (l *Ledger) spillDone(r *SpillResult, lim Limits) Result {
	p := l.pending
	l.pending = nil
	left := lim.SpillQuota - min(l.spillBytes, lim.SpillQuota)
	failure := r.Failure
	switch {
	case r.OverQuota || failure == "" && r.Handle.Size > left:
		failure = fmt.Sprintf("the session's spill quota of %d bytes would be exceeded (%d bytes spilled, %d left)", lim.SpillQuota, l.spillBytes, left)
		if r.Failure != "" {
			failure += ": " + events.Excerpt(r.Failure)
		}
	case failure != "":
		failure = "the transcript could not be spilled: " + events.Excerpt(failure)
	}
	if failure != "" {
		rest := Diff(Diff(p.atRisk, l.spilled), l.waived)
		return Result{Outputs: []events.Output{l.halted(p.cause, p.requestID, rest, failure, lim)}}
	}
	spilled := Union(l.spilled, l.received.Within(Range{Start: 0, End: min(r.Handle.Range.End, l.head)}))
	if n := spilled.Len(); n > lim.MaxRanges {
		return Result{Outputs: []events.Output{l.halted(p.cause, p.requestID, NewRangeSet(Range{Start: 0, End: l.head}),
			tooMany("spilled", "recording the spill", n, lim), lim)}}
	}
	handle := r.Handle
	handle.Previous = nil
	if l.lastSpill != nil {
		prev := l.lastSpill.Name
		handle.Previous = &prev
	}
	l.spills++
	l.lastSpill = &handle
	l.spillBytes += handle.Size
	l.spillAccepted = l.accepted
	l.spilled = spilled
	out := make([]events.Output, 0, 2)
	out = append(out, events.Output{Type: events.TypeTranscriptSpilled, Session: l.session, Cause: p.cause, Data: &handle})
	next := events.NextRetry
	if slices.ContainsFunc(p.reasons, func(r events.Reason) bool { return r.Code == events.ReasonPinDropped }) {
		next = events.NextCarryPins
	}
	out = append(out, refused(p.cause, l.session, p.requestID, p.reasons, &handle, next, lim))
	return Result{Outputs: out}
}

// halted halts the session with lost as its unrecoverable offsets (or the
// whole transcript, when lost has more ranges than a set may hold) and
// returns the session.halted output, its list cut short as outputs are.
// requestID is "" for a halt at a state limit.
func (l *Ledger) halted(c events.Cause, requestID string, lost RangeSet, why string, lim Limits) events.Output {
	if n := lost.Len(); n > lim.MaxRanges {
		why = fmt.Sprintf("%s; the %d unrecoverable ranges are more than a set of the ledger may hold (%d), so the whole transcript up to offset %d is named",
			why, n, lim.MaxRanges, max(l.head, lost.Max()))
		lost = NewRangeSet(Range{Start: 0, End: max(l.head, lost.Max())})
	}
	l.status = statusHalted
	h := lost.Clone()
	l.halt = &h
	l.haltReq = requestID
	msg := fmt.Sprintf("session halted at compaction %q: offsets %s are at risk and cannot be recovered (%s). Every compaction is refused until an operator publishes io.seamguard.session.resumed with a note on the session's control subject (seamguard resume SESSION --note ...), accepting those offsets as lost",
		events.Excerpt(requestID), FormatRanges(h.Ranges()), why)
	if requestID == "" {
		msg = fmt.Sprintf("session halted: its ledger reached a limit (%s), so seamguard can no longer vouch for offsets %s. Every compaction is refused until an operator publishes io.seamguard.session.resumed with a note on the session's control subject (seamguard resume SESSION --note ...), accepting those offsets as lost",
			why, FormatRanges(h.Ranges()))
	}
	list, total := cutRanges(h.Ranges(), lim.listed)
	return events.Output{
		Type:    events.TypeSessionHalted,
		Session: l.session,
		Cause:   c,
		Data: &events.SessionHalted{
			RequestID:              events.Excerpt(requestID),
			Unrecoverable:          slices.Clone(list),
			Message:                msg,
			UnrecoverableTruncated: total != nil,
			UnrecoverableTotal:     total,
		},
	}
}

func (l *Ledger) allowedOutput(c events.Cause, b *events.CompactionRequested, e Evaluation, by []events.SpillHandle, cured []events.ReasonCode, lim Limits) events.Output {
	if by == nil {
		by = []events.SpillHandle{}
	}
	if cured == nil {
		cured = []events.ReasonCode{}
	}
	coverage, total := cutRanges(e.Coverage.Ranges(), lim.listed)
	return events.Output{
		Type:    events.TypeCompactionAllowed,
		Session: l.session,
		Cause:   c,
		Data: &events.CompactionAllowed{
			RequestID:                events.Excerpt(b.RequestID),
			Head:                     l.head,
			SummaryCoverage:          slices.Clone(coverage),
			TailStart:                b.TailStart,
			RecoveredBy:              by,
			Cured:                    cured,
			SummaryCoverageTruncated: total != nil,
			SummaryCoverageTotal:     total,
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
	if b.CarriedPinsInvalid != "" {
		p = append(p, events.Excerpt(b.CarriedPinsInvalid))
	}
	for i, r := range b.CarriedPins {
		if r.Start > r.End {
			p = append(p, fmt.Sprintf("carried_pins[%d] starts at %d after its end %d", i, r.Start, r.End))
			break
		}
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
