package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the subject prefix used when Subjects.Prefix is empty.
const DefaultPrefix = "seamguard"

// InvalidSession is the session token of the verdict subject of a rejection
// whose input has no usable session id (see doc.go).
const InvalidSession = "_invalid"

// MaxSessionIDLen is the longest session id the contract allows.
const MaxSessionIDLen = 128

// Subjects names the NATS subjects of one seamguard deployment. The zero value
// uses the prefix "seamguard". A Subjects is a plain value: any goroutine may
// use it at any time.
type Subjects struct {
	// Prefix is one or more dot-separated tokens; empty means DefaultPrefix.
	Prefix string
	// Partitions is the number of partitions the events stream stores
	// sessions in: agents publish on Events(session) and operators on
	// Control(session), and the stream's subject transform stores the
	// message as Stored(session) or StoredControl(session), both in the
	// session's partition. Zero means the stream stores inputs as
	// published.
	Partitions int
	// ControlApart describes an events stream whose transform maps only
	// the events subjects, storing an event as
	// "<prefix>.partitioned.<p>.<session>" and control subjects as
	// published; a partition then also reads every control subject. The
	// zero value is the layout seamguard creates, where both kinds are
	// stored in the partition as "<prefix>.partitioned.<p>.<kind>.<session>".
	ControlApart bool
}

// The kinds of input subject: the token after the partition of a stored
// subject in the partitioned layout.
const (
	kindEvents  = "events"
	kindControl = "control"
)

func (s Subjects) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// Validate reports every problem with s at once.
func (s Subjects) Validate() error {
	var errs []error
	for i, tok := range strings.Split(s.prefix(), ".") {
		switch {
		case tok == "":
			errs = append(errs, fmt.Errorf("events: subject prefix %q: token %d is empty", s.Prefix, i+1))
		case strings.ContainsAny(tok, "*> \t\r\n"):
			errs = append(errs, fmt.Errorf("events: subject prefix %q: token %q holds a wildcard or white space", s.Prefix, tok))
		}
	}
	return errors.Join(errs...)
}

// Events is the input subject of session: "<prefix>.events.<session>".
// session should be a valid session id (see ValidSessionID).
func (s Subjects) Events(session string) string {
	return s.prefix() + ".events." + session
}

// EventsWildcard matches the input subjects of every session.
func (s Subjects) EventsWildcard() string {
	return s.prefix() + ".events.*"
}

// Control is the control subject of session: "<prefix>.control.<session>".
// A session.resumed counts only when it arrives there (docs/contract.md,
// Inputs); deployments grant it to operators alone. The events stream
// stores control subjects as they are published, beside the session's
// events, so the processor reads both in stream order.
func (s Subjects) Control(session string) string {
	return s.prefix() + ".control." + session
}

// ControlWildcard matches the control subjects of every session.
func (s Subjects) ControlWildcard() string {
	return s.prefix() + ".control.*"
}

// IsControl reports whether natsSubject is a control subject: one that
// starts "<prefix>.control.", or the subject the events stream stores such
// a subject under.
func (s Subjects) IsControl(natsSubject string) bool {
	if _, kind, ok := s.storedParts(natsSubject); ok {
		return kind == kindControl
	}
	return strings.HasPrefix(natsSubject, s.prefix()+".control.")
}

// ControlToken returns what follows "<prefix>.control." in natsSubject, and
// whether natsSubject is a control subject as published.
func (s Subjects) ControlToken(natsSubject string) (string, bool) {
	return strings.CutPrefix(natsSubject, s.prefix()+".control.")
}

// SessionFilters are the subjects the events stream stores session's
// inputs under: Stored(session) and StoredControl(session). Both are
// literal: the stream finds a literal subject's messages through its
// subject index, where a wildcard may make it scan its blocks.
func (s Subjects) SessionFilters(session string) []string {
	return []string{s.Stored(session), s.StoredControl(session)}
}

// HoldsInput reports whether stored is a subject the events stream stores
// session's inputs under.
func (s Subjects) HoldsInput(session, stored string) bool {
	return stored == s.Stored(session) || stored == s.StoredControl(session)
}

// StreamSubjects are the subjects of the events stream: every events and
// every control subject.
func (s Subjects) StreamSubjects() []string {
	return []string{s.prefix() + ".events.>", s.prefix() + ".control.>"}
}

