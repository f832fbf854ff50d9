package processor_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// badInputCorpus is the bad-input corpus: one JSON object a line.
//
// A case names the content modes it applies to ("binary", "structured"),
// the NATS subject token it is published on, optional NATS headers and the
// raw body. When a case applies to both modes its body is a structured
// event; the binary variant moves every attribute but data to a ce-* header
// (datacontenttype to Content-Type) and sends data as the body. A case for a
// single mode is published exactly as written. Placeholders keep the file
// small: @ID@ is the case's line number, @M@ the mode ("b" or "s"), @OFF@ an
// offset that differs by mode, @NEST(n)@ n nested arrays, @PAD(n)@ n bytes of
// text.
//
// code and field are the expected event.rejected. "ledger" marks cases that
// only the session state can reject (or accept), so the codec alone says
// nothing about them. "expect" is "duplicate" (no verdict at all) or
// "accepted" (no rejection) for the cases that must not be rejected.
const badInputCorpus = "testdata/badinput/corpus.jsonl"

type badCase struct {
	Name    string              `json:"name"`
	Modes   []string            `json:"modes"`
	Token   string              `json:"token"`
	Headers map[string][]string `json:"headers"`
	Body    string              `json:"body"`
	Code    events.Code         `json:"code"`
	Field   string              `json:"field"`
	Note    string              `json:"note"`
	Ledger  bool                `json:"ledger"`
	Expect  string              `json:"expect"`
	// Control says whether the case is published on the control subject;
	// absent, a session.resumed is and everything else is not.
	Control *bool `json:"control"`
	line    int
}

// subject is the NATS subject case c is published on.
func (c badCase) subject(subj events.Subjects) string {
	ctl := strings.Contains(c.Body, `"type":"`+events.TypeSessionResumed+`"`)
	if c.Control != nil {
		ctl = *c.Control
	}
	if ctl {
		return subj.Control(c.Token)
	}
	return subj.Events(c.Token)
}

func loadBadCases(t *testing.T) []badCase {
	t.Helper()
	var out []badCase
	names := map[string]bool{}
	for i, l := range readLines(t, badInputCorpus) {
		var c badCase
		require.NoError(t, json.Unmarshal(l, &c), "corpus line %d", i+1)
		c.line = i + 1
		require.NotEmpty(t, c.Name, "line %d", c.line)
		require.False(t, names[c.Name], "case %q twice", c.Name)
		names[c.Name] = true
		require.NotEmpty(t, c.Modes, c.Name)
		for _, m := range c.Modes {
			require.Contains(t, []string{"binary", "structured"}, m, c.Name)
		}
		require.NotEmpty(t, c.Token, c.Name)
		if c.Expect == "" {
			require.NotEmpty(t, c.Code, c.Name)
		} else {
			require.Contains(t, []string{"duplicate", "accepted"}, c.Expect, c.Name)
		}
		out = append(out, c)
	}
	return out
}

var (
	nestRE = regexp.MustCompile(`@NEST\((\d+)\)@`)
	padRE  = regexp.MustCompile(`@PAD\((\d+)\)@`)
)

func expand(c badCase, mode string, s string) string {
	m := mode[:1]
	off := "0"
	if m == "s" {
		off = "1"
	}
	s = strings.NewReplacer("@ID@", strconv.Itoa(c.line), "@M@", m, "@OFF@", off).Replace(s)
	s = nestRE.ReplaceAllStringFunc(s, func(x string) string {
		n, _ := strconv.Atoi(nestRE.FindStringSubmatch(x)[1])
		return strings.Repeat("[", n) + strings.Repeat("]", n)
	})
	return padRE.ReplaceAllStringFunc(s, func(x string) string {
		n, _ := strconv.Atoi(padRE.FindStringSubmatch(x)[1])
		return strings.Repeat("x", n)
	})
}

// badMsg builds the NATS message of case c in mode; structured messages get
// Content-Type application/cloudevents+json when withCT is set.
func badMsg(t *testing.T, subj events.Subjects, c badCase, mode string, withCT bool) *nats.Msg {
	t.Helper()
	m := nats.NewMsg(c.subject(subj))
	body := expand(c, mode, c.Body)
	if len(c.Modes) == 2 && mode == "binary" {
		var attrs map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(body), &attrs), c.Name)
		body = ""
		for name, raw := range attrs {
			if name == "data" {
				body = string(raw)
				continue
			}
			val := string(raw)
			var s string
			if json.Unmarshal(raw, &s) == nil {
				val = s
			}
			if name == "datacontenttype" {
				m.Header.Set("Content-Type", val)
			} else {
				m.Header.Set("ce-"+name, val)
			}
		}
	} else if mode == "structured" && withCT {
		m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	}
	for k, vs := range c.Headers {
		m.Header.Del(k)
		for _, v := range vs {
			m.Header[k] = append(m.Header[k], expand(c, mode, v)) // as written, not canonicalised
		}
	}
	m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("badinput-%d-%s", c.line, mode))
	m.Data = []byte(body)
	return m
}

