package events

import (
	"encoding/json"
	"fmt"
)

// decodeData decodes the data of an input event of type typ (one of
// inputTypes) into its typed body. data is valid, compacted JSON, nil when
// absent. Unknown fields are ignored. The data's members are read in
// place; the body is one allocation, and its strings are the package's
// constants where they are common words.
func decodeData(typ string, data json.RawMessage) (any, *Error) {
	if typ == TypeSessionClosed {
		if data == nil || data[0] == '{' || string(data) == "null" {
			return &SessionClosed{}, nil
		}
		return nil, errClosedData(data)
	}
	if data == nil {
		return nil, errNoData(typ)
	}
	var o object
	if err := o.open("data", "", data); err != nil {
		return nil, err
	}
	switch typ {
	case TypeSessionOpened:
		return o.sessionOpened()
	case TypeTurnAppended:
		return o.turnAppended()
	case TypeContextTruncated:
		return o.contextTruncated()
	case TypeContextPinned:
		r, err := o.pinRange("the offsets to pin")
		if err != nil {
			return nil, err
		}
		return &ContextPinned{Range: r}, nil
	case TypeContextUnpinned:
		r, err := o.pinRange("the offsets to unpin")
		if err != nil {
			return nil, err
		}
		return &ContextUnpinned{Range: r}, nil
	case TypeCompactionRequested:
		return o.compactionRequested()
	case TypeCompactionCommitted:
		return o.compactionCommitted()
	case TypeSessionResumed:
		return o.sessionResumed()
	}
	return nil, errUnknownType(typ)
}

// open reads raw, valid JSON, as the object at path (and key, see object).
func (o *object) open(path, key string, raw []byte) *Error {
	o.path, o.key = path, key
	if !o.read(raw) {
		return o.errNotObject(raw)
	}
	if o.dup != nil {
		return o.errFieldTwice()
	}
	return nil
}

// fullPath is the object's field path, such as "data.range".
func (o *object) fullPath() string {
	if o.key == "" {
		return o.path
	}
	return o.path + "." + o.key
}

// field is the path of the object's member name, such as "data.offset".
func (o *object) field(name string) string { return o.fullPath() + "." + name }

// uint returns a member that must be a plain integer in [0, MaxOffset],
// and whether it is present (not null).
func (o *object) uint(name string, required bool, hint ...string) (uint64, bool, *Error) {
	raw, ok := o.get(name)
	if !ok {
		if required {
			return 0, false, o.missing(name, hint...)
		}
		return 0, false, nil
	}
	if v, ok := plainUint(raw); ok {
		return v, true, nil
	}
	return 0, false, o.errNotUint(name, raw, hint)
}

// plainUint is parseUint for the values it accepts, without saying what is
// wrong with others.
func plainUint(raw []byte) (uint64, bool) {
	if len(raw) == 0 || len(raw) > 16 { // 2^53 has 16 digits
		return 0, false
	}
	var v uint64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, v <= MaxOffset
}

// optUint sets *v to an optional integer member and returns v, or nil when
// the member is absent.
func (o *object) optUint(name, hint string, v *uint64) (*uint64, *Error) {
	n, present, err := o.uint(name, false, hint)
	if err != nil || !present {
		return nil, err
	}
	*v = n
	return v, nil
}

// str returns a member that must be a string, and whether it is present.
func (o *object) str(name, hint string, required, nonEmpty bool) (string, bool, *Error) {
	raw, ok := o.get(name)
	if !ok {
		if required {
			return "", false, o.missing(name, hint)
		}
		return "", false, nil
	}
	s, isStr := commonString(raw)
	if !isStr {
		return "", false, o.errNotString(name, raw, hint)
	}
	if nonEmpty && s == "" {
		return "", false, o.errEmptyString(name, hint)
	}
	return s, true, nil
}

// commonString is asString for a raw value without surrounding white
// space; common words come back as constants rather than new strings.
func commonString(raw []byte) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' {
		switch string(raw[1 : len(raw)-1]) {
		case "user":
			return "user", true
		case "assistant":
			return "assistant", true
		case "system":
			return "system", true
		case "tool":
			return "tool", true
		case "budget":
			return "budget", true
		case "turns":
			return "turns", true
		case "tokens":
			return "tokens", true
		case "messages":
			return "messages", true
		}
	}
	return asString(raw)
}