// Verdict is the subject of an output of the given kind about session:
// "<prefix>.verdicts.<session>.<kind>". An empty or invalid session is
// replaced by InvalidSession, so the result is always a well-formed subject.
func (s Subjects) Verdict(session, kind string) string {
	if !ValidSessionID(session) {
		session = InvalidSession
	}
	return s.prefix() + ".verdicts." + session + "." + kind
}

// VerdictsWildcard matches every verdict subject of the given kind; an empty
// kind matches every kind.
func (s Subjects) VerdictsWildcard(kind string) string {
	if kind == "" {
		return s.prefix() + ".verdicts.>"
	}
	return s.prefix() + ".verdicts.*." + kind
}

// Partition returns the partition of session: FNV-32a of the session id
// modulo Partitions, the same function as the partition subject transform
// of nats-server over the session token alone. It is 0 when Partitions is 0.
func (s Subjects) Partition(session string) int {
	if s.Partitions <= 0 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(session); i++ {
		h ^= uint32(session[i])
		h *= 16777619
	}
	return int(h % uint32(s.Partitions))
}

// partitioned is the token after the prefix of stored, partitioned subjects.
const partitioned = ".partitioned."

// Stored is the subject the events stream stores the session's events
// under: "<prefix>.partitioned.<p>.events.<session>" ("…<p>.<session>" with
// ControlApart), or Events(session) when Partitions is 0.
func (s Subjects) Stored(session string) string {
	if s.Partitions <= 0 {
		return s.Events(session)
	}
	if s.ControlApart {
		return s.inPartition(session, "")
	}
	return s.inPartition(session, kindEvents)
}

// StoredControl is the subject the events stream stores the session's
// control inputs under: "<prefix>.partitioned.<p>.control.<session>", or
// Control(session) with ControlApart or when Partitions is 0.
func (s Subjects) StoredControl(session string) string {
	if s.Partitions <= 0 || s.ControlApart {
		return s.Control(session)
	}
	return s.inPartition(session, kindControl)
}

// inPartition is "<prefix>.partitioned.<p>.<kind>.<session>", or
// "<prefix>.partitioned.<p>.<session>" for no kind.
func (s Subjects) inPartition(session, kind string) string {
	p := s.prefix() + partitioned + strconv.Itoa(s.Partition(session)) + "."
	if kind == "" {
		return p + session
	}
	return p + kind + "." + session
}

// StoredControlFilter matches the subjects the events stream stores every
// session's control inputs under: "<prefix>.partitioned.*.control.*", or
// ControlWildcard with ControlApart or when Partitions is 0.
func (s Subjects) StoredControlFilter() string {
	if s.Partitions <= 0 || s.ControlApart {
		return s.ControlWildcard()
	}
	return s.prefix() + partitioned + "*." + kindControl + ".*"
}

// ControlSession returns the session of a control input stored under
// stored, in either layout, and whether stored is one.
func (s Subjects) ControlSession(stored string) (string, bool) {
	if tok, kind, ok := s.storedParts(stored); ok {
		return tok, kind == kindControl
	}
	tok, ok := s.ControlToken(stored)
	return tok, ok && !strings.Contains(tok, ".")
}

// storedParts splits a subject of either partitioned layout: the kind and
// session token of "<prefix>.partitioned.<p>.<kind>.<token>", or of
// "<prefix>.partitioned.<p>.<token>" (ControlApart: kind events). ok is
// false for any other subject.
func (s Subjects) storedParts(stored string) (tok, kind string, ok bool) {
	rest, ok := strings.CutPrefix(stored, s.prefix())
	if !ok {
		return "", "", false
	}
	rest, ok = strings.CutPrefix(rest, partitioned)
	if !ok {
		return "", "", false
	}
	part, rest, ok := strings.Cut(rest, ".")
	if !ok || part == "" || strings.Trim(part, "0123456789") != "" {
		return "", "", false
	}
	kind, tok, two := strings.Cut(rest, ".")
	if !two {
		return kind, kindEvents, true // "<p>.<token>"
	}
	if kind != kindEvents && kind != kindControl || strings.Contains(tok, ".") {
		return "", "", false
	}
	return tok, kind, true
}

// Published returns the subject an input was published on, given the
// subject the events stream stores it under: Events(session) or
// Control(session) for a stored partitioned subject of either layout, any
// other subject as it is (the stream's transform leaves those alone).
func (s Subjects) Published(stored string) string {
	tok, kind, ok := s.storedParts(stored)
	if !ok {
		return stored
	}
	return s.prefix() + "." + kind + "." + tok
}

