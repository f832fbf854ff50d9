package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// The fast path of DecodeMsg and DecodeJSON.
//
// It decodes the shapes agents send nearly always: binary mode with each
// ce-* header once, no percent-escapes, and plain extensions; or structured
// mode with no ce-* headers, string attributes and no nulls; and data whose
// member names have no escapes and occur once. It builds no maps but the
// extensions', keeps attribute strings as they arrive, and reads the data's
// members in place. It returns nil ("decline") for anything else and for
// every input that fails, and the general decoder then decides: so errors
// and their messages come from one place. An event it returns is, field by
// field, the one the general decoder returns (FuzzDecodeFastSlow holds it
// to that); it calls the general decoder's helpers (compact, asString,
// parseTime, mediaType, ValidSessionID) wherever they are cheap, so that
// equality holds by construction rather than by imitation.

// Indexes of the core attributes in fastEnv.
const (
	attrSpecversion = iota
	attrID
	attrSource
	attrType
	attrSubject
	attrTime
	attrDataContentType
	numCoreAttrs
)

var coreAttrNames = [numCoreAttrs]string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype"}

// fastEnv is an envelope on the fast path: the core attributes as decoded
// strings, the extensions as Event.Extensions holds them, and the data.
type fastEnv struct {
	attr [numCoreAttrs]string
	have uint8 // bit i set: attr[i] is present
	ext  map[string]json.RawMessage
	pk   string // the partitionkey extension's string value, when hasPK
	// hasPK: there is a partitionkey extension, a string.
	hasPK bool
	// big: some extension value is longer than MaxIDBytes.
	big  bool
	data json.RawMessage // compacted; nil when absent
}

func (e *fastEnv) set(i int, v string) bool {
	if e.have&(1<<i) != 0 {
		return false
	}
	e.have |= 1 << i
	e.attr[i] = v
	return true
}

func (e *fastEnv) has(i int) bool { return e.have&(1<<i) != 0 }

// addExt adds an extension whose name is known to be valid and lower case;
// n is the size of its value as checkBounds counts it.
func (e *fastEnv) addExt(name string, val json.RawMessage, n int) bool {
	if _, dup := e.ext[name]; dup {
		return false
	}
	e.big = e.big || n > MaxIDBytes
	if e.ext == nil {
		e.ext = make(map[string]json.RawMessage, 2)
	}
	e.ext[name] = val
	return true
}

// coreAttrIndex returns the index of the core attribute named name, ignoring
// ASCII case, or -1.
func coreAttrIndex(name string) int {
	var i int
	switch len(name) {
	case 2:
		i = attrID
	case 4:
		if i = attrType; name[1]|0x20 == 'i' {
			i = attrTime
		}
	case 6:
		i = attrSource
	case 7:
		i = attrSubject
	case 11:
		i = attrSpecversion
	case 15:
		i = attrDataContentType
	default:
		return -1
	}
	if asciiEqualFold(name, coreAttrNames[i]) {
		return i
	}
	return -1
}

// asciiEqualFold reports whether s equals lower, an ASCII lower-case string,
// ignoring the case of ASCII letters in s only.
func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// fastHeaders reads the ce-* and Content-Type headers into env. It declines
// what readHeaders would treat specially or reject: a header name that is
// not ASCII (strings.ToLower maps some non-ASCII letters to ASCII ones), a
// header with other than one value, a name given twice in different case,
// a '%' in a value, a value that is not UTF-8, an invalid attribute name.
// ce reports whether there was any ce-* header.
func fastHeaders(h map[string][]string, env *fastEnv) (ct string, hasCT, ce, ok bool) {
	for k, vs := range h {
		if !isASCII(k) {
			return "", false, false, false
		}
		if asciiEqualFold(k, "content-type") {
			if hasCT || len(vs) != 1 {
				return "", false, false, false
			}
			ct, hasCT = vs[0], true
			continue
		}
		if len(k) < 3 || !asciiEqualFold(k[:3], "ce-") {
			continue
		}
		ce = true
		if len(vs) != 1 {
			return "", false, false, false
		}
		v := vs[0]
		if strings.IndexByte(v, '%') >= 0 || !utf8.ValidString(v) {
			return "", false, false, false
		}
		name := k[3:]
		if i := coreAttrIndex(name); i >= 0 {
			if !env.set(i, v) {
				return "", false, false, false
			}
			continue
		}
		name = strings.ToLower(name) // ASCII: as readHeaders has it
		if !validAttrName(name) || name == "data" {
			return "", false, false, false
		}
		if !env.addExt(name, jsonString(v), len(v)) {
			return "", false, false, false
		}
		if name == "partitionkey" {
			env.pk, env.hasPK = v, true
		}
	}
	return ct, hasCT, ce, true
}

