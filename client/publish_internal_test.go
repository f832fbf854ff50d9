package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

func TestPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"":                        "",
		"urn:agent:demo/worker-1": "urn:agent:demo/worker-1",
		"a b":                     "a%20b",
		`"100%"`:                  "%22100%25%22",
		"ë":                       "%C3%AB",
		"tab\there\x7f":           "tab%09here%7F",
	} {
		assert.Equal(t, want, percentEncode(in), "%q", in)
	}
}

// TestPublishIsIdempotent publishes one built event twice, as a retry after
// a lost ack does: the stream stores it once and says the second is a
// duplicate.
func TestPublishIsIdempotent(t *testing.T) {
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := processor.Provision(ctx, srv.JS, processor.Config{Partitions: 1})
	require.NoError(t, err)
	c, err := New(srv.NC, Config{})
	require.NoError(t, err)
	ev, err := c.build("s1", events.TypeSessionOpened, newID(), &events.SessionOpened{
		Unit: events.UnitTurns, RecoveryFloor: events.Floor{Span: 1, Unit: events.UnitTurns},
	})
	require.NoError(t, err)
	first, err := c.publish(ctx, ev)
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	again, err := c.publish(ctx, ev)
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, first.Sequence, again.Sequence)
	assert.Equal(t, "SEAMGUARD_EVENTS", again.Stream)
}
