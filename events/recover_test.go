package events

import "testing"

func TestRecoverSubjects(t *testing.T) {
	for _, c := range []struct {
		prefix, session, subject string
	}{
		{"", "s1", "seamguard.recover.s1"},
		{"acme.guard", "ops-agent_42", "acme.guard.recover.ops-agent_42"},
	} {
		s := Subjects{Prefix: c.prefix}
		if got := s.Recover(c.session); got != c.subject {
			t.Errorf("Recover(%q) with prefix %q = %q, want %q", c.session, c.prefix, got, c.subject)
		}
		if got, ok := s.RecoverSession(c.subject); !ok || got != c.session {
			t.Errorf("RecoverSession(%q) = %q, %v; want %q", c.subject, got, ok, c.session)
		}
	}
	if got := (Subjects{}).RecoverWildcard(); got != "seamguard.recover.*" {
		t.Errorf("RecoverWildcard = %q", got)
	}
	for _, bad := range []string{
		"seamguard.recover.", "seamguard.recover.a.b", "seamguard.recover.bad!", "seamguard.events.s1",
		"other.recover.s1", "seamguard.recover." + string(make([]byte, MaxSessionIDLen+1)),
	} {
		if got, ok := (Subjects{}).RecoverSession(bad); ok {
			t.Errorf("RecoverSession(%q) = %q, true; want false", bad, got)
		}
	}
}
