package processor_test

import (
	"encoding/json"
	"testing"
	"time"

	nats_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
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
	var golden []*events.Verdict
	for _, l := range readLines(t, pinnedGolden) {
		v, err := events.DecodeVerdict(l)
		require.NoError(t, err)
		golden = append(golden, v)
	}
	require.Len(t, golden, 6)

	for _, mode := range []string{"binary", "structured-sdk"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			cfg := baseConfig()
			cfg.Source = events.DefaultSource
			r := e.start(t, cfg)
			subj := cfg.Subjects()
			switch mode {
			case "binary":
				msgs := make([]*nats.Msg, len(lines))
				for i, l := range lines {
					msgs[i] = binaryMsg(t, subj, l)
				}
				e.publishAll(t, msgs)
			case "structured-sdk":
				sender, err := nats_jetstream.NewSenderFromConn(e.NC, cfg.Names().Events, subj.Events("sess-pinned"), nil)
				require.NoError(t, err)
				for _, l := range lines {
					var ev event.Event
					require.NoError(t, json.Unmarshal(l, &ev))
					require.NoError(t, sender.Send(binding.WithForceStructured(e.ctx), binding.ToMessage(&ev)))
				}
			}
			e.waitIdle(t, cfg, 30*time.Second)
			require.NoError(t, r.stop(t))

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
