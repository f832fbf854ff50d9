package events

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
