package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestFleetBatchReadsAhead: inputs of sessions the processor does not hold
// (a fleet's case: a fresh instance, each input a session of its own) are
// decided with their states read ahead, concurrently; the batch itself
// reads nothing one at a time, and decides as before.
func TestFleetBatchReadsAhead(t *testing.T) {
	const sessions = 300
	e := newEnv(t)
	cfg := baseConfig()
	cfg.Partitions = 2
	subj := cfg.Subjects()
	line := func(id, session, typ, data string) []byte {
		return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":%q,"data":%s}`, id, typ, session, data)
	}
	var opens []*nats.Msg
	turns := make([][]*nats.Msg, 1)
	for i := range sessions {
		s := fmt.Sprintf("fleet-%03d", i)
		opens = append(opens, binaryMsg(t, subj, line(s+"-o", s, "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`)))
		for k := range turns {
			turns[k] = append(turns[k], binaryMsg(t, subj, line(fmt.Sprintf("%s-t%d", s, k), s, "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"role":"user","content":"hello"}`, k))))
		}
	}
	r := e.start(t, cfg)
	e.publishAll(t, opens)
	e.waitIdle(t, cfg, time.Minute)
	require.NoError(t, r.stop(t))

	// A fresh instance: no session in memory. Each session costs its state
	// and the lookups of its events and control subjects past its stored
	// sequence, the check that the state is not behind the stream, unless
	// its partition's floor shows the state caught up (then the state
	// alone: see processor/floor.go).
	e.publishAll(t, turns[0])
	r = e.start(t, cfg)
	e.waitIdle(t, cfg, time.Minute)
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d inputs, %d reads ahead, %d in the batch, %d shown caught up by a floor", st.Handled, st.ReadAhead, st.ReadInBatch, st.Floored)
	require.Equal(t, uint64(sessions), st.Handled)
	require.Zero(t, st.ReadInBatch, "every read of the batch was made ahead")
	require.Equal(t, uint64(2*sessions)-st.Floored, st.ReadAhead, "the state and the lookup of its events subject (none has a control message)")
	require.Zero(t, st.CaughtUp)
	for _, v := range e.verdicts(t, cfg) {
		t.Errorf("no verdict expected (every turn is accepted): %s", describe(v.v))
	}
}