// decodeMsgFast is DecodeMsg's fast path: the event without Meta, or nil.
// With own, the event's Data may be body itself (or a part of it) rather
// than a copy.
func decodeMsgFast(subject string, header map[string][]string, body []byte, subjects Subjects, own bool) *Event {
	var env fastEnv
	ct, hasCT, ce, ok := fastHeaders(header, &env)
	if !ok {
		return nil
	}
	binary := env.has(attrSpecversion)
	if hasCT && isMediaType(ct, ContentTypeCloudEventsJSON) {
		binary = false
	}
	if binary {
		if !env.has(attrDataContentType) && hasCT {
			if !utf8.ValidString(ct) {
				return nil // the general decoder's JSON round trip would replace bytes
			}
			env.set(attrDataContentType, ct)
		}
		if len(body) > 0 {
			if !utf8.Valid(body) {
				return nil
			}
			// What compact(body) returns, without scanning twice.
			switch valid, spaced := scanJSON(body); {
			case !valid:
				return nil
			case spaced:
				env.data = compactValid(body)
			case own:
				env.data = body[:len(body):len(body)]
			default:
				env.data = bytes.Clone(body)
			}
		}
	} else {
		if ce { // headersAgree's business
			return nil
		}
		if !fastStructured(body, &env, own) {
			return nil
		}
	}
	tok, ok := subjects.fastSessionOf(subject)
	if !ok {
		return nil
	}
	return env.event(tok, true)
}

// decodeJSONFast is DecodeJSON's fast path: the event without Meta, or nil.
func decodeJSONFast(line []byte) *Event {
	var env fastEnv
	if !fastStructured(line, &env, false) {
		return nil
	}
	return env.event("", false)
}

// isMediaType reports whether mediaType(ct) is want, a lower-case media
// type without parameters, sparing the work when ct is want exactly.
func isMediaType(ct, want string) bool {
	return ct == want || mediaType(ct) == want
}

// fastSessionOf is sessionOf for subjects it accepts, without allocating.
func (s Subjects) fastSessionOf(natsSubject string) (string, bool) {
	rest, ok := strings.CutPrefix(natsSubject, s.prefix())
	if !ok {
		return "", false
	}
	if strings.HasPrefix(rest, partitioned) {
		tok, _, ok := s.storedParts(natsSubject)
		return tok, ok && ValidSessionID(tok)
	}
	tok, ok := strings.CutPrefix(rest, ".events.")
	if !ok {
		tok, ok = strings.CutPrefix(rest, ".control.")
	}
	return tok, ok && ValidSessionID(tok)
}