// boolean returns an optional member that must be true or false.
func (o *object) boolean(name, hint string) (bool, *Error) {
	raw, ok := o.get(name)
	if !ok {
		return false, nil
	}
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, o.errNotBool(name, raw, hint)
}

// object reads the required member name into sub, which must be an object.
func (o *object) object(name string, sub *object, hint ...string) *Error {
	raw, ok := o.get(name)
	if !ok {
		return o.missing(name, hint...)
	}
	if o.key != "" {
		return sub.open(o.fullPath(), name, raw)
	}
	return sub.open(o.path, name, raw)
}

// unit returns a required member that must be one of the units.
func (o *object) unit(name, hint string) (Unit, *Error) {
	s, _, err := o.str(name, hint, true, false)
	if err != nil {
		return "", err
	}
	u := Unit(s)
	if !u.Valid() {
		return "", o.errBadUnit(name, s, hint)
	}
	return u, nil
}

// rng returns a required member that must be a range.
func (o *object) rng(name, hint string) (Range, *Error) {
	var r object
	if err := o.object(name, &r, hint, `, as {"start": a, "end": b}`); err != nil {
		return Range{}, err
	}
	start, _, err := r.uint("start", true, "the first offset of ", hint)
	if err != nil {
		return Range{}, err
	}
	end, _, err := r.uint("end", true, "the offset just past ", hint)
	if err != nil {
		return Range{}, err
	}
	return Range{Start: start, End: end}, nil
}

// sessionOpened reads the data of session.opened.
func (o *object) sessionOpened() (*SessionOpened, *Error) {
	// One allocation holds the body and its optional numbers.
	b := &struct {
		s               SessionOpened
		window, trigger uint64
	}{}
	s := &b.s
	var err *Error
	if s.Unit, err = o.unit("unit", "the unit the session's offsets count"); err != nil {
		return nil, err
	}
	var f object
	if err := o.object("recovery_floor", &f, `the recovery floor, as {"span": n, "unit": u}`); err != nil {
		return nil, err
	}
	if s.RecoveryFloor.Span, _, err = f.uint("span", true, "how many of the latest offsets must survive verbatim"); err != nil {
		return nil, err
	}
	if s.RecoveryFloor.Unit, err = f.unit("unit", "the unit of the span"); err != nil {
		return nil, err
	}
	if s.Window, err = o.optUint("window", "the context window size", &b.window); err != nil {
		return nil, err
	}
	if s.Trigger, err = o.optUint("trigger", "the compaction trigger", &b.trigger); err != nil {
		return nil, err
	}
	return s, nil
}

// turnAppended reads the data of turn.appended.
func (o *object) turnAppended() (*TurnAppended, *Error) {
	// One allocation holds the body and its token count.
	b := &struct {
		t      TurnAppended
		tokens uint64
	}{}
	t := &b.t
	var err *Error
	if t.Offset, _, err = o.uint("offset", true, "the offset of the turn's first unit (normally the session head)"); err != nil {
		return nil, err
	}
	if t.Size, _, err = o.uint("size", true, "the turn's length in the session unit"); err != nil {
		return nil, err
	}
	if t.Size == 0 {
		return nil, errZeroSize()
	}
	if t.Size > MaxOffset-t.Offset {
		return nil, errPastMaxOffset(t.Offset, t.Size)
	}
	if t.Role, _, err = o.str("role", "the speaker's role", false, false); err != nil {
		return nil, err
	}
	if t.Tokens, err = o.optUint("tokens", "the turn's token count", &b.tokens); err != nil {
		return nil, err
	}
	if t.Pinned, err = o.boolean("pinned", "whether the turn is a rule that must stay in the working context"); err != nil {
		return nil, err
	}
	if raw, ok := o.raw("content"); ok {
		t.Content = raw // any JSON, kept as received (compacted)
	}
	return t, nil
}

// contextTruncated reads the data of context.truncated.
func (o *object) contextTruncated() (*ContextTruncated, *Error) {
	r, err := o.rng("range", "the evicted offsets")
	if err != nil {
		return nil, err
	}
	if r.Start > r.End {
		return nil, errReversed(r, "the evicted offsets")
	}
	stage, _, err := o.str("stage", "the step that evicted them, such as \"budget\"", false, false)
	if err != nil {
		return nil, err
	}
	return &ContextTruncated{Range: r, Stage: stage}, nil
}

