package processor_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// TestParkedSessionLetsOthersGo makes one session's state impossible to
// store (the bucket's value limit lowered under a running processor) on a
// single partition whose consumer may hold few inputs unacknowledged: stuck,
// that session would stop the whole partition once its unacknowledged
// inputs fill MaxAckPending. Past ParkAfter it is parked: its record is in
// the bucket with the cause, its inputs are acknowledged into it, and the
// 4,096+ inputs of the other sessions behind it are all decided. An
// operator's resume on its control subject then takes it out of the park,
// once the limit is lifted: every waiting input is applied, in order, its
// verdicts are in the stream once, and the record is gone.
func TestParkedSessionLetsOthersGo(t *testing.T) {
	e := newEnv(t)
	pr := e.startParking(t, 600)
	r, cfg, kv, lift, others := pr.r, pr.cfg, pr.kv, pr.lift, pr.others
	subj := cfg.Subjects()
	require.GreaterOrEqual(t, pr.clean, 4096)

	waitFor(t, 2*time.Minute, "every other session decided", func() bool {
		n := 0
		for _, v := range e.verdicts(t, cfg) {
			if strings.HasPrefix(v.v.Session, "clean") && v.v.Type == events.TypeCompactionAllowed {
				n++
			}
		}
		return n == len(others)
	})
	waitFor(t, 10*time.Second, "the bloated session parked", func() bool { return r.p.Stats().Parked == 1 })
	st := r.p.Stats()
	t.Logf("%d inputs handled, %d acknowledged into the park record", st.Handled, st.ParkedInputs)
	require.Positive(t, st.ParkedInputs)
	require.NoError(t, r.p.Ready(), "a parked session does not make the processor unready")
	require.Zero(t, r.p.StuckSessions())
	parked := r.p.Parked()
	require.Len(t, parked, 1)
	require.Equal(t, "bloated", parked[0].Session)
	entry, err := kv.Get(e.ctx, processor.ParkedKey("bloated"))
	require.NoError(t, err, "the park record is stored")
	var rec processor.ParkRecord
	require.NoError(t, json.Unmarshal(entry.Value(), &rec))
	require.Equal(t, "bloated", rec.Session)
	require.Contains(t, rec.Cause, "maximum")
	require.Positive(t, rec.StoredSeq)
	// What it published before its state failed stands (decisions depend
	// only on the inputs); the resume below publishes the same again,
	// which the verdict stream keeps once.
	e.waitIdle(t, cfg, 30*time.Second) // every input acknowledged, the parked one's too

	// The limit lifted, the operator resumes it.
	lift()
	resume := &sessionScript{ID: "bloated"}
	resume.EventWithID("ops-resume-1", events.TypeSessionResumed, map[string]any{"note": "value limit lifted (OPS-1)"})
	e.publishAll(t, scriptMsgs(t, subj, resume))
	waitFor(t, 30*time.Second, "the bloated session out of its park, its state stored past the record's", func() bool {
		e, err := kv.Get(e.ctx, "bloated")
		if err != nil || r.p.Stats().Parked != 0 {
			return false
		}
		st, err := processor.UnmarshalState(e.Value())
		return err == nil && st.Seq > rec.StoredSeq
	})
	e.waitIdle(t, cfg, 30*time.Second)
	require.Equal(t, map[string]int{events.TypeCompactionRefused: 1, events.TypeTranscriptSpilled: 1}, verdictsOf(t, e, cfg, "bloated"),
		"the parked session's verdicts, once each")
	_, err = kv.Get(e.ctx, processor.ParkedKey("bloated"))
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the park record is gone")
	require.Zero(t, r.p.Stats().Parked)
	require.NoError(t, r.stop(t))
}

// parking is a processor on one partition whose consumer may hold few
// inputs unacknowledged, with the session "bloated" stuck on a state the
// bucket's lowered value limit refuses (lift lifts it), and the other
// sessions' events published behind it (clean of them).
type parking struct {
	r      *running
	cfg    processor.Config
	kv     jetstream.KeyValue
	lift   func()
	others []*sessionScript
	clean  int
}

// startParking starts it with that many other sessions.
func (e *env) startParking(t *testing.T, sessions int) parking {
	t.Helper()
	cfg := baseConfig()
	cfg.Partitions = 1
	cfg.Shards = 2
	cfg.QueueDepth = 64
	cfg.MaxAckPending = 256
	cfg.AckWait = 2 * time.Second
	cfg.RetryFor = time.Second
	cfg.ParkAfter = 3 * time.Second
	r := e.start(t, cfg)
	waitFor(t, 10*time.Second, "the processor consuming", func() bool { return r.p.Ready() == nil })

	lift := e.limitStateSize(t, cfg, 400)
	kv, err := e.JS.KeyValue(e.ctx, cfg.Names().Sessions)
	require.NoError(t, err)

	bloated, others := stuckScripts(sessions)
	subj := cfg.Subjects()
	msgs := scriptMsgs(t, subj, bloated)
	e.publishAll(t, msgs[:3])
	waitFor(t, 10*time.Second, "the bloated session's first state stored", func() bool {
		_, err := kv.Get(e.ctx, "bloated")
		return err == nil
	})
	rest := msgs[3:]
	var clean int
	for _, s := range others {
		m := scriptMsgs(t, subj, s)
		clean += len(m)
		rest = append(rest, m...)
	}
	e.publishAll(t, rest)
	return parking{r: r, cfg: cfg, kv: kv, lift: lift, others: others, clean: clean}
}
