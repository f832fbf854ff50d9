package ledger

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

// TestCoverageHoleAdvice: a coverage_hole's message names the cause of each
// part of the hole and the way out that works for it. Offsets truncated
// before any summary covered them cannot be summarized any more, so it
// names the truncation and the spill-and-retry (and a committed summary
// that covers them, when the request does not carry it), never "put them
// in the summarizer's input"; offsets that were only left out get that
// advice.
func TestCoverageHoleAdvice(t *testing.T) {
	hole := func(t *testing.T, s *session, req events.CompactionRequested) string {
		t.Helper()
		e := s.l.Evaluate(&req)
		for _, r := range e.Reasons {
			if r.Code == events.ReasonCoverageHole {
				return r.Message
			}
		}
		t.Fatalf("no coverage_hole in %+v", e.Reasons)
		return ""
	}
	setup := func(t *testing.T) *session {
		s := newSession(t)
		require.True(t, s.open(events.UnitTurns, events.UnitTurns, 4).Accepted)
		s.turns(40)
		return s
	}

	t.Run("truncated", func(t *testing.T) {
		s := setup(t)
		require.True(t, s.truncate(0, 8).Accepted)
		msg := hole(t, s, events.CompactionRequested{RequestID: "c1", SummarizerInput: Range{Start: 8, End: 40}, SummaryRange: Range{Start: 8, End: 36}, TailStart: 36})
		assert.Contains(t, msg, "[0, 8) were evicted by context.truncated (truncated [0, 8))")
		assert.Contains(t, msg, "no summary can cover them now")
		assert.Contains(t, msg, "next: retry")
		assert.Contains(t, msg, "send the same request again")
		assert.NotContains(t, msg, "put them in the summarizer's input", "advice that cannot help")
	})
	t.Run("left out", func(t *testing.T) {
		s := setup(t)
		msg := hole(t, s, events.CompactionRequested{RequestID: "c1", SummarizerInput: Range{Start: 8, End: 40}, SummaryRange: Range{Start: 8, End: 36}, TailStart: 36})
		assert.Contains(t, msg, "put them in the summarizer's input and the summary range")
		assert.NotContains(t, msg, "context.truncated")
	})
	t.Run("both", func(t *testing.T) {
		s := setup(t)
		require.True(t, s.truncate(0, 4).Accepted)
		msg := hole(t, s, events.CompactionRequested{RequestID: "c1", SummarizerInput: Range{Start: 8, End: 40}, SummaryRange: Range{Start: 8, End: 36}, TailStart: 36})
		assert.Contains(t, msg, "[0, 4) were evicted by context.truncated")
		assert.Contains(t, msg, "Offsets [4, 8) can still be summarized: put them in the summarizer's input")
	})
	t.Run("a committed summary covers them", func(t *testing.T) {
		s := setup(t)
		first := events.CompactionRequested{RequestID: "c0", SummarizerInput: Range{Start: 0, End: 40}, SummaryRange: Range{Start: 0, End: 16}, TailStart: 16}
		require.Equal(t, events.TypeCompactionAllowed, s.send(&first, events.TypeCompactionRequested).Outputs[0].Type)
		require.True(t, s.send(&events.CompactionCommitted{RequestID: "c0"}, events.TypeCompactionCommitted).Accepted)
		require.True(t, s.truncate(0, 8).Accepted)
		msg := hole(t, s, events.CompactionRequested{RequestID: "c1", SummarizerInput: Range{Start: 8, End: 40}, SummaryRange: Range{Start: 8, End: 36}, TailStart: 36})
		assert.Contains(t, msg, "The committed summary covers [0, 8): if the new summary carries it, set carries_prior_summary")
	})
}
