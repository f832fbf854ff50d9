package events

import (
	"encoding/json"
	"fmt"
)

// decodeData decodes the data of an input event of type typ (already known
// to be an input type) into its typed body. data is compacted JSON, nil when
// absent. Unknown fields are ignored.
func decodeData(typ string, data json.RawMessage) (any, *Error) {
	if typ == TypeSessionClosed {
		if data == nil || isNull(data) || jsonKind(data) == "an object" {
			return &SessionClosed{}, nil
		}
		return nil, Errorf(CodeBadData, "data",
			"data is %s; session.closed carries nothing: leave data out, or send null or an object", jsonKind(data))
	}
	if data == nil {
		return nil, Errorf(CodeMissingAttribute, "data",
			"the event has no data; %s needs a JSON object as its data", typ)
	}
	o, err := newObj("data", data)
	if err != nil {
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
		id, _, err := o.str("request_id", "the request_id of the compaction the agent applied", true, true)
		if err != nil {
			return nil, err
		}
		if len(id) > MaxIDBytes {
			return nil, tooLarge("data.request_id", len(id), MaxIDBytes, "request ids are at most 256 bytes: send the request_id of the compaction.requested")
		}
		return &CompactionCommitted{RequestID: id}, nil
	case TypeSessionResumed:
		note, _, err := o.str("note", "why an operator lifts the halt, knowingly accepting the unrecoverable offsets", true, true)
		if err != nil {
			return nil, err
		}
		if len(note) > MaxNoteBytes {
			return nil, tooLarge("data.note", len(note), MaxNoteBytes, "keep the note short and point to a fuller record (a ticket or a document) in it")
		}
		return &SessionResumed{Note: note}, nil
	}
	return nil, Errorf(CodeUnknownType, "type", "the type %q is not a seamguard input type", typ)
}

// obj is a JSON object of the data at a field path such as "data.range".
type obj struct {
	path string
	m    map[string]json.RawMessage
}

// newObj reads raw, which is valid JSON (compacted data, or a member of it).
func newObj(path string, raw json.RawMessage) (obj, *Error) {
	members, dup, ok := splitObject(raw)
	if !ok {
		return obj{}, Errorf(CodeBadData, path, "%s is %s; it must be a JSON object", path, jsonKind(raw))
	}
	if dup != "" {
		return obj{}, Errorf(CodeBadData, path+"."+Excerpt(dup), "the field %q appears twice in %s; send it once", Excerpt(dup), path)
	}
	m := make(map[string]json.RawMessage, len(members))
	for _, mb := range members {
		m[mb.name] = mb.val
	}
	return obj{path: path, m: m}, nil
}

func (o obj) field(name string) string { return o.path + "." + name }

// get returns a field's value; null counts as absent.
func (o obj) get(name string) (json.RawMessage, bool) {
	raw, ok := o.m[name]
	if !ok || isNull(raw) {
		return nil, false
	}
	return raw, true
}

func (o obj) missing(name, hint string) *Error {
	return Errorf(CodeBadData, o.field(name), "%s is missing; send %s", o.field(name), hint)
}

func (o obj) uint(name, hint string, required bool) (uint64, bool, *Error) {
	raw, ok := o.get(name)
	if !ok {
		if required {
			return 0, false, o.missing(name, hint)
		}
		return 0, false, nil
	}
	v, problem := parseUint(raw)
	if problem != "" {
		return 0, false, Errorf(CodeBadData, o.field(name),
			"%s %s; send %s as a plain non-negative JSON integer, at most 2^53", o.field(name), problem, hint)
	}
	return v, true, nil
}

func (o obj) optUint(name, hint string) (*uint64, *Error) {
	v, ok, err := o.uint(name, hint, false)
	if err != nil || !ok {
		return nil, err
	}
	return &v, nil
}