// TestBadInputCorpusDecode holds the codec to the corpus: every case the
// codec alone decides gets the expected code and field from DecodeMsg.
func TestBadInputCorpusDecode(t *testing.T) {
	cases := loadBadCases(t)
	require.GreaterOrEqual(t, len(cases), 40)
	subj := baseConfig().Subjects()
	for _, c := range cases {
		for i, mode := range c.Modes {
			m := badMsg(t, subj, c, mode, i%2 == 0)
			_, err := events.DecodeMsg(m.Subject, m.Header, m.Data, subj)
			if c.Ledger {
				require.NoError(t, err, "%s (%s): the codec must pass it to the ledger", c.Name, mode)
				continue
			}
			var e *events.Error
			require.ErrorAs(t, err, &e, "%s (%s)", c.Name, mode)
			assert.Equal(t, c.Code, e.Code, "%s (%s): %s", c.Name, mode, e.Message)
			assert.Equal(t, c.Field, e.Field, "%s (%s): %s", c.Name, mode, e.Message)
			assert.NotEmpty(t, e.Message, c.Name)
		}
	}
}

// badInputSetup are the valid sessions that the stateful cases need.
func badInputSetup() []*sessionScript {
	closed := &sessionScript{ID: "closedsess"}
	closed.Open("turns", 4, "turns")
	closed.Turns(1, 1)
	closed.Event(events.TypeSessionClosed, nil)
	state := &sessionScript{ID: "statesess"}
	state.Open("turns", 4, "turns")
	state.Turns(4, 1) // statesess-0003 is the turn at offset 1
	big := &sessionScript{ID: "bigsess"}
	big.Open("turns", 4, "turns")
	return []*sessionScript{closed, state, big}
}

// badInputReference is the clean session: a truncation, a compaction that
// is refused and spilled, its retry allowed, a commit, and a clean
// compaction after more turns.
func badInputReference() *sessionScript {
	s := &sessionScript{ID: "clean"}
	s.Open("turns", 4, "turns")
	s.Turns(10, 1)
	s.Truncate(0, 3)
	s.Compact("c1", rng(0, 10), rng(0, 6), 6, false) // reach [2,6) and [0,3) lost: refused, spilled
	s.Compact("c1", rng(0, 10), rng(0, 6), 6, false) // the retry: allowed by the spill
	s.Commit("c1")
	s.Turns(6, 1)
	s.Compact("c2", rng(6, 16), rng(0, 12), 12, true)
	s.Commit("c2")
	return s
}

func scriptMsgs(t *testing.T, subj events.Subjects, s *sessionScript) []*nats.Msg {
	out := make([]*nats.Msg, 0, len(s.Items))
	for _, it := range s.Items {
		if it.Structured {
			out = append(out, structuredMsg(t, subj, it.Line))
		} else {
			out = append(out, binaryMsg(t, subj, it.Line))
		}
	}
	return out
}

type badInstance struct {
	c    badCase
	mode string
}

