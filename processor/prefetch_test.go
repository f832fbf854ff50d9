package processor

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestPrefetchLookup: an answer read ahead answers the lookups it settles
// and no other: a message found from a sequence answers every lookup from
// there up to it, nothing found answers every lookup from there on, and
// another filter or an earlier sequence goes to the server.
func TestPrefetchLookup(t *testing.T) {
	var none *prefetch
	_, _, ok := none.lookup(lookupKey{filter: "a", seq: 1})
	require.False(t, ok, "no prefetch answers nothing")

	m := &jetstream.RawStreamMsg{Sequence: 40}
	pf := &prefetch{lookups: map[string][]span{
		"events":  {{from: 10, msg: m}, {from: 41}},
		"control": {{from: 10}},
	}}
	for _, c := range []struct {
		filter string
		seq    uint64
		want   *jetstream.RawStreamMsg
		ok     bool
	}{
		{"events", 9, nil, false},  // before what was read
		{"events", 10, m, true},    // the lookup itself
		{"events", 25, m, true},    // nothing between 10 and 40
		{"events", 40, m, true},    // the message itself
		{"events", 41, nil, true},  // nothing from 41 on
		{"events", 900, nil, true}, // nor further
		{"control", 9, nil, false},
		{"control", 10, nil, true},
		{"control", 55, nil, true},
		{"other", 10, nil, false},
	} {
		got, position, ok := pf.lookup(lookupKey{filter: c.filter, seq: c.seq})
		require.False(t, position)
		require.Equal(t, c.ok, ok, "%s from %d", c.filter, c.seq)
		require.Same(t, c.want, got, "%s from %d", c.filter, c.seq)
	}

	pf.states = map[string]prefetched{"s": {}}
	_, ok = pf.state("s")
	require.True(t, ok)
	_, ok = pf.state("s")
	require.False(t, ok, "a prefetched state is taken once")
	pf.clear()
	_, _, ok = pf.lookup(lookupKey{filter: "events", seq: 10})
	require.False(t, ok, "cleared with the batch")
}

// TestControlKnownUpTo: which sessions have messages on their control
// subject is asked once and shared by the shards for every catch-up up to
// the stream's last sequence when asked; a catch-up past it looks at the
// control subject, and a batch that needs more asks again.
func TestControlKnownUpTo(t *testing.T) {
	e, p, ctx := testProcessor(t, "ck")
	pub := func(subject string) uint64 {
		t.Helper()
		ack, err := e.JS.Publish(ctx, subject, []byte("{}"))
		require.NoError(t, err)
		return ack.Sequence
	}
	pub(p.subj.Events("a"))
	last := pub(p.subj.Control("b"))

	s1, s2 := &shard{p: p}, &shard{p: p}
	s1.readControlled(ctx, last)
	require.NotNil(t, s1.pre.control)
	require.Equal(t, last, s1.pre.control.upTo)
	require.True(t, s1.pre.noControl("a", last))
	require.False(t, s1.pre.noControl("b", last), "b has a resume")
	require.False(t, s1.pre.noControl("a", last+1), "past what was asked: not known")

	resume := pub(p.subj.Control("a"))
	s2.readControlled(ctx, last)
	require.Same(t, s1.pre.control, s2.pre.control, "covered: the shards share one answer")
	require.False(t, s2.pre.noControl("a", resume), "a's resume is past what the answer covers")

	s2.pre.clear()
	s2.readControlled(ctx, resume)
	require.Equal(t, resume, s2.pre.control.upTo, "asked again for more")
	require.False(t, s2.pre.noControl("a", resume))
	require.True(t, s2.pre.noControl("c", resume))
}
