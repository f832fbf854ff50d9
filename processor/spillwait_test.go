package processor

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/spill"
)

// TestSpillWaitsForJetStream: a spill that fails because a JetStream
// cluster cannot serve for a moment (its events stream's leader stopped:
// "temporarily unavailable", wrapped as the spill wraps it) waits with the
// batch's retries instead of halting the session; a transcript no longer
// whole, or a refusal, does not wait.
func TestSpillWaitsForJetStream(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("spill: write s/1.jsonl to bucket b: gave up after 3 attempts: %w",
			fmt.Errorf("spill: read stream SEAMGUARD_EVENTS at sequence 20: %w", err))
	}
	for _, c := range []struct {
		name      string
		err       error
		connected bool
		want      bool
	}{
		{"leader election", wrap(&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true, true},
		{"not the leader", wrap(&jetstream.APIError{Code: 500, ErrorCode: 10009}), true, true},
		{"stream offline", wrap(&jetstream.APIError{Code: 500, ErrorCode: 10118}), true, true},
		{"no answer", wrap(nats.ErrTimeout), true, true},
		{"disconnected", wrap(fmt.Errorf("boom")), false, true},
		{"unavailable transcript", wrap(spill.ErrUnavailable), true, true},
		{"incomplete transcript", wrap(spill.ErrIncomplete), true, false},
		{"incomplete while disconnected", wrap(spill.ErrIncomplete), false, false},
		{"a digest mismatch", wrap(spill.ErrDigestMismatch), true, false},
		{"bad request", wrap(&jetstream.APIError{Code: 400, ErrorCode: 10003}), true, false},
	} {
		require.Equal(t, c.want, spillWaits(c.err, c.connected), c.name)
	}
}
