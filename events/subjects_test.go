package events

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
)

func TestSubjects(t *testing.T) {
	var zero Subjects
	assert.Equal(t, "seamguard.events.s1", zero.Events("s1"))
	assert.Equal(t, "seamguard.events.*", zero.EventsWildcard())
	assert.Equal(t, "seamguard.verdicts.s1.refused", zero.Verdict("s1", KindRefused))
	assert.Equal(t, "seamguard.verdicts._invalid.rejected", zero.Verdict("", KindRejected))
	assert.Equal(t, "seamguard.verdicts._invalid.rejected", zero.Verdict("a.b", KindRejected))
	assert.Equal(t, "seamguard.verdicts.*.refused", zero.VerdictsWildcard(KindRefused))
	assert.Equal(t, "seamguard.verdicts.>", zero.VerdictsWildcard(""))
	require.NoError(t, zero.Validate())

	acme := Subjects{Prefix: "acme.sg"}
	assert.Equal(t, "acme.sg.events.x-1", acme.Events("x-1"))
	assert.Equal(t, "acme.sg.events.*", acme.EventsWildcard())
	assert.Equal(t, "acme.sg.verdicts.x-1.allowed", acme.Verdict("x-1", KindAllowed))
	require.NoError(t, acme.Validate())

	err := Subjects{Prefix: "a..b*"}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "empty")
	assert.Contains(t, err.Error(), "wildcard")
}

func TestSessionOf(t *testing.T) {
	s, err := Subjects{}.SessionOf("seamguard.events.Ab_9-z")
	require.NoError(t, err)
	assert.Equal(t, "Ab_9-z", s)

	for _, subj := range []string{
		"seamguard.events.",
		"seamguard.events",
		"seamguard.events.a.b",
		"seamguard.events.a b",
		"seamguard.events.*",
		"seamguard.events.>",
		"seamguard.events." + strings.Repeat("x", 129),
		"seamguard.verdicts.a",
		"other.events.a",
		"",
	} {
		_, err := Subjects{}.SessionOf(subj)
		requireCode(t, err, CodeBadSessionID, "subject")
	}
	_, err = Subjects{}.SessionOf("seamguard.events.a.b")
	assert.Contains(t, err.Error(), "more than one token")
	_, err = Subjects{Prefix: "p"}.SessionOf("seamguard.events.a")
	requireCode(t, err, CodeBadSessionID, "subject")
}

func TestValidSessionID(t *testing.T) {
	for _, ok := range []string{"a", "A", "0", "_", "-", "_invalid", strings.Repeat("z", 128), "Az09_-"} {
		assert.True(t, ValidSessionID(ok), ok)
	}
	for _, bad := range []string{"", strings.Repeat("z", 129), "a.b", "a b", "a*", ">", "é", "a\x00", "a/b", "a%41"} {
		assert.False(t, ValidSessionID(bad), bad)
	}
}

