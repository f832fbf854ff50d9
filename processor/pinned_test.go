package processor_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

const (
	pinnedStory  = "testdata/stories/pinned-story.jsonl"
	pinnedGolden = "testdata/stories/golden/pinned-story.out.jsonl"
)

// TestPinnedStoryOverNATS plays the pinned story (CONTRACT.md section 8)
// into JetStream in binary mode and in structured mode through the
// CloudEvents SDK, and holds the verdicts to what the offline check
// decided: the pin events and fields pass the stream, the decoder and the
// ledger end to end.
func TestPinnedStoryOverNATS(t *testing.T) {
	lines := readLines(t, pinnedStory)
	golden := readGolden(t, pinnedGolden)
	require.Len(t, golden, 6)

	for _, mode := range []string{"binary", "structured-sdk"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := baseConfig()
			cfg.Source = events.DefaultSource
			subj := cfg.Subjects()
			e.playStory(t, cfg, mode, "sess-pinned", lines)

			got := e.verdicts(t, cfg)
			require.Len(t, got, len(golden), "verdicts: %v", got)
			for i, want := range golden {
				g := got[i].v
				require.Equal(t, want.ID, g.ID, "verdict %d: %s", i, describe(g))
				assert.Equal(t, want.Type, g.Type)
				assert.Equal(t, subj.Verdict(want.Session, want.Kind()), got[i].subject)
				assertSameDecision(t, want, g)
			}
			first := got[1].v.Data.(*events.CompactionRefused)
			assert.Equal(t, events.NextCarryPins, first.Next)
			assert.NotNil(t, first.Spill, "the hole still spills")
			retry := got[2].v.Data.(*events.CompactionRefused)
			assert.Equal(t, events.NextCarryPins, retry.Next)
			assert.Nil(t, retry.Spill)
			assert.Equal(t, events.TypeCompactionAllowed, got[3].v.Type, "carrying the pin is allowed")
		})
	}
}
