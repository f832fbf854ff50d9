package processor_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// poison is one broken message and the rejection it must get.
type poison struct {
	name string
	msg  func(subj events.Subjects) *nats.Msg
	code events.Code
	// session is the subject token the rejection is filed under; empty
	// when the NATS subject names no valid session.
	session string
}

func poisons() []poison {
	ce := func(subject string, h map[string]string, body string) *nats.Msg {
		m := nats.NewMsg(subject)
		for k, v := range h {
			m.Header.Set(k, v)
		}
		m.Data = []byte(body)
		return m
	}
	binaryHeaders := func(id, session, specversion string) map[string]string {
		return map[string]string{
			"ce-specversion": specversion, "ce-id": id, "ce-source": "urn:agent:poison",
			"ce-type": events.TypeSessionResumed, "ce-subject": session, "Content-Type": "application/json",
			"Nats-Msg-Id": id,
		}
	}
	return []poison{
		{"not json", func(s events.Subjects) *nats.Msg {
			return ce(s.Events("ops-agent-42"), map[string]string{"Nats-Msg-Id": "p1"}, `{"specversion": "1.0", "id": oops`)
		}, events.CodeMalformed, "ops-agent-42"},
		{"wrong specversion", func(s events.Subjects) *nats.Msg {
			return ce(s.Events("ops-agent-42"), binaryHeaders("p2", "ops-agent-42", "0.3"), `{"note":"x"}`)
		}, events.CodeBadSpecversion, "ops-agent-42"},
		{"subject mismatch", func(s events.Subjects) *nats.Msg {
			return ce(s.Events("a"), binaryHeaders("p3", "b", "1.0"), `{"note":"x"}`)
		}, events.CodeSubjectMismatch, "a"},
		{"bad session token", func(s events.Subjects) *nats.Msg {
			return ce(s.Events("sess$1"), binaryHeaders("p4", "sess$1", "1.0"), `{"note":"x"}`)
		}, events.CodeBadSessionID, ""},
		{"multi-token subject", func(s events.Subjects) *nats.Msg {
			return ce(s.Events("a.b"), binaryHeaders("p5", "a", "1.0"), `{"note":"x"}`)
		}, events.CodeBadSessionID, ""},
		// Authority: an agent's resume on the events subject, and a turn on
		// the control subject, are both not permitted.
		{"resume on the events subject", func(s events.Subjects) *nats.Msg {
			return ce(s.Events("ops-agent-42"), binaryHeaders("p6", "ops-agent-42", "1.0"), `{"note":"an agent waives its own gap"}`)
		}, events.CodeNotPermitted, "ops-agent-42"},
		{"turn on the control subject", func(s events.Subjects) *nats.Msg {
			h := binaryHeaders("p7", "ops-agent-42", "1.0")
			h["ce-type"] = events.TypeTurnAppended
			return ce(s.Control("ops-agent-42"), h, `{"offset":1000,"size":1}`)
		}, events.CodeNotPermitted, "ops-agent-42"},
		{"control subject of no session", func(s events.Subjects) *nats.Msg {
			return ce(s.Control("sess$2"), binaryHeaders("p8", "sess$2", "1.0"), `{"note":"x"}`)
		}, events.CodeBadSessionID, ""},
		{"multi-token control subject", func(s events.Subjects) *nats.Msg {
			return ce(s.Control("a.b"), binaryHeaders("p9", "a", "1.0"), `{"note":"x"}`)
		}, events.CodeBadSessionID, ""},
	}
}

// TestPoisonMessages interleaves broken messages with the seed story: each
// gets exactly one event.rejected with its code, is terminated (never
// redelivered), and the story is decided exactly as without them.
func TestPoisonMessages(t *testing.T) {
	lines := readLines(t, seedStory)
	cfg := baseConfig()
	cfg.AckWait = time.Second // a message left unterminated would come back soon

	run := func(t *testing.T, withPoison bool) (*env, []verdictMsg, map[uint64]poison) {
		e := newEnv(t)
		r := e.start(t, cfg)
		subj := cfg.Subjects()
		var msgs []*nats.Msg
		where := map[int]poison{}
		ps := poisons()
		for i, l := range lines {
			if withPoison && i%6 == 4 && len(ps) > 0 {
				where[len(msgs)] = ps[0]
				msgs = append(msgs, ps[0].msg(subj))
				ps = ps[1:]
			}
			msgs = append(msgs, binaryMsg(t, subj, l))
		}
		if withPoison {
			require.Empty(t, ps, "every poison placed")
		}
		seqs := e.publishAll(t, msgs)
		bySeq := map[uint64]poison{}
		for i, p := range where {
			bySeq[seqs[i]] = p
		}
		e.waitIdle(t, cfg, 30*time.Second)
		// Nothing comes back: not one message pending or redelivered over
		// more than two ack deadlines.
		require.Never(t, func() bool {
			info := e.consumerInfo(t, cfg)
			return info.NumAckPending != 0 || info.NumRedelivered != 0 || info.NumPending != 0
		}, 2500*time.Millisecond, 100*time.Millisecond)
		require.NoError(t, r.stop(t))
		return e, e.verdicts(t, cfg), bySeq
	}

	_, clean, _ := run(t, false)
	_, mixed, bySeq := run(t, true)

	var rejected, rest []verdictMsg
	for _, v := range mixed {
		if v.v.Type == events.TypeEventRejected {
			rejected = append(rejected, v)
		} else {
			rest = append(rest, v)
		}
	}
	require.Len(t, rejected, len(bySeq), "one rejection per poison message")
	seen := map[uint64]bool{}
	for _, v := range rejected {
		d := v.v.Data.(*events.EventRejected)
		p, ok := bySeq[d.Input.Seq]
		require.True(t, ok, "rejection of stream seq %d, which is no poison: %s", d.Input.Seq, describe(v.v))
		require.False(t, seen[d.Input.Seq], "second rejection of seq %d", d.Input.Seq)
		seen[d.Input.Seq] = true
		assert.Equal(t, p.code, d.Code, "%s: %s", p.name, d.Message)
		assert.NotEmpty(t, d.Message, p.name)
		assert.Equal(t, p.session, v.v.Session, p.name)
		session := p.session
		if session == "" {
			session = events.InvalidSession
		}
		assert.Equal(t, cfg.Subjects().Verdict(session, events.KindRejected), v.subject, p.name)
	}

	// The story's own verdicts are those of the clean run; only the stream
	// sequences in the spill handles moved.
	require.Len(t, rest, len(clean))
	for i := range clean {
		require.Equal(t, clean[i].v.ID, rest[i].v.ID)
		assertSameDecision(t, clean[i].v, rest[i].v)
		if w, ok := clean[i].v.Data.(*events.SpillHandle); ok {
			assert.Equal(t, w.Digest, rest[i].v.Data.(*events.SpillHandle).Digest, "the spill holds the same events")
		}
	}
}