// TestPartitionMatchesServerTransform holds Subjects to the subject
// transform of a real nats-server, in both layouts: the subject the stream
// stores a session's event under is Stored(session), its control input
// StoredControl(session), SessionOf reads the session back from either,
// IsControl tells them apart, and SessionFilters and PartitionFilters match
// exactly what they should.
func TestPartitionMatchesServerTransform(t *testing.T) {
	srv := embedded.StartTest(t)
	for _, apart := range []bool{false, true} {
		t.Run(fmt.Sprintf("ControlApart=%v", apart), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			subj := Subjects{Partitions: 7, ControlApart: apart}
			name := fmt.Sprintf("P%v", apart)
			s, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{
				Name: name, Subjects: subj.StreamSubjects(),
				SubjectTransform: &jetstream.SubjectTransformConfig{Source: subj.TransformSource(), Destination: subj.TransformDestination()},
			})
			require.NoError(t, err)
			defer srv.JS.DeleteStream(context.WithoutCancel(ctx), name)
			sessions := []string{"a", "b", "ops-agent-42", "sess-etc-constraint", "Z_9", "events", "control", strings.Repeat("x", 128)}
			for i := range 40 {
				sessions = append(sessions, fmt.Sprintf("s%03d", i))
			}
			seen := map[int]bool{}
			seq := uint64(0)
			for _, sess := range sessions {
				for _, ctl := range []bool{false, true} {
					pub, want := subj.Events(sess), subj.Stored(sess)
					if ctl {
						pub, want = subj.Control(sess), subj.StoredControl(sess)
					}
					_, err := srv.JS.Publish(ctx, pub, []byte("{}"))
					require.NoError(t, err)
					seq++
					m, err := s.GetMsg(ctx, seq)
					require.NoError(t, err)
					require.Equal(t, want, m.Subject, "session %q", sess)
					require.Equal(t, pub, subj.Published(m.Subject))
					require.Equal(t, ctl, subj.IsControl(m.Subject))
					require.True(t, subj.HoldsInput(sess, m.Subject))
					require.False(t, subj.HoldsInput(sess+"x", m.Subject))
					require.Equal(t, subj.Stored(sess), subj.Route(m.Subject))
					got, err := subj.SessionOf(m.Subject)
					require.NoError(t, err)
					require.Equal(t, sess, got)
				}
				seen[subj.Partition(sess)] = true
			}
			require.Len(t, seen, 7, "the sessions spread over every partition")
			// What names no session is stored as published.
			for _, odd := range []string{"seamguard.events.a.b", "seamguard.control.a.b"} {
				_, err = srv.JS.Publish(ctx, odd, []byte("{}"))
				require.NoError(t, err)
				m, err := s.GetLastMsgForSubject(ctx, odd)
				require.NoError(t, err)
				_, err = subj.SessionOf(m.Subject)
				require.Error(t, err)
			}
			// Each session's filters find its two inputs, each partition's
			// its sessions' inputs, and the p < 0 filters the two odd ones:
			// together every message once.
			total := 0
			for p := -1; p < 7; p++ {
				info, err := s.Info(ctx, jetstream.WithSubjectFilter(subj.Prefix+"seamguard.>"))
				require.NoError(t, err)
				n := 0
				for sub, c := range info.State.Subjects {
					for _, f := range subj.PartitionFilters(p) {
						if subjectMatches(f, sub) {
							got := -1
							if sess, err := subj.SessionOf(sub); err == nil {
								got = subj.Partition(sess)
								if apart && subj.IsControl(sub) && p >= 0 {
									got = p // every partition reads control apart
								}
							}
							require.Equal(t, p, got, "%s under %v", sub, subj.PartitionFilters(p))
							n += int(c)
						}
					}
				}
				total += n
			}
			if !apart {
				require.Equal(t, 2*len(sessions)+2, total)
			}
			for _, sess := range sessions {
				n := 0
				for _, f := range subj.SessionFilters(sess) {
					info, err := s.Info(ctx, jetstream.WithSubjectFilter(f))
					require.NoError(t, err)
					for sub, c := range info.State.Subjects {
						require.True(t, subj.HoldsInput(sess, sub), sub)
						n += int(c)
					}
				}
				require.Equal(t, 2, n, "session %q", sess)
			}
			for _, bad := range []string{"seamguard.partitioned.x.s1", "seamguard.partitioned..s1", "seamguard.partitioned.3.a.b", "seamguard.partitioned.3", "seamguard.partitioned.3.events.a.b", "seamguard.partitioned.3.a.events"} {
				_, err := subj.SessionOf(bad)
				require.Error(t, err, bad)
			}
		})
	}
}

// subjectMatches reports whether the NATS filter matches subject.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func TestPublished(t *testing.T) {
	s := Subjects{Prefix: "sg", Partitions: 4}
	for stored, want := range map[string]string{
		s.Stored("abc"):                "sg.events.abc",
		"sg.events.abc":                "sg.events.abc",
		"sg.events.a.b":                "sg.events.a.b",
		"sg.partitioned.x.abc":         "sg.partitioned.x.abc",
		"sg.partitioned.1.a.b":         "sg.partitioned.1.a.b",
		"other.partitioned.1.abc":      "other.partitioned.1.abc",
		"sg.partitioned.12.bad$name":   "sg.events.bad$name",
		"sg.partitioned.1.control.abc": "sg.control.abc",
		"sg.partitioned.1.events.abc":  "sg.events.abc",
		"sg.partitioned.1.other.abc":   "sg.partitioned.1.other.abc",
		"sg.partitioned.1.events.a.b":  "sg.partitioned.1.events.a.b",
		s.StoredControl("abc"):         "sg.control.abc",
	} {
		if got := s.Published(stored); got != want {
			t.Errorf("Published(%q) = %q, want %q", stored, got, want)
		}
	}
	o := Output{Type: TypeEventRejected, Data: &EventRejected{Input: Meta{Subject: s.Stored("abc"), Seq: 7}}}
	got := s.PublishedRejection(o)
	if d := got.Data.(*EventRejected); d.Input.Subject != "sg.events.abc" || d.Input.Seq != 7 {
		t.Errorf("PublishedRejection: input %+v", d.Input)
	}
	if o.Data.(*EventRejected).Input.Subject != s.Stored("abc") {
		t.Error("PublishedRejection changed its argument")
	}
}
