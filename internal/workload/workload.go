package workload

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// Item is one message of a workload: a structured event line, published in
// binary or structured mode, or a raw message that is no CloudEvent at all.
type Item struct {
	Line       []byte
	Structured bool
	Raw        *nats.Msg // not nil: published as it is
	MsgID      string    // not empty: the Nats-Msg-Id instead of the event id
	Session    string
	// Control: published on the session's control subject, as an operator
	// publishes session.resumed, rather than its events subject.
	Control bool
}

// Script builds one session's events in order.
type Script struct {
	ID    string
	N     int    // events so far; the next event id ends in N+1
	Head  uint64 // end of the last turn appended
	Items []Item
	flip  int // alternates the content mode
}

// Epoch is the time of every script's first event; each later event is one
// second after the one before.
var Epoch = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

// R is a range as event data spells it.
func R(a, b uint64) map[string]uint64 { return map[string]uint64{"start": a, "end": b} }

// Event appends one event of type typ with data (nil: {}) and returns its id.
func (s *Script) Event(typ string, data any) string {
	s.N++
	id := fmt.Sprintf("%s-%04d", s.ID, s.N)
	s.EventWithID(id, typ, data)
	return id
}

// EventWithID appends one event with the given id.
func (s *Script) EventWithID(id, typ string, data any) {
	ev := map[string]any{
		"specversion": "1.0", "id": id, "source": "urn:agent:load/" + s.ID, "type": typ,
		"subject": s.ID, "time": Epoch.Add(time.Duration(s.N) * time.Second).Format(time.RFC3339),
		"datacontenttype": "application/json",
	}
	if data != nil {
		ev["data"] = data
	} else {
		ev["data"] = map[string]any{}
	}
	line, err := json.Marshal(ev)
	if err != nil {
		panic(err) // only maps, strings and numbers: cannot fail
	}
	s.flip++
	s.Items = append(s.Items, Item{Line: line, Structured: s.flip%3 == 0, Session: s.ID, Control: typ == events.TypeSessionResumed})
}

// Open appends session.opened.
func (s *Script) Open(unit string, span uint64, floorUnit string) {
	s.Event(events.TypeSessionOpened, map[string]any{"unit": unit, "recovery_floor": map[string]any{"span": span, "unit": floorUnit}})
}

// Turns appends k turns of the given size at the head.
func (s *Script) Turns(k int, size uint64) {
	for range k {
		s.Event(events.TypeTurnAppended, map[string]any{"offset": s.Head, "size": size, "role": "tool",
			"content": map[string]any{"n": s.N, "text": fmt.Sprintf("turn at %d of %s", s.Head, s.ID)}})
		s.Head += size
	}
}

// PaddedTurns appends k turns of size 1 at the head, each carrying about
// pad bytes of content: a transcript of about k*pad bytes.
func (s *Script) PaddedTurns(k, pad int) {
	text := strings.Repeat("lorem ipsum dolor sit amet, ", pad/28+1)[:pad]
	for range k {
		s.Event(events.TypeTurnAppended, map[string]any{"offset": s.Head, "size": 1, "role": "tool",
			"content": map[string]any{"n": s.N, "text": text}})
		s.Head++
	}
}

// TurnAt appends one turn at off, which may leave a gap or fill one.
func (s *Script) TurnAt(off, size uint64) {
	s.Event(events.TypeTurnAppended, map[string]any{"offset": off, "size": size, "role": "user", "content": "late"})
	s.Head = max(s.Head, off+size)
}

// Truncate appends context.truncated of [a, b).
func (s *Script) Truncate(a, b uint64) {
	s.Event(events.TypeContextTruncated, map[string]any{"range": R(a, b), "stage": "budget"})
}

// Compact appends compaction.requested.
func (s *Script) Compact(req string, input, summary map[string]uint64, tail uint64, carries bool) {
	s.Event(events.TypeCompactionRequested, map[string]any{"request_id": req, "summarizer_input": input,
		"summary_range": summary, "tail_start": tail, "carries_prior_summary": carries})
}