// fastStructured reads a structured-mode body into env. It declines bodies
// that are not a valid JSON object in UTF-8, member names with escapes or
// given twice, null or non-string core attributes, data_base64, and
// extensions that are null, objects or arrays. With own, the data may be
// a part of body rather than a copy.
func fastStructured(body []byte, env *fastEnv, own bool) bool {
	if !utf8.Valid(body) {
		return false
	}
	valid, spaced := scanJSON(body)
	if !valid {
		return false
	}
	var o fastObj
	if !o.read(body[skipSpace(body, 0):]) {
		return false
	}
	// The string attributes share one allocation.
	var spans [numCoreAttrs][]byte
	n := 0
	for k := 0; k < o.n; k++ {
		name, val := o.names[k], o.vals[k]
		switch string(name) {
		case "data":
			if !spaced { // what compact returns for compact JSON
				if own {
					env.data = val[:len(val):len(val)]
				} else {
					env.data = bytes.Clone(val)
				}
				continue
			}
			data, err := compact(val)
			if err != nil {
				return false
			}
			env.data = data
			continue
		case "specversion", "id", "source", "type", "subject", "time", "datacontenttype":
			i := coreAttrIndex(string(name))
			if val[0] != '"' {
				return false
			}
			in := val[1 : len(val)-1]
			if bytes.IndexByte(in, '\\') >= 0 {
				s, ok := asString(val)
				if !ok {
					return false
				}
				env.set(i, s)
				continue
			}
			spans[i] = in
			env.have |= 1 << i
			n += len(in)
			continue
		}
		ext := string(name)
		if !validAttrName(ext) {
			return false
		}
		var raw json.RawMessage
		n := 0
		switch val[0] {
		case '"':
			s, ok := asString(val)
			if !ok {
				return false
			}
			raw, n = jsonString(s), len(s)
			if ext == "partitionkey" {
				env.pk, env.hasPK = s, true
			}
		case 't', 'f', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			if ext == "dataschema" || ext == "partitionkey" {
				return false
			}
			c, err := compact(val)
			if err != nil {
				return false
			}
			raw, n = c, len(c)
		default: // null, an object or an array
			return false
		}
		env.addExt(ext, raw, n) // names are unique: fastObj checked
	}
	if n > 0 {
		buf := make([]byte, 0, n)
		for _, sp := range spans {
			buf = append(buf, sp...)
		}
		all := string(buf)
		for i, sp := range spans {
			if sp != nil {
				env.attr[i], all = all[:len(sp)], all[len(sp):]
			}
		}
	}
	return true
}

// event validates env as envelope.validate does and returns the event, or
// nil. token is the session token of the NATS subject when checkSubject.
func (e *fastEnv) event(token string, checkSubject bool) *Event {
	for _, i := range []int{attrSpecversion, attrID, attrSource, attrType, attrSubject} {
		if !e.has(i) || e.attr[i] == "" {
			return nil
		}
	}
	if e.attr[attrSpecversion] != "1.0" || len(e.attr[attrID]) > MaxIDBytes || len(e.attr[attrSource]) > MaxIDBytes || e.big {
		return nil
	}
	subject := e.attr[attrSubject]
	if !ValidSessionID(subject) || checkSubject && subject != token {
		return nil
	}
	if _, ok := e.ext["partitionkey"]; ok && (!e.hasPK || e.pk != subject) {
		return nil
	}
	ev := &Event{ID: e.attr[attrID], Source: e.attr[attrSource], Subject: subject, Extensions: e.ext}
	if e.has(attrTime) {
		t, ok := parseTime(e.attr[attrTime])
		if !ok {
			return nil
		}
		ev.Time = t
	}
	if e.has(attrDataContentType) {
		if !isMediaType(e.attr[attrDataContentType], ContentTypeJSON) {
			return nil
		}
		ev.DataContentType = e.attr[attrDataContentType]
	}
	typ, body := fastData(e.attr[attrType], e.data)
	if body == nil {
		return nil
	}
	ev.Type, ev.Data, ev.Body = typ, e.data, body
	return ev
}

// fastData is decodeData on the fast path. It returns the type as the
// package constant (so that the event does not hold on to a header's
// string) and the body, or a nil body.
func fastData(typ string, data json.RawMessage) (string, any) {
	if typ == TypeSessionClosed {
		if data == nil || data[0] == '{' || string(data) == "null" {
			return TypeSessionClosed, &SessionClosed{}
		}
		return "", nil
	}
	if data == nil {
		return "", nil
	}
	var o fastObj
	if !o.read(data) {
		return "", nil
	}
	switch typ {
	case TypeTurnAppended:
		return TypeTurnAppended, o.turnAppended()
	case TypeSessionOpened:
		return TypeSessionOpened, o.sessionOpened()
	case TypeContextTruncated:
		return TypeContextTruncated, o.contextTruncated()
	case TypeContextPinned:
		if r, ok := o.rng("range"); ok && r.Start <= r.End {
			return TypeContextPinned, &ContextPinned{Range: r}
		}
	case TypeContextUnpinned:
		if r, ok := o.rng("range"); ok && r.Start <= r.End {
			return TypeContextUnpinned, &ContextUnpinned{Range: r}
		}
	case TypeCompactionRequested:
		return TypeCompactionRequested, o.compactionRequested()
	case TypeCompactionCommitted:
		if id, ok := o.str("request_id", true, true); ok && len(id) <= MaxIDBytes {
			return TypeCompactionCommitted, &CompactionCommitted{RequestID: id}
		}
	case TypeSessionResumed:
		if note, ok := o.str("note", true, true); ok && len(note) <= MaxNoteBytes {
			return TypeSessionResumed, &SessionResumed{Note: note}
		}
	}
	return "", nil
}

