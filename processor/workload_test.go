package processor_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// item is one message of a workload: a structured event line, published in
// binary or structured mode, or a raw message that is no CloudEvent at all.
type item struct {
	line       []byte
	structured bool
	raw        *nats.Msg // not nil: published as it is
	msgID      string    // not empty: the Nats-Msg-Id instead of the event id
}

// sessionScript builds one session's events.
type sessionScript struct {
	id    string
	n     int
	head  uint64
	items []item
	flip  int // alternates the content mode
}

var workloadEpoch = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

func rng(a, b uint64) map[string]uint64 { return map[string]uint64{"start": a, "end": b} }

// event appends one event and returns its id.
func (s *sessionScript) event(typ string, data any) string {
	s.n++
	id := fmt.Sprintf("%s-%04d", s.id, s.n)
	s.eventWithID(id, typ, data)
	return id
}

func (s *sessionScript) eventWithID(id, typ string, data any) {
	ev := map[string]any{
		"specversion": "1.0", "id": id, "source": "urn:agent:load/" + s.id, "type": typ,
		"subject": s.id, "time": workloadEpoch.Add(time.Duration(s.n) * time.Second).Format(time.RFC3339),
		"datacontenttype": "application/json",
	}
	if data != nil {
		ev["data"] = data
	} else {
		ev["data"] = map[string]any{}
	}
	line, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	s.flip++
	s.items = append(s.items, item{line: line, structured: s.flip%3 == 0})
}

func (s *sessionScript) open(unit string, span uint64, floorUnit string) {
	s.event(events.TypeSessionOpened, map[string]any{"unit": unit, "recovery_floor": map[string]any{"span": span, "unit": floorUnit}})
}

func (s *sessionScript) turns(k int, size uint64) {
	for range k {
		s.event(events.TypeTurnAppended, map[string]any{"offset": s.head, "size": size, "role": "tool",
			"content": map[string]any{"n": s.n, "text": fmt.Sprintf("turn at %d of %s", s.head, s.id)}})
		s.head += size
	}
}

func (s *sessionScript) turnAt(off, size uint64) {
	s.event(events.TypeTurnAppended, map[string]any{"offset": off, "size": size, "role": "user", "content": "late"})
	s.head = max(s.head, off+size)
}

func (s *sessionScript) truncate(a, b uint64) {
	s.event(events.TypeContextTruncated, map[string]any{"range": rng(a, b), "stage": "budget"})
}

func (s *sessionScript) compact(req string, input, summary map[string]uint64, tail uint64, carries bool) {
	s.event(events.TypeCompactionRequested, map[string]any{"request_id": req, "summarizer_input": input,
		"summary_range": summary, "tail_start": tail, "carries_prior_summary": carries})
}

func (s *sessionScript) commit(req string) {
	s.event(events.TypeCompactionCommitted, map[string]any{"request_id": req})
}

func (s *sessionScript) raw(body string) {
	s.n++
	m := nats.NewMsg("")
	m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-raw-%d", s.id, s.n))
	m.Data = []byte(body)
	s.items = append(s.items, item{raw: m})
}

// healthyChain is a session that compacts cleanly, again and again.
func healthyChain(s *sessionScript, span uint64, rounds int) {
	s.open("turns", span, "turns")
	var prevTail uint64
	for r := range rounds {
		s.turns(int(2*span+2), 1)
		tail := s.head - span
		req := fmt.Sprintf("h%d", r)
		if r == 0 {
			s.compact(req, rng(0, s.head), rng(0, tail), tail, false)
		} else {
			s.compact(req, rng(prevTail, s.head), rng(0, tail), tail, true)
		}
		if r%3 == 1 {
			s.compact(req, rng(prevTail, s.head), rng(0, tail), tail, r > 0) // a retry: allowed again
		}
		s.commit(req)
		prevTail = tail
	}
}

// seedLike truncates the oldest turns, is refused with a spill, retries and
// is allowed; a later truncation in the middle needs a second spill.
func seedLike(s *sessionScript) {
	const span = 4
	s.open("turns", span, "turns")
	s.turns(20, 1)
	s.truncate(0, 8)
	s.turns(4, 1)
	tail1 := s.head - span
	s.compact("c1", rng(8, s.head), rng(8, tail1), tail1, false) // spilled + refused
	s.compact("c1", rng(8, s.head), rng(8, tail1), tail1, false) // allowed, cured
	s.commit("c1")
	s.turns(12, 1)
	tail2 := s.head - span
	s.compact("c2", rng(tail1, s.head), rng(0, tail2), tail2, true) // allowed, cured by spill 1
	s.commit("c2")
	s.turns(6, 1)
	s.truncate(tail2+1, tail2+3)
	s.turns(8, 1)
	tail3 := s.head - span
	s.compact("c3", rng(tail2, s.head), rng(0, tail3), tail3, true) // spill 2 + refused
	s.compact("c3", rng(tail2, s.head), rng(0, tail3), tail3, true) // allowed
	s.commit("c3")
}