// Commit appends compaction.committed.
func (s *Script) Commit(req string) {
	s.Event(events.TypeCompactionCommitted, map[string]any{"request_id": req})
}

// RawBody appends a message that is published as it is, on the session's
// subject.
func (s *Script) RawBody(body string) {
	s.N++
	m := nats.NewMsg("")
	m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-raw-%d", s.ID, s.N))
	m.Data = []byte(body)
	s.Items = append(s.Items, Item{Raw: m, Session: s.ID})
}

// Resend appends the last event again, as an agent retrying a publish whose
// ack it lost: the same event under the same Nats-Msg-Id, which the stream's
// duplicate window drops.
func (s *Script) Resend() {
	if len(s.Items) > 0 {
		s.Items = append(s.Items, s.Items[len(s.Items)-1])
	}
}

// HealthyChain is a session that compacts cleanly, again and again.
func HealthyChain(s *Script, span uint64, rounds int) {
	s.Open("turns", span, "turns")
	Rounds(s, "h", span, rounds, 0, true)
}

// Rounds appends rounds of turns, each followed by a compaction whose
// summary covers everything before the tail and which is committed; every
// third round is also sent twice, as a retry. The first round's summarizer
// reads from prevTail (from 0 without carrying a summary when first).
func Rounds(s *Script, prefix string, span uint64, rounds int, prevTail uint64, first bool) {
	for r := range rounds {
		s.Turns(int(2*span+2), 1)
		tail := s.Head - span
		req := fmt.Sprintf("%s%d", prefix, r)
		carries := !(first && r == 0)
		s.Compact(req, R(prevTail, s.Head), R(0, tail), tail, carries)
		if r%3 == 1 {
			s.Compact(req, R(prevTail, s.Head), R(0, tail), tail, carries) // a retry: allowed again
		}
		s.Commit(req)
		prevTail = tail
	}
}

// SeedLike truncates the oldest turns, is refused with a spill, retries and
// is allowed; a later truncation in the middle needs a second spill.
func SeedLike(s *Script) {
	const span = 4
	s.Open("turns", span, "turns")
	s.Turns(20, 1)
	s.Truncate(0, 8)
	s.Turns(4, 1)
	tail1 := s.Head - span
	s.Compact("c1", R(8, s.Head), R(8, tail1), tail1, false) // spilled + refused
	s.Compact("c1", R(8, s.Head), R(8, tail1), tail1, false) // allowed, cured
	s.Commit("c1")
	s.Turns(12, 1)
	tail2 := s.Head - span
	s.Compact("c2", R(tail1, s.Head), R(0, tail2), tail2, true) // allowed, cured by spill 1
	s.Commit("c2")
	s.Turns(6, 1)
	s.Truncate(tail2+1, tail2+3)
	s.Turns(8, 1)
	tail3 := s.Head - span
	s.Compact("c3", R(tail2, s.Head), R(0, tail3), tail3, true) // spill 2 + refused
	s.Compact("c3", R(tail2, s.Head), R(0, tail3), tail3, true) // allowed
	s.Commit("c3")
}

// GapThenResume leaves a gap, halts, is resumed by an operator, fills the
// gap late and closes.
func GapThenResume(s *Script) {
	s.Open("tokens", 2000, "tokens")
	s.TurnAt(0, 1200)
	s.TurnAt(1500, 3000)
	s.TurnAt(4500, 2500)
	s.Compact("k1", R(0, s.Head), R(0, 4500), 4500, false) // halted
	s.Compact("k2", R(0, s.Head), R(0, 4500), 4500, false) // refused: halted
	s.Commit("k1")                                         // violation
	s.Event(events.TypeSessionResumed, map[string]any{"note": "tokens 1200-1500 were lost with a dropped chunk; accepted"})
	s.Compact("k3", R(0, s.Head), R(0, 4500), 4500, false) // allowed, cured
	s.Commit("k3")
	s.TurnAt(1200, 300) // fills the gap
	for range 12 {
		s.TurnAt(s.Head, 500)
	}
	tail := s.Head - 2000
	s.Compact("k4", R(4500-2000, s.Head), R(0, tail), tail, true)
	s.Commit("k4")
	s.Commit("never-asked") // violation
	for range 10 {
		s.TurnAt(s.Head, 400)
	}
	s.Event(events.TypeSessionClosed, nil)
	s.TurnAt(s.Head, 10) // rejected: closed
}

