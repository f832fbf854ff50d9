package processor_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// TestRebuild rebuilds the session bucket from the events stream: after a
// clean run it finds nothing to change; it writes back deleted and corrupt
// states, and republishes verdicts deleted from the verdict stream, each
// exactly once and under its id: not while the stream's dedupe window
// remembers the id (it reports them withheld), and once it has passed.
func TestRebuild(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	w := genWorkload(10)
	r := e.start(t, cfg)
	e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
	e.waitIdle(t, cfg, 60*time.Second)
	require.NoError(t, r.stop(t))
	before := e.outcome(t, cfg)

	p, err := processor.New(e.ctx, e.JS, cfg, processor.WithClock(fixedNow))
	require.NoError(t, err)
	rep, err := p.Rebuild(e.ctx, false)
	require.NoError(t, err)
	assert.Equal(t, len(w.Items), rep.Events)
	assert.Equal(t, len(before.states), rep.Sessions)
	assert.Empty(t, rep.Differ)
	assert.Zero(t, rep.Written+rep.Republished+rep.Respilled, "%+v", rep)

	// Lose three states and corrupt a fourth.
	kv := p.Resources().Sessions
	lost := []string{"load-01", "load-02", "load-07"}
	for _, k := range lost {
		require.NoError(t, kv.Delete(e.ctx, k))
	}
	_, err = kv.Put(e.ctx, "load-04", []byte("\x01not a ledger"))
	require.NoError(t, err)

	rep, err = p.Rebuild(e.ctx, true)
	require.NoError(t, err)
	assert.Equal(t, []string{"load-01", "load-02", "load-04", "load-07"}, rep.Differ)
	assert.Equal(t, 4, rep.Written)
	assert.Zero(t, rep.Republished+rep.Respilled, "%+v", rep)
	rep, err = p.Rebuild(e.ctx, false)
	require.NoError(t, err)
	assert.Empty(t, rep.Differ, "a second rebuild finds nothing to change")
	requireSameStates(t, before.states, e.kvStates(t, cfg))

	// Delete an allowed verdict and a transcript.spilled from the verdict
	// stream: the rebuild publishes both again, and writes the spill again
	// because no verdict records how it went.
	vs := e.verdicts(t, cfg)
	var gone []verdictMsg
	for _, typ := range []string{events.TypeCompactionAllowed, events.TypeTranscriptSpilled} {
		for _, v := range vs {
			if v.v.Type == typ {
				gone = append(gone, v)
				break
			}
		}
	}
	require.Len(t, gone, 2)
	vstream, err := e.JS.Stream(e.ctx, cfg.Names().Verdicts)
	require.NoError(t, err)
	for _, v := range gone {
		require.NoError(t, vstream.DeleteMsg(e.ctx, v.seq))
	}
	require.Len(t, e.verdicts(t, cfg), len(vs)-2)

	// The stream's dedupe window still remembers their ids and drops a
	// copy: the rebuild publishes nothing without its id, and says which
	// it could not store.
	rep, err = p.Rebuild(e.ctx, true)
	require.NoError(t, err)
	assert.Zero(t, rep.Republished, "%+v", rep)
	assert.ElementsMatch(t, []string{gone[0].v.ID, gone[1].v.ID}, rep.Withheld, "%+v", rep)
	assert.Equal(t, 1, rep.Respilled, "%+v", rep)
	assert.Empty(t, rep.Differ)
	mid := e.outcome(t, cfg) // fails on an id in the stream twice
	assert.Zero(t, mid.noMsgID, "verdicts stored without Nats-Msg-Id")
	assert.Len(t, mid.verdicts, len(before.verdicts)-2)

	// Once the window has passed, a rebuild publishes both again, under
	// their ids. The window is shortened twice: a change of the window
	// has the server purge its remembered ids at once, with the window it
	// holds when the purge runs, which the update being applied may not
	// have set yet; the second change purges with a short window either
	// way.
	for _, window := range []time.Duration{time.Second, 1100 * time.Millisecond} {
		_, err = e.JS.UpdateStream(e.ctx, func() jetstream.StreamConfig {
			c := vstream.CachedInfo().Config
			c.Duplicates = window
			return c
		}())
		require.NoError(t, err)
	}
	time.Sleep(3 * time.Second)
	rep, err = p.Rebuild(e.ctx, true)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Republished, "%+v", rep)
	assert.Empty(t, rep.Withheld, "%+v", rep)
	assert.Empty(t, rep.Differ)
	after := e.outcome(t, cfg) // fails on an id in the stream twice
	require.Equal(t, before.verdicts, after.verdicts)
	assert.Zero(t, after.noMsgID, "verdicts stored without Nats-Msg-Id")
	requireSameStates(t, before.states, after.states)

	rep, err = p.Rebuild(e.ctx, true)
	require.NoError(t, err)
	assert.Zero(t, rep.Republished+rep.Respilled+rep.Written+len(rep.Withheld), "%+v", rep)
	require.Equal(t, before.verdicts, e.outcome(t, cfg).verdicts)
}
