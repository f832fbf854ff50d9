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
	_, ok := none.lookup(lookupKey{filter: "a", seq: 1})
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
		got, ok := pf.lookup(lookupKey{filter: c.filter, seq: c.seq})
		require.Equal(t, c.ok, ok, "%s from %d", c.filter, c.seq)
		require.Same(t, c.want, got, "%s from %d", c.filter, c.seq)
	}

	pf.states = map[string]prefetched{"s": {}}
	_, ok = pf.state("s")
	require.True(t, ok)
	_, ok = pf.state("s")
	require.False(t, ok, "a prefetched state is taken once")
	pf.clear()
	_, ok = pf.lookup(lookupKey{filter: "events", seq: 10})
	require.False(t, ok, "cleared with the batch")
}