// TestBadInputCorpus publishes every corpus case in every mode, interleaved
// with a reference session, to one processor: each case gets exactly one
// event.rejected with its code and field (or, for duplicates and valid
// large inputs, none), nothing is redelivered, the processor keeps running,
// and the reference session is decided exactly as on its own.
func TestBadInputCorpus(t *testing.T) {
	cases := loadBadCases(t)
	cfg := baseConfig()
	cfg.AckWait = time.Second // a poison message left unterminated would come back soon
	subj := cfg.Subjects()

	run := func(t *testing.T, withCorpus bool) ([]verdictMsg, map[uint64]badInstance) {
		e := newEnv(t)
		r := e.start(t, cfg)
		var msgs []*nats.Msg
		where := map[int]badInstance{}
		if withCorpus {
			for _, s := range badInputSetup() {
				msgs = append(msgs, scriptMsgs(t, subj, s)...)
			}
		}
		var pending []badInstance
		if withCorpus {
			for _, c := range cases {
				for _, mode := range c.Modes {
					pending = append(pending, badInstance{c, mode})
				}
			}
		}
		ref := scriptMsgs(t, subj, badInputReference())
		per := (len(pending) + len(ref) - 1) / len(ref)
		structured := 0
		for _, m := range ref {
			msgs = append(msgs, m)
			for k := 0; k < per && len(pending) > 0; k++ {
				in := pending[0]
				pending = pending[1:]
				withCT := false
				if in.mode == "structured" {
					structured++
					withCT = structured%2 == 0
				}
				where[len(msgs)] = in
				msgs = append(msgs, badMsg(t, subj, in.c, in.mode, withCT))
			}
		}
		require.Empty(t, pending, "every case placed")
		seqs := e.publishAll(t, msgs)
		bySeq := map[uint64]badInstance{}
		for i, in := range where {
			bySeq[seqs[i]] = in
		}
		e.waitIdle(t, cfg, 30*time.Second)
		if withCorpus {
			// Nothing comes back over more than two ack deadlines: every
			// poison message was terminated once.
			require.Never(t, func() bool {
				info := e.consumerInfo(t, cfg)
				return info.NumAckPending != 0 || info.NumRedelivered != 0 || info.NumPending != 0
			}, 2500*time.Millisecond, 100*time.Millisecond, "a message pending or redelivered")
		}
		select {
		case err := <-r.done:
			r.ended, r.err = true, err
			t.Fatalf("Run returned while handling bad input: %v", err)
		default:
		}
		vs := e.verdicts(t, cfg)
		require.NoError(t, r.stop(t))
		return vs, bySeq
	}

	clean, _ := run(t, false)
	mixed, bySeq := run(t, true)

	wantRejected := 0
	for _, in := range bySeq {
		if in.c.Expect == "" {
			wantRejected++
		}
	}
	var rest []verdictMsg
	got := map[uint64]bool{}
	for _, v := range mixed {
		if v.v.Type != events.TypeEventRejected {
			if v.v.Session == "clean" {
				rest = append(rest, v)
			} else {
				t.Errorf("verdict outside the reference session: %s", describe(v.v))
			}
			continue
		}
		d := v.v.Data.(*events.EventRejected)
		in, ok := bySeq[d.Input.Seq]
		if !assert.True(t, ok, "rejection of stream seq %d, which is no corpus case: %s", d.Input.Seq, describe(v.v)) {
			continue
		}
		name := fmt.Sprintf("%s (%s, line %d)", in.c.Name, in.mode, in.c.line)
		assert.False(t, got[d.Input.Seq], "%s: second rejection", name)
		got[d.Input.Seq] = true
		assert.Empty(t, in.c.Expect, "%s must not be rejected: %s", name, describe(v.v))
		assert.Equal(t, in.c.Code, d.Code, "%s: %s", name, d.Message)
		assert.Equal(t, in.c.Field, d.Field, "%s: %s", name, d.Message)
		assert.NotEmpty(t, d.Message, name)
		assert.Equal(t, in.c.subject(subj), d.Input.Subject, "%s: input.subject is the subject it was published on", name)
	}
	for seq, in := range bySeq {
		if in.c.Expect == "" {
			assert.True(t, got[seq], "%s (%s, line %d): no rejection at seq %d", in.c.Name, in.mode, in.c.line, seq)
		}
	}
	assert.Len(t, got, wantRejected, "one rejection per rejected case")

	// The reference session is decided as on its own.
	require.Len(t, rest, len(clean))
	for i := range clean {
		require.Equal(t, clean[i].v.ID, rest[i].v.ID)
		require.Equal(t, clean[i].v.Type, rest[i].v.Type)
		assertSameDecision(t, clean[i].v, rest[i].v)
		if w, ok := clean[i].v.Data.(*events.SpillHandle); ok {
			assert.Equal(t, w.Digest, rest[i].v.Data.(*events.SpillHandle).Digest, "the spill holds the same events")
		}
	}
	var kinds []string
	for _, v := range clean {
		kinds = append(kinds, v.v.Type)
	}
	require.Contains(t, kinds, events.TypeCompactionRefused, "the reference has a refusal")
	require.Contains(t, kinds, events.TypeTranscriptSpilled, "the reference has a spill")
	require.Contains(t, kinds, events.TypeCompactionAllowed, "the reference has an allowed retry")
}