// gapThenResume leaves a gap, halts, is resumed by an operator, fills the
// gap late and closes.
func gapThenResume(s *sessionScript) {
	s.open("tokens", 2000, "tokens")
	s.turnAt(0, 1200)
	s.turnAt(1500, 3000)
	s.turnAt(4500, 2500)
	s.compact("k1", rng(0, s.head), rng(0, 4500), 4500, false) // halted
	s.compact("k2", rng(0, s.head), rng(0, 4500), 4500, false) // refused: halted
	s.commit("k1")                                             // violation
	s.event(events.TypeSessionResumed, map[string]any{"note": "tokens 1200-1500 were lost with a dropped chunk; accepted"})
	s.compact("k3", rng(0, s.head), rng(0, 4500), 4500, false) // allowed, cured
	s.commit("k3")
	s.turnAt(1200, 300) // fills the gap
	for range 12 {
		s.turnAt(s.head, 500)
	}
	tail := s.head - 2000
	s.compact("k4", rng(4500-2000, s.head), rng(0, tail), tail, true)
	s.commit("k4")
	s.commit("never-asked") // violation
	for range 10 {
		s.turnAt(s.head, 400)
	}
	s.event(events.TypeSessionClosed, nil)
	s.turnAt(s.head, 10) // rejected: closed
}

// rejections is a session with a few broken events among good ones.
func rejections(s *sessionScript) {
	s.turnAt(0, 1) // unknown_session
	s.head = 0
	s.compact("early", rng(0, 1), rng(0, 1), 1, false) // refused: unknown session
	s.open("messages", 3, "messages")
	s.turns(10, 1)
	s.turnAt(4, 1)                     // offset_conflict
	s.truncate(5, 50)                  // range_out_of_bounds
	s.event("io.seamguard.bogus", nil) // unknown_type
	s.event(events.TypeTurnAppended, map[string]any{"offset": s.head, "size": 0})
	s.raw(`{"specversion":"1.0", not json`)
	s.open("tokens", 3, "messages") // already_open
	// The same CloudEvent again under another Nats-Msg-Id: a duplicate the
	// ledger drops.
	id := s.event(events.TypeTurnAppended, map[string]any{"offset": s.head, "size": 1})
	s.head++
	s.eventWithID(id, events.TypeTurnAppended, map[string]any{"offset": s.head - 1, "size": 1})
	s.items[len(s.items)-1].msgID = id + "-again"
	s.turns(6, 1)
	for r := range 5 {
		s.turns(8, 1)
		tail := s.head - 3
		s.compact(fmt.Sprintf("m%d", r), rng(0, s.head), rng(0, tail), tail, false)
		s.commit(fmt.Sprintf("m%d", r))
	}
	s.event(events.TypeSessionResumed, map[string]any{"note": ""}) // bad_data: note required
}

// unitMismatch declares a floor in another unit than its offsets.
func unitMismatch(s *sessionScript) {
	s.open("tokens", 100, "turns")
	for range 30 {
		s.turnAt(s.head, 50)
	}
	tail := s.head - 100
	s.compact("u1", rng(0, s.head), rng(0, tail), tail, false) // spill + refused
	s.compact("u1", rng(0, s.head), rng(0, tail), tail, false) // allowed
	s.commit("u1")
	for range 10 {
		s.turnAt(s.head, 50)
	}
	tail = s.head - 100
	s.compact("u2", rng(0, s.head), rng(0, tail), tail, false) // new offsets at risk: spill 2 + refused
	s.compact("u2", rng(0, s.head), rng(0, tail), tail, false) // allowed
	s.commit("u2")
}

// workload is a deterministic mix of sessions, interleaved.
type workload struct {
	items    []item
	sessions int
}

func genWorkload(sessions int) *workload {
	scripts := make([]*sessionScript, sessions)
	for i := range scripts {
		s := &sessionScript{id: fmt.Sprintf("load-%02d", i)}
		switch i % 5 {
		case 0:
			healthyChain(s, uint64(3+i%4), 5)
		case 1:
			seedLike(s)
		case 2:
			gapThenResume(s)
		case 3:
			rejections(s)
		case 4:
			unitMismatch(s)
		}
		scripts[i] = s
	}
	r := rand.New(rand.NewPCG(42, 7))
	w := &workload{sessions: sessions}
	next := make([]int, sessions)
	for left := sessions; left > 0; {
		i := r.IntN(sessions)
		s := scripts[i]
		if next[i] == len(s.items) {
			continue
		}
		it := s.items[next[i]]
		if it.raw != nil {
			m := *it.raw
			m.Subject = fmt.Sprintf("seamguard.events.%s", s.id)
			it.raw = &m
		}
		w.items = append(w.items, it)
		next[i]++
		if next[i] == len(s.items) {
			left--
		}
	}
	return w
}

// msgs returns fresh NATS messages of the workload.
func (w *workload) msgs(t testing.TB, subj events.Subjects) []*nats.Msg {
	out := make([]*nats.Msg, len(w.items))
	for i, it := range w.items {
		switch {
		case it.raw != nil:
			m := nats.NewMsg(it.raw.Subject)
			for k, v := range it.raw.Header {
				m.Header[k] = append([]string(nil), v...)
			}
			m.Data = it.raw.Data
			out[i] = m
		case it.structured:
			out[i] = structuredMsg(t, subj, it.line)
		default:
			out[i] = binaryMsg(t, subj, it.line)
		}
		if it.msgID != "" {
			out[i].Header.Set(jetstream.MsgIDHeader, it.msgID)
		}
	}
	return out
}

func TestWorkloadShape(t *testing.T) {
	w := genWorkload(50)
	require.GreaterOrEqual(t, len(w.items), 2000)
}