// maxFastMembers is the most members an object may have on the fast path.
const maxFastMembers = 16

// fastObj is a JSON object's members, read in place: names as they are
// spelled between the quotes (never with escapes) and values as raw JSON.
type fastObj struct {
	n     int
	names [maxFastMembers][]byte
	vals  [maxFastMembers][]byte
}

// read reads raw, valid JSON starting with its value. It fails when raw is
// not an object, a member name holds an escape or occurs twice, or there
// are more than maxFastMembers members. White space is allowed where JSON
// allows it; compacted data has none.
func (o *fastObj) read(raw []byte) bool {
	if len(raw) < 2 || raw[0] != '{' {
		return false
	}
	i := skipSpace(raw, 1)
	if raw[i] == '}' {
		return true
	}
	for {
		if o.n == maxFastMembers || raw[i] != '"' {
			return false
		}
		end := skipString(raw, i)
		name := raw[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return false
		}
		for _, prev := range o.names[:o.n] {
			if bytes.Equal(prev, name) {
				return false
			}
		}
		i = skipSpace(raw, end)
		if raw[i] != ':' {
			return false
		}
		i = skipSpace(raw, i+1)
		end = skipValue(raw, i)
		o.names[o.n], o.vals[o.n] = name, raw[i:end:end]
		o.n++
		i = skipSpace(raw, end)
		switch raw[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(raw, i+1)
		default:
			return false
		}
	}
}

// raw returns a member's value, null included.
func (o *fastObj) raw(name string) ([]byte, bool) {
	for k := 0; k < o.n; k++ {
		if string(o.names[k]) == name {
			return o.vals[k], true
		}
	}
	return nil, false
}

// get returns a member's value; null counts as absent, as in obj.get.
func (o *fastObj) get(name string) ([]byte, bool) {
	v, ok := o.raw(name)
	if !ok || string(v) == "null" {
		return nil, false
	}
	return v, true
}