// Rejections is a session with a few broken events among good ones.
func Rejections(s *Script) {
	s.TurnAt(0, 1) // unknown_session
	s.Head = 0
	s.Compact("early", R(0, 1), R(0, 1), 1, false) // refused: unknown session
	s.Open("messages", 3, "messages")
	s.Turns(10, 1)
	s.TurnAt(4, 1)                     // offset_conflict
	s.Truncate(5, 50)                  // range_out_of_bounds
	s.Event("io.seamguard.bogus", nil) // unknown_type
	s.Event(events.TypeTurnAppended, map[string]any{"offset": s.Head, "size": 0})
	s.RawBody(`{"specversion":"1.0", not json`)
	s.Open("tokens", 3, "messages") // already_open
	// The same CloudEvent again under another Nats-Msg-Id: a duplicate the
	// ledger drops.
	id := s.Event(events.TypeTurnAppended, map[string]any{"offset": s.Head, "size": 1})
	s.Head++
	s.EventWithID(id, events.TypeTurnAppended, map[string]any{"offset": s.Head - 1, "size": 1})
	s.Items[len(s.Items)-1].MsgID = id + "-again"
	s.Turns(6, 1)
	for r := range 5 {
		s.Turns(8, 1)
		tail := s.Head - 3
		s.Compact(fmt.Sprintf("m%d", r), R(0, s.Head), R(0, tail), tail, false)
		s.Commit(fmt.Sprintf("m%d", r))
	}
	s.Event(events.TypeSessionResumed, map[string]any{"note": ""}) // bad_data: note required
}

// UnitMismatch declares a floor in another unit than its offsets.
func UnitMismatch(s *Script) {
	s.Open("tokens", 100, "turns")
	for range 30 {
		s.TurnAt(s.Head, 50)
	}
	tail := s.Head - 100
	s.Compact("u1", R(0, s.Head), R(0, tail), tail, false) // spill + refused
	s.Compact("u1", R(0, s.Head), R(0, tail), tail, false) // allowed
	s.Commit("u1")
	for range 10 {
		s.TurnAt(s.Head, 50)
	}
	tail = s.Head - 100
	s.Compact("u2", R(0, s.Head), R(0, tail), tail, false) // new offsets at risk: spill 2 + refused
	s.Compact("u2", R(0, s.Head), R(0, tail), tail, false) // allowed
	s.Commit("u2")
}

// Workload is a deterministic mix of sessions, interleaved.
type Workload struct {
	Items    []Item
	Sessions int
}

// Generate builds the fleet the processor's tests use: sessions named
// load-NN, cycling through the five kinds of script, interleaved at random
// with a fixed seed.
func Generate(sessions int) *Workload {
	scripts := make([]*Script, sessions)
	for i := range scripts {
		s := &Script{ID: fmt.Sprintf("load-%02d", i)}
		switch i % 5 {
		case 0:
			HealthyChain(s, uint64(3+i%4), 5)
		case 1:
			SeedLike(s)
		case 2:
			GapThenResume(s)
		case 3:
			Rejections(s)
		case 4:
			UnitMismatch(s)
		}
		scripts[i] = s
	}
	return Interleave(scripts, rand.New(rand.NewPCG(42, 7)))
}