// pinRange reads the range of context.pinned or context.unpinned; a
// reversed one is bad_data, as for context.truncated.
func (o *object) pinRange(hint string) (Range, *Error) {
	r, err := o.rng("range", hint)
	if err != nil {
		return Range{}, err
	}
	if r.Start > r.End {
		return Range{}, errReversed(r, hint)
	}
	return r, nil
}

// compactionRequested reads the data of compaction.requested.
func (o *object) compactionRequested() (*CompactionRequested, *Error) {
	b := &struct {
		c                    CompactionRequested
		occupancy, threshold uint64
	}{}
	c := &b.c
	var err *Error
	// An empty or absent request_id decodes: the ledger refuses it with
	// invalid_request, so the agent gets a verdict rather than a rejection.
	if c.RequestID, _, err = o.str("request_id", "the id of this compaction request", false, false); err != nil {
		return nil, err
	}
	if len(c.RequestID) > MaxIDBytes {
		return nil, tooLarge("data.request_id", len(c.RequestID), MaxIDBytes, "use a request id of at most 256 bytes, such as a UUID")
	}
	if c.SummarizerInput, err = o.rng("summarizer_input", "the offsets the summarizer reads"); err != nil {
		return nil, err
	}
	if c.SummaryRange, err = o.rng("summary_range", "the offsets the summary claims to cover"); err != nil {
		return nil, err
	}
	if c.TailStart, _, err = o.uint("tail_start", true, "the first offset of the verbatim tail"); err != nil {
		return nil, err
	}
	if c.CarriesPriorSummary, err = o.boolean("carries_prior_summary", "whether the summarizer reads the current summary"); err != nil {
		return nil, err
	}
	if c.Occupancy, err = o.optUint("occupancy", "the context occupancy", &b.occupancy); err != nil {
		return nil, err
	}
	if c.Threshold, err = o.optUint("threshold", "the compaction threshold", &b.threshold); err != nil {
		return nil, err
	}
	c.CarriedPins, c.CarriedPinsInvalid = o.carriedPins()
	return c, nil
}

// carriedPins reads carried_pins: absent or null is none. Anything but a
// list of ranges is no rejection: the ledger refuses the request with
// invalid_request, so the second result says why. Reversed ranges are
// returned as they are, for the ledger to refuse.
func (o *object) carriedPins() ([]Range, string) {
	raw, ok := o.get("carried_pins")
	if !ok {
		return nil, ""
	}
	const how = `send carried_pins as a list of ranges, such as [{"start": 0, "end": 1}]`
	if raw[0] != '[' {
		return nil, fmt.Sprintf("carried_pins is %s; %s", jsonKind(raw), how)
	}
	out := make([]Range, 0, 4)
	for i, n := skipSpace(raw, 1), 0; raw[i] != ']'; n++ {
		end := skipValue(raw, i)
		e := raw[i:end]
		var r object // its path is in no message: its errors are not returned
		if r.open("", "", e) != nil {
			return nil, fmt.Sprintf("carried_pins[%d] is %s; %s", n, jsonKind(e), how)
		}
		start, _, err1 := r.uint("start", true)
		end2, _, err2 := r.uint("end", true)
		if err1 != nil || err2 != nil {
			return nil, fmt.Sprintf("carried_pins[%d] needs start and end, plain non-negative integers at most 2^53; %s", n, how)
		}
		out = append(out, Range{Start: start, End: end2})
		if i = skipSpace(raw, end); raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
	}
	return out, ""
}

// compactionCommitted reads the data of compaction.committed.
func (o *object) compactionCommitted() (*CompactionCommitted, *Error) {
	id, _, err := o.str("request_id", "the request_id of the compaction the agent applied", true, true)
	if err != nil {
		return nil, err
	}
	if len(id) > MaxIDBytes {
		return nil, tooLarge("data.request_id", len(id), MaxIDBytes, "request ids are at most 256 bytes: send the request_id of the compaction.requested")
	}
	return &CompactionCommitted{RequestID: id}, nil
}

// sessionResumed reads the data of session.resumed.
func (o *object) sessionResumed() (*SessionResumed, *Error) {
	note, _, err := o.str("note", "why an operator lifts the halt, knowingly accepting the unrecoverable offsets", true, true)
	if err != nil {
		return nil, err
	}
	if len(note) > MaxNoteBytes {
		return nil, tooLarge("data.note", len(note), MaxNoteBytes, "keep the note short and point to a fuller record (a ticket or a document) in it")
	}
	return &SessionResumed{Note: note}, nil
}