// uint returns a member that is a plain integer in [0, MaxOffset]. ok is
// false when the member is required and absent, or not such an integer.
func (o *fastObj) uint(name string, required bool) (v uint64, present, ok bool) {
	raw, present := o.get(name)
	if !present {
		return 0, false, !required
	}
	if len(raw) == 0 || len(raw) > 16 { // 2^53 has 16 digits
		return 0, false, false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true, v <= MaxOffset
}

// str returns a member that is a string, as obj.str does.
func (o *fastObj) str(name string, required, nonEmpty bool) (string, bool) {
	raw, present := o.get(name)
	if !present {
		return "", !required
	}
	s, ok := fastString(raw)
	return s, ok && !(nonEmpty && s == "")
}

// fastString is asString for a raw value without surrounding white space;
// common words come back as constants rather than new strings.
func fastString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 {
		switch string(in) {
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

func (o *fastObj) boolean(name string) (v, ok bool) {
	raw, present := o.get(name)
	if !present {
		return false, true
	}
	switch string(raw) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

func (o *fastObj) unit(name string) (Unit, bool) {
	s, ok := o.str(name, true, false)
	u := Unit(s)
	return u, ok && u.Valid()
}

func (o *fastObj) object(name string, sub *fastObj) bool {
	raw, present := o.get(name)
	return present && sub.read(raw)
}

func (o *fastObj) rng(name string) (Range, bool) {
	var r fastObj
	if !o.object(name, &r) {
		return Range{}, false
	}
	start, _, ok1 := r.uint("start", true)
	end, _, ok2 := r.uint("end", true)
	return Range{Start: start, End: end}, ok1 && ok2
}

// optUint is an optional integer member; the caller points at v when present.
func (o *fastObj) optUint(name string, v *uint64) (present, ok bool) {
	n, present, ok := o.uint(name, false)
	*v = n
	return present, ok
}

func (o *fastObj) turnAppended() any {
	// One allocation holds the body and its token count.
	b := &struct {
		t      TurnAppended
		tokens uint64
	}{}
	t := &b.t
	var ok1, ok2 bool
	t.Offset, _, ok1 = o.uint("offset", true)
	t.Size, _, ok2 = o.uint("size", true)
	if !ok1 || !ok2 || t.Size == 0 || t.Size > MaxOffset-t.Offset {
		return nil
	}
	role, ok := o.str("role", false, false)
	if !ok {
		return nil
	}
	t.Role = role
	present, ok := o.optUint("tokens", &b.tokens)
	if !ok {
		return nil
	}
	if present {
		t.Tokens = &b.tokens
	}
	if raw, ok := o.raw("content"); ok {
		t.Content = raw
	}
	if t.Pinned, ok = o.boolean("pinned"); !ok {
		return nil
	}
	return t
}

func (o *fastObj) sessionOpened() any {
	b := &struct {
		s               SessionOpened
		window, trigger uint64
	}{}
	s := &b.s
	var ok bool
	if s.Unit, ok = o.unit("unit"); !ok {
		return nil
	}
	var f fastObj
	if !o.object("recovery_floor", &f) {
		return nil
	}
	var ok1, ok2 bool
	s.RecoveryFloor.Span, _, ok1 = f.uint("span", true)
	s.RecoveryFloor.Unit, ok2 = f.unit("unit")
	if !ok1 || !ok2 {
		return nil
	}
	wp, ok1 := o.optUint("window", &b.window)
	tp, ok2 := o.optUint("trigger", &b.trigger)
	if !ok1 || !ok2 {
		return nil
	}
	if wp {
		s.Window = &b.window
	}
	if tp {
		s.Trigger = &b.trigger
	}
	return s
}

func (o *fastObj) contextTruncated() any {
	r, ok := o.rng("range")
	if !ok || r.Start > r.End {
		return nil
	}
	stage, ok := o.str("stage", false, false)
	if !ok {
		return nil
	}
	return &ContextTruncated{Range: r, Stage: stage}
}

func (o *fastObj) compactionRequested() any {
	b := &struct {
		c                    CompactionRequested
		occupancy, threshold uint64
	}{}
	c := &b.c
	var ok [7]bool
	c.RequestID, ok[0] = o.str("request_id", false, false)
	ok[0] = ok[0] && len(c.RequestID) <= MaxIDBytes
	c.SummarizerInput, ok[1] = o.rng("summarizer_input")
	c.SummaryRange, ok[2] = o.rng("summary_range")
	c.TailStart, _, ok[3] = o.uint("tail_start", true)
	c.CarriesPriorSummary, ok[4] = o.boolean("carries_prior_summary")
	op, ok5 := o.optUint("occupancy", &b.occupancy)
	tp, ok6 := o.optUint("threshold", &b.threshold)
	ok[5], ok[6] = ok5, ok6
	for _, v := range ok {
		if !v {
			return nil
		}
	}
	if _, present := o.get("carried_pins"); present {
		return nil // the general decoder reads the list and what is wrong with it
	}
	if op {
		c.Occupancy = &b.occupancy
	}
	if tp {
		c.Threshold = &b.threshold
	}
	return c
}

// copyHeaderPacked is copyHeader with all values in one allocation: each
// key's slice is a capped window of it, so appending to one never reaches
// another. nil value slices stay nil, empty ones stay empty.
func copyHeaderPacked(h map[string][]string) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	n := 0
	for _, v := range h {
		n += len(v)
	}
	vals := make([]string, n)
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if v == nil {
			out[k] = nil
			continue
		}
		m := copy(vals, v)
		out[k] = vals[:m:m]
		vals = vals[m:]
	}
	return out
}