// Route returns the key that brings one session's inputs together, given
// the subject one is stored under: the session's Stored subject for any
// input of a session, of either kind, and any other subject as it is.
func (s Subjects) Route(stored string) string {
	if tok, ok := s.ControlSession(stored); ok {
		return s.Stored(tok)
	}
	return stored
}

// PublishedRejection returns o with its rejection's input subject (an
// event.rejected's input.subject) as the input was published, not as the
// stream stores it; every other output as it is.
func (s Subjects) PublishedRejection(o Output) Output {
	d, ok := o.Data.(*EventRejected)
	if !ok || d == nil {
		return o
	}
	if pub := s.Published(d.Input.Subject); pub != d.Input.Subject {
		c := *d
		c.Input.Subject = pub
		o.Data = &c
	}
	return o
}

// PartitionFilters are the filters of partition p's consumer: the stored
// subjects of its sessions' inputs, of both kinds; with ControlApart, its
// events and every control subject of one token (a partition then leaves
// those of other partitions' sessions alone). For p < 0 they match what
// names no session: the subjects the transform leaves as published.
func (s Subjects) PartitionFilters(p int) []string {
	switch {
	case p < 0 && s.ControlApart:
		return []string{s.prefix() + ".events.>", s.prefix() + ".control.*.>"}
	case p < 0:
		return []string{s.prefix() + ".events.*.>", s.prefix() + ".control.*.>"}
	case s.ControlApart:
		return []string{s.prefix() + partitioned + strconv.Itoa(p) + ".*", s.ControlWildcard()}
	}
	return []string{s.prefix() + partitioned + strconv.Itoa(p) + ".*.*"}
}

// TransformSource is the source of the events stream's subject transform:
// every input subject of one token after the prefix, events and control
// ("<prefix>.*.*"; EventsWildcard with ControlApart).
func (s Subjects) TransformSource() string {
	if s.ControlApart {
		return s.EventsWildcard()
	}
	return s.prefix() + ".*.*"
}

// TransformDestination is the destination of the events stream's subject
// transform, whose source is TransformSource: the partition of the session
// token, the kind, then the session token.
func (s Subjects) TransformDestination() string {
	if s.ControlApart {
		return s.prefix() + partitioned + "{{partition(" + strconv.Itoa(s.Partitions) + ",1)}}.{{wildcard(1)}}"
	}
	return s.prefix() + partitioned + "{{partition(" + strconv.Itoa(s.Partitions) + ",2)}}.{{wildcard(1)}}.{{wildcard(2)}}"
}

// SessionOf returns the session token of an input subject:
// "<prefix>.events.<session>", the stored "<prefix>.partitioned.<p>.<session>",
// or the control subject "<prefix>.control.<session>".
// Any other subject, one with more tokens, or a token that is not a valid
// session id, yields an *Error with code bad_session_id and field "subject".
func (s Subjects) SessionOf(natsSubject string) (string, error) {
	tok, err := s.sessionOf(natsSubject)
	if err != nil {
		return "", err
	}
	return tok, nil
}

// sessionOf is SessionOf with its *Error. It does not allocate unless it
// fails.
func (s Subjects) sessionOf(natsSubject string) (string, *Error) {
	rest, ok := strings.CutPrefix(natsSubject, s.prefix())
	if tok, events := strings.CutPrefix(rest, ".events."); ok && events && ValidSessionID(tok) {
		return tok, nil // "<prefix>.events.<session>", as agents publish
	}
	if ok && strings.HasPrefix(rest, partitioned) {
		if tok, _, stored := s.storedParts(natsSubject); stored {
			// Published(natsSubject) is "<prefix>.<kind>.<tok>", and tok
			// holds no dot: only the token's validity is left to check. It
			// is read in place, not from the subject Published builds.
			if ValidSessionID(tok) {
				return tok, nil
			}
			return "", errSessionToken(tok)
		}
	}
	kind := ".events."
	tok, isKind := strings.CutPrefix(rest, kind)
	if !isKind {
		if tok, isKind = strings.CutPrefix(rest, ".control."); isKind {
			kind = ".control."
		}
	}
	switch {
	case !ok || !isKind:
		return "", s.errNotEventsSubject(natsSubject)
	case ValidSessionID(tok): // one token: a session id holds no dot
		return tok, nil
	case strings.Contains(tok, "."):
		return "", errSubjectTokens(natsSubject, s.prefix()+kind)
	}
	return "", errSessionToken(tok)
}

// ValidSessionID reports whether id matches [A-Za-z0-9_-]{1,128}.
func ValidSessionID(id string) bool {
	if len(id) == 0 || len(id) > MaxSessionIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