func (o obj) str(name, hint string, required, nonEmpty bool) (string, bool, *Error) {
	raw, ok := o.get(name)
	if !ok {
		if required {
			return "", false, o.missing(name, hint)
		}
		return "", false, nil
	}
	s, isStr := asString(raw)
	if !isStr {
		return "", false, Errorf(CodeBadData, o.field(name), "%s is %s; send %s as a string", o.field(name), jsonKind(raw), hint)
	}
	if nonEmpty && s == "" {
		return "", false, Errorf(CodeBadData, o.field(name), "%s is empty; send %s", o.field(name), hint)
	}
	return s, true, nil
}

func (o obj) boolean(name, hint string) (bool, *Error) {
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
	return false, Errorf(CodeBadData, o.field(name), "%s is %s; send %s as true or false", o.field(name), jsonKind(raw), hint)
}

func (o obj) object(name, hint string) (obj, *Error) {
	raw, ok := o.get(name)
	if !ok {
		return obj{}, o.missing(name, hint)
	}
	return newObj(o.field(name), raw)
}

func (o obj) unit(name, hint string) (Unit, *Error) {
	s, _, err := o.str(name, hint, true, false)
	if err != nil {
		return "", err
	}
	u := Unit(s)
	if !u.Valid() {
		return "", Errorf(CodeBadData, o.field(name),
			"%s is %s; send %s: one of %q, %q or %q", o.field(name), jsonQuote(abbreviate(s)), hint, UnitTurns, UnitTokens, UnitMessages)
	}
	return u, nil
}

func (o obj) rng(name, hint string) (Range, *Error) {
	r, err := o.object(name, hint+`, as {"start": a, "end": b}`)
	if err != nil {
		return Range{}, err
	}
	start, _, err := r.uint("start", "the first offset of "+hint, true)
	if err != nil {
		return Range{}, err
	}
	end, _, err := r.uint("end", "the offset just past "+hint, true)
	if err != nil {
		return Range{}, err
	}
	return Range{Start: start, End: end}, nil
}

func (o obj) sessionOpened() (*SessionOpened, *Error) {
	unit, err := o.unit("unit", "the unit the session's offsets count")
	if err != nil {
		return nil, err
	}
	f, err := o.object("recovery_floor", `the recovery floor, as {"span": n, "unit": u}`)
	if err != nil {
		return nil, err
	}
	span, _, err := f.uint("span", "how many of the latest offsets must survive verbatim", true)
	if err != nil {
		return nil, err
	}
	funit, err := f.unit("unit", "the unit of the span")
	if err != nil {
		return nil, err
	}
	window, err := o.optUint("window", "the context window size")
	if err != nil {
		return nil, err
	}
	trigger, err := o.optUint("trigger", "the compaction trigger")
	if err != nil {
		return nil, err
	}
	return &SessionOpened{Unit: unit, RecoveryFloor: Floor{Span: span, Unit: funit}, Window: window, Trigger: trigger}, nil
}

func (o obj) turnAppended() (*TurnAppended, *Error) {
	offset, _, err := o.uint("offset", "the offset of the turn's first unit (normally the session head)", true)
	if err != nil {
		return nil, err
	}
	size, _, err := o.uint("size", "the turn's length in the session unit", true)
	if err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, Errorf(CodeBadData, "data.size", "data.size is 0; a turn covers at least one offset: send its length in the session unit")
	}
	if size > MaxOffset-offset {
		return nil, Errorf(CodeBadData, "data.size",
			"data.offset + data.size is %d + %d, past the largest allowed offset 2^53; check the turn's offset and size", offset, size)
	}
	role, _, err := o.str("role", "the speaker's role", false, false)
	if err != nil {
		return nil, err
	}
	tokens, err := o.optUint("tokens", "the turn's token count")
	if err != nil {
		return nil, err
	}
	pinned, err := o.boolean("pinned", "whether the turn is a rule that must stay in the working context")
	if err != nil {
		return nil, err
	}
	t := &TurnAppended{Offset: offset, Size: size, Role: role, Tokens: tokens, Pinned: pinned}
	if raw, ok := o.m["content"]; ok {
		t.Content = raw // any JSON, kept as received (compacted)
	}
	return t, nil
}

