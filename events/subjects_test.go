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

// TestPartitionMatchesServerTransform holds Subjects.Partition to the
// {{partition(n,1)}} subject transform of a real nats-server: the subject the
// stream stores a session's event under is Stored(session), and SessionOf
// reads the session back from it.
func TestPartitionMatchesServerTransform(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := Subjects{Partitions: 7}
	s, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "P", Subjects: []string{"seamguard.events.>"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: subj.EventsWildcard(), Destination: subj.TransformDestination()},
	})
	require.NoError(t, err)
	sessions := []string{"a", "b", "ops-agent-42", "sess-etc-constraint", "Z_9", strings.Repeat("x", 128)}
	for i := range 40 {
		sessions = append(sessions, fmt.Sprintf("s%03d", i))
	}
	seen := map[int]bool{}
	for i, sess := range sessions {
		_, err := srv.JS.Publish(ctx, subj.Events(sess), []byte("{}"))
		require.NoError(t, err)
		m, err := s.GetMsg(ctx, uint64(i+1))
		require.NoError(t, err)
		require.Equal(t, subj.Stored(sess), m.Subject, "session %q", sess)
		got, err := subj.SessionOf(m.Subject)
		require.NoError(t, err)
		require.Equal(t, sess, got)
		seen[subj.Partition(sess)] = true
	}
	require.Len(t, seen, 7, "the sessions spread over every partition")
	// A multi-token subject is stored as published, and is no session.
	_, err = srv.JS.Publish(ctx, "seamguard.events.a.b", []byte("{}"))
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(ctx, "seamguard.events.a.b")
	require.NoError(t, err)
	_, err = subj.SessionOf(m.Subject)
	require.Error(t, err)
	for _, bad := range []string{"seamguard.partitioned.x.s1", "seamguard.partitioned..s1", "seamguard.partitioned.3.a.b", "seamguard.partitioned.3"} {
		_, err := subj.SessionOf(bad)
		require.Error(t, err, bad)
	}
}

func TestPublished(t *testing.T) {
	s := Subjects{Prefix: "sg", Partitions: 4}
	for stored, want := range map[string]string{
		s.Stored("abc"):              "sg.events.abc",
		"sg.events.abc":              "sg.events.abc",
		"sg.events.a.b":              "sg.events.a.b",
		"sg.partitioned.x.abc":       "sg.partitioned.x.abc",
		"sg.partitioned.1.a.b":       "sg.partitioned.1.a.b",
		"other.partitioned.1.abc":    "other.partitioned.1.abc",
		"sg.partitioned.12.bad$name": "sg.events.bad$name",
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