// Interleave merges the scripts into one order, keeping each script's own
// order, picking the next script at random.
func Interleave(scripts []*Script, r *rand.Rand) *Workload {
	w := &Workload{Sessions: len(scripts)}
	next := make([]int, len(scripts))
	for left := len(scripts); left > 0; {
		i := r.IntN(len(scripts))
		s := scripts[i]
		if next[i] == len(s.Items) {
			continue
		}
		w.Items = append(w.Items, s.Items[next[i]])
		next[i]++
		if next[i] == len(s.Items) {
			left--
		}
	}
	return w
}

// Msgs returns fresh NATS messages of the workload on subj's subjects.
func (w *Workload) Msgs(subj events.Subjects) ([]*nats.Msg, error) {
	out := make([]*nats.Msg, len(w.Items))
	for i, it := range w.Items {
		m, err := it.Msg(subj)
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		out[i] = m
	}
	return out, nil
}

// Msg returns a fresh NATS message of the item.
func (it Item) Msg(subj events.Subjects) (*nats.Msg, error) {
	var m *nats.Msg
	var err error
	switch {
	case it.Raw != nil:
		m = nats.NewMsg(subj.Events(it.Session))
		for k, v := range it.Raw.Header {
			m.Header[k] = append([]string(nil), v...)
		}
		m.Data = it.Raw.Data
	case it.Structured:
		m, err = StructuredMsg(subj, it.Line)
	default:
		m, err = BinaryMsg(subj, it.Line)
	}
	if err != nil {
		return nil, err
	}
	if it.MsgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, it.MsgID)
	}
	switch ctl := subj.IsControl(m.Subject); {
	case it.Raw != nil:
	case it.Control && !ctl:
		m.Subject = subj.Control(it.Session)
	case !it.Control && ctl:
		m.Subject = subj.Events(it.Session)
	}
	return m, nil
}

// BinaryMsg turns a structured event line into a binary-mode message: data
// as the body, every other attribute as a ce- header, datacontenttype as
// Content-Type, and the id as Nats-Msg-Id. A session.resumed goes on the
// session's control subject, anything else on its events subject.
func BinaryMsg(subj events.Subjects, line []byte) (*nats.Msg, error) {
	var attrs map[string]json.RawMessage
	if err := json.Unmarshal(line, &attrs); err != nil {
		return nil, fmt.Errorf("binary message: %w", err)
	}
	var session, id string
	if err := json.Unmarshal(attrs["subject"], &session); err != nil {
		return nil, fmt.Errorf("binary message: subject: %w", err)
	}
	if err := json.Unmarshal(attrs["id"], &id); err != nil {
		return nil, fmt.Errorf("binary message: id: %w", err)
	}
	m := nats.NewMsg(subjectOf(subj, session, attrs["type"]))
	for name, raw := range attrs {
		if name == "data" {
			m.Data = raw
			continue
		}
		val := string(raw)
		var s string
		if json.Unmarshal(raw, &s) == nil {
			val = s
		}
		if name == "datacontenttype" {
			m.Header.Set("Content-Type", val)
			continue
		}
		m.Header.Set("ce-"+name, val)
	}
	m.Header.Set(jetstream.MsgIDHeader, id)
	return m, nil
}

// subjectOf is where an event of type typ (its JSON) about session is
// published: a session.resumed on the control subject, as an operator
// publishes it, everything else on the events subject.
func subjectOf(subj events.Subjects, session string, typ json.RawMessage) string {
	var t string
	if json.Unmarshal(typ, &t) == nil && t == events.TypeSessionResumed {
		return subj.Control(session)
	}
	return subj.Events(session)
}

// StructuredMsg publishes the line as it is, in structured mode.
func StructuredMsg(subj events.Subjects, line []byte) (*nats.Msg, error) {
	var a struct {
		ID, Subject string
		Type        json.RawMessage
	}
	if err := json.Unmarshal(line, &a); err != nil {
		return nil, fmt.Errorf("structured message: %w", err)
	}
	m := nats.NewMsg(subjectOf(subj, a.Subject, a.Type))
	m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	m.Header.Set(jetstream.MsgIDHeader, a.ID)
	m.Data = append([]byte(nil), line...)
	return m, nil
}