func (o obj) contextTruncated() (*ContextTruncated, *Error) {
	r, err := o.rng("range", "the evicted offsets")
	if err != nil {
		return nil, err
	}
	if r.Start > r.End {
		return nil, Errorf(CodeBadData, "data.range",
			"data.range is reversed (start %d > end %d); send the evicted offsets as {\"start\": first, \"end\": one past the last}", r.Start, r.End)
	}
	stage, _, err := o.str("stage", "the step that evicted them, such as \"budget\"", false, false)
	if err != nil {
		return nil, err
	}
	return &ContextTruncated{Range: r, Stage: stage}, nil
}

// pinRange reads the range of context.pinned or context.unpinned; a
// reversed one is bad_data, as for context.truncated.
func (o obj) pinRange(hint string) (Range, *Error) {
	r, err := o.rng("range", hint)
	if err != nil {
		return Range{}, err
	}
	if r.Start > r.End {
		return Range{}, Errorf(CodeBadData, "data.range",
			"data.range is reversed (start %d > end %d); send %s as {\"start\": first, \"end\": one past the last}", r.Start, r.End, hint)
	}
	return r, nil
}

// carriedPins reads carried_pins: absent or null is none. Anything but a
// list of ranges is no rejection: the ledger refuses the request with
// invalid_request, so the second result says why.
// Reversed ranges are returned as they are, for the ledger to refuse.
func (o obj) carriedPins() ([]Range, string) {
	raw, ok := o.get("carried_pins")
	if !ok {
		return nil, ""
	}
	const how = `send carried_pins as a list of ranges, such as [{"start": 0, "end": 1}]`
	var elems []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &elems) != nil {
		return nil, fmt.Sprintf("carried_pins is %s; %s", jsonKind(raw), how)
	}
	out := make([]Range, 0, len(elems))
	for i, e := range elems {
		path := fmt.Sprintf("carried_pins[%d]", i)
		r, err := newObj(path, e)
		if err != nil {
			return nil, fmt.Sprintf("%s is %s; %s", path, jsonKind(e), how)
		}
		start, _, err1 := r.uint("start", "the first offset of the range", true)
		end, _, err2 := r.uint("end", "the offset just past the range", true)
		if err1 != nil || err2 != nil {
			return nil, fmt.Sprintf("%s needs start and end, plain non-negative integers at most 2^53; %s", path, how)
		}
		out = append(out, Range{Start: start, End: end})
	}
	return out, ""
}

func (o obj) compactionRequested() (*CompactionRequested, *Error) {
	// An empty or absent request_id decodes: the ledger refuses it with
	// invalid_request, so the agent gets a verdict rather than a rejection.
	id, _, err := o.str("request_id", "the id of this compaction request", false, false)
	if err != nil {
		return nil, err
	}
	if len(id) > MaxIDBytes {
		return nil, tooLarge("data.request_id", len(id), MaxIDBytes, "use a request id of at most 256 bytes, such as a UUID")
	}
	in, err := o.rng("summarizer_input", "the offsets the summarizer reads")
	if err != nil {
		return nil, err
	}
	sum, err := o.rng("summary_range", "the offsets the summary claims to cover")
	if err != nil {
		return nil, err
	}
	tail, _, err := o.uint("tail_start", "the first offset of the verbatim tail", true)
	if err != nil {
		return nil, err
	}
	carries, err := o.boolean("carries_prior_summary", "whether the summarizer reads the current summary")
	if err != nil {
		return nil, err
	}
	occ, err := o.optUint("occupancy", "the context occupancy")
	if err != nil {
		return nil, err
	}
	thr, err := o.optUint("threshold", "the compaction threshold")
	if err != nil {
		return nil, err
	}
	pins, bad := o.carriedPins()
	return &CompactionRequested{RequestID: id, SummarizerInput: in, SummaryRange: sum, TailStart: tail,
		CarriesPriorSummary: carries, Occupancy: occ, Threshold: thr, CarriedPins: pins, CarriedPinsInvalid: bad}, nil
}
