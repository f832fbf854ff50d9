package client_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
)

// TestPinsCarriedByCompact: a pinned turn evicted by budget enforcement is
// refused with next carry_pins even once the spill cures the hole; Compact
// carries it and is allowed. Pins made later are carried the same way,
// and unpinned turns no longer need to be.
func TestPinsCarriedByCompact(t *testing.T) {
	sg := newSeamguard(t, true)
	ctx := testContext(t)
	for _, structured := range []bool{false, true} {
		c, err := client.New(sg.nc, client.Config{Structured: structured})
		require.NoError(t, err)
		id := "pins-binary"
		if structured {
			id = "pins-structured"
		}
		s, err := c.Open(ctx, client.SessionConfig{ID: id, Span: 4})
		require.NoError(t, err)
		rule, err := s.Append(ctx, client.Turn{Role: "user", Content: "never modify files under /etc", Pinned: true})
		require.NoError(t, err)
		require.Equal(t, events.Range{Start: 0, End: 1}, rule)
		for range 11 {
			_, err := s.Append(ctx, client.Turn{Content: "x"})
			require.NoError(t, err)
		}
		require.NoError(t, s.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget"))
		req := events.CompactionRequested{
			SummarizerInput: events.Range{Start: 3, End: 12},
			SummaryRange:    events.Range{Start: 3, End: 8},
			TailStart:       8,
		}

		// The plain request: refused, spilled, next carry_pins.
		v, err := s.Compact(ctx, req)
		require.NoError(t, err)
		require.NotNil(t, v.Allowed(), "%s", v.Type)
		assert.Equal(t, []events.Range{rule}, v.Request.CarriedPins, "the allowed compaction carries the rule")
		assert.Equal(t, []events.ReasonCode{events.ReasonCoverageHole}, v.Allowed().Cured)
		require.NotNil(t, v.Previous)
		first := v.Previous
		require.True(t, first.MustCarryPins())
		assert.False(t, first.Retryable())
		require.NotNil(t, first.Refused().Spill, "the hole was spilled all the same")
		pins, complete := first.DroppedPins()
		assert.Equal(t, []events.Range{rule}, pins)
		assert.True(t, complete)
		assert.Nil(t, first.Previous)
		assert.Equal(t, v.Request.RequestID, first.Request.RequestID)
		require.NoError(t, s.Commit(ctx, v.Request.RequestID))

		// A pin made later: the next compaction drops it; carried, allowed.
		require.NoError(t, s.Pin(ctx, events.Range{Start: 4, End: 6}))
		req.CarriedPins = []events.Range{rule}
		direct, err := s.RequestCompaction(ctx, req)
		require.NoError(t, err)
		require.True(t, direct.MustCarryPins())
		assert.Nil(t, direct.Refused().Spill, "nothing left to spill: only the pins stand in the way")
		pins, _ = direct.DroppedPins()
		assert.Equal(t, []events.Range{{Start: 4, End: 6}}, pins)
		_, err = s.Retry(ctx, direct)
		assert.ErrorIs(t, err, client.ErrNotRetryable)
		again, err := s.CarryPins(ctx, direct)
		require.NoError(t, err)
		require.NotNil(t, again.Allowed())
		assert.Equal(t, []events.Range{rule, {Start: 4, End: 6}}, again.Request.CarriedPins)
		_, err = s.CarryPins(ctx, again)
		assert.ErrorIs(t, err, client.ErrNotRetryable)

		// Unpinned, the plain request is allowed.
		require.NoError(t, s.Unpin(ctx, events.Range{Start: 0, End: 12}))
		req.CarriedPins = nil
		plain, err := s.RequestCompaction(ctx, req)
		require.NoError(t, err)
		require.NotNil(t, plain.Allowed(), "%s", plain.Type)

		assert.ErrorIs(t, s.Pin(ctx, events.Range{Start: 10, End: 13}), client.ErrInvalid)
		assert.ErrorIs(t, s.Unpin(ctx, events.Range{Start: 3, End: 2}), client.ErrInvalid)
	}
}
