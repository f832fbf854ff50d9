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
	turns := make([][]*nats.Msg, 2)
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

	for k, c := range []struct {
		syncAlways bool
		reads      int // per session
		why        string
	}{
		// A state, and the lookups of its events and control subjects
		// past its stored sequence: without SyncAlways a state read may
		// be one the bucket lost after acknowledging a later one, and the
		// stream repairs it.
		{false, 3, "the state and two catch-up lookups"},
		// With SyncAlways and a single-copy bucket the state read is the
		// latest, and with nothing pending past it there is nothing to
		// catch up.
		{true, 1, "the state only"},
	} {
		// A fresh instance: no session in memory.
		e.publishAll(t, turns[k])
		cfg.SyncAlways = c.syncAlways
		r = e.start(t, cfg)
		e.waitIdle(t, cfg, time.Minute)
		st := r.p.Stats()
		require.NoError(t, r.stop(t))
		t.Logf("SyncAlways %v: %d inputs, %d reads ahead, %d in the batch", c.syncAlways, st.Handled, st.ReadAhead, st.ReadInBatch)
		require.Equal(t, uint64(sessions), st.Handled)
		require.Zero(t, st.ReadInBatch, "every read of the batch was made ahead")
		require.Equal(t, uint64(c.reads*sessions), st.ReadAhead, c.why)
		require.Zero(t, st.CaughtUp)
	}
	for _, v := range e.verdicts(t, cfg) {
		t.Errorf("no verdict expected (every turn is accepted): %s", describe(v.v))
	}
}
