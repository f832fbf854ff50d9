package processor_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// TestFloorsSkipLookupsButNotLostInputs: with the partitions' floors
// stored, a processor that reads a fleet's states fresh takes most of them
// as caught up without looking in the events stream (Stats.Floored), and
// every compaction is still decided on every turn. A state put back by hand
// (an older one, which lost an acknowledged turn) is not taken on a floor's
// word: it is caught up from the stream, and its compaction too is allowed.
func TestFloorsSkipLookupsButNotLostInputs(t *testing.T) {
	e := newEnv(t)
	f := &fleet{t: t, e: e, cfg: baseConfig(), prefix: "fl"}
	const n = 120
	r := e.start(t, f.cfg)
	f.wave(0, n, f.open)
	kv, err := e.JS.KeyValue(e.ctx, f.cfg.Names().Sessions)
	require.NoError(t, err)
	damaged := f.id(n - 1)
	before, err := kv.Get(e.ctx, damaged) // opened, no turn yet
	require.NoError(t, err)
	f.wave(0, n, func(i int) *nats.Msg { return f.turn(i, 0) })
	require.NoError(t, r.stop(t))

	// A processor with nothing in memory: its own floors pass what the
	// last one left once a few waves are stored.
	r = e.start(t, f.cfg)
	for w := range 4 {
		f.wave(w*10, w*10+10, func(i int) *nats.Msg { return f.turn(i, 1) })
	}
	// Turn 0 of the damaged session is acknowledged, and its state put
	// back to before it, by hand.
	_, err = kv.Put(e.ctx, damaged, before.Value())
	require.NoError(t, err)
	floored := r.p.Stats().Floored
	f.wave(40, n, func(i int) *nats.Msg { return f.turn(i, 1) })
	f.wave(40, n, func(i int) *nats.Msg { return f.compaction(i, 2) })
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d of %d sessions read fresh shown caught up by a floor; %d inputs caught up from the stream", st.Floored-floored, n-40, st.CaughtUp)
	require.Greater(t, st.Floored-floored, uint64((n-40)/2), "most fresh states are shown caught up by their partition's floor")
	f.allAllowed(n-40, "every turn received, the damaged session's too")
}

// TestFloorsLeaveAResumedParkToItsCatchUp: a parked session's inputs are
// acknowledged into its park record without being applied, so its
// partition's floor passes them while its state stays behind. Its record
// deleted (as the resume deletes it, with the process gone before the
// session caught up), a processor reading the session fresh must not take
// its state on the floor's word: the resume, redelivered, applies every
// waiting input, in order, and the stored state is the one a rebuild from
// the events stream derives.
func TestFloorsLeaveAResumedParkToItsCatchUp(t *testing.T) {
	e := newEnv(t)
	pr := e.startParking(t, 300)
	r, cfg, kv, lift, others := pr.r, pr.cfg, pr.kv, pr.lift, pr.others
	subj := cfg.Subjects()
	waitFor(t, 2*time.Minute, "the bloated session parked", func() bool { return r.p.Stats().Parked == 1 })
	e.waitIdle(t, cfg, 30*time.Second)
	require.Positive(t, r.p.Stats().ParkedInputs)
	lift()
	require.NoError(t, r.stop(t))

	// The resume's first step landed, then the process was gone.
	require.NoError(t, kv.Delete(e.ctx, processor.ParkedKey("bloated")))

	// A new processor, its floors past what it was handed once it has
	// decided a few waves of the other sessions, read fresh.
	r = e.start(t, cfg)
	// The resume goes with the last wave, in a batch read ahead.
	floored := r.p.Stats().Floored
	resume := &sessionScript{ID: "bloated"}
	resume.EventWithID("ops-resume-1", events.TypeSessionResumed, map[string]any{"note": "value limit lifted (OPS-1)"})
	for w := range 3 {
		var wave []*nats.Msg
		for i, s := range others[w*100 : w*100+100] {
			if w == 2 && i == 50 {
				wave = append(wave, scriptMsgs(t, subj, resume)...)
			}
			s.Items = nil
			s.Turns(1, 1)
			wave = append(wave, scriptMsgs(t, subj, s)...)
		}
		e.publishAll(t, wave)
		e.waitIdle(t, cfg, 30*time.Second)
	}
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d states read fresh shown caught up by a floor; %d inputs caught up from the stream", st.Floored-floored, st.CaughtUp)
	require.Positive(t, st.Floored-floored, "floors were in force")
	require.Equal(t, map[string]int{events.TypeCompactionRefused: 1, events.TypeTranscriptSpilled: 1}, verdictsOf(t, e, cfg, "bloated"),
		"the parked session's verdicts, once each")
	p, err := processor.New(e.ctx, e.JS, cfg)
	require.NoError(t, err)
	rep, err := p.Rebuild(e.ctx, false)
	require.NoError(t, err)
	require.Empty(t, rep.Differ, "every state as the events stream derives it: the waiting inputs applied")
}

// TestFloorsAfterABackupRestore: the session bucket put back whole from a
// backup (every key as it was, the partitions' floors with it) is older
// than the acknowledgements its consumers keep: turns acknowledged since
// are in no state. A processor started on it finds the floors short of
// where its delivery begins, so the floors it writes vouch only for what
// it decides: once they pass where it began, half the sessions, untouched
// until then, are still caught up from the events stream (their states
// are older than the floors' low end), and every compaction is decided on
// every turn.
func TestFloorsAfterABackupRestore(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.MaxSessions = cfg.WithDefaults().Shards // one a shard: the others are read fresh
	defer processor.IdleAfterEveryBatch()()     // and a sweep after every batch drops them
	f := &fleet{t: t, e: e, cfg: cfg, prefix: "bk"}
	const n = 60
	r := e.start(t, cfg)
	f.wave(0, n, f.open)
	f.wave(0, n, func(i int) *nats.Msg { return f.turn(i, 0) })
	backup := e.backupBucket(t, cfg.Names().Sessions)
	require.NotEmpty(t, backup)
	f.wave(0, n, func(i int) *nats.Msg { return f.turn(i, 1) })
	require.NoError(t, r.stop(t))
	e.restoreBucket(t, backup)

	r = e.start(t, cfg)
	for k := range 3 {
		f.wave(0, n/2, func(i int) *nats.Msg { return f.turn(i, 2+k) })
	}
	f.wave(n/2, n, func(i int) *nats.Msg { return f.compaction(i, 2) })
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d states shown caught up by a floor; %d inputs caught up from the stream", st.Floored, st.CaughtUp)
	require.Positive(t, st.Floored, "its own floors were in force")
	f.allAllowed(n/2, "every turn received, those the backup lost too")
}

// backupBucket returns the last message of every key of bucket, headers
// and all, as a backup of the stream would hold them.
func (e *env) backupBucket(t *testing.T, bucket string) []*nats.Msg {
	t.Helper()
	s, err := e.JS.Stream(e.ctx, "KV_"+bucket)
	require.NoError(t, err)
	info, err := s.Info(e.ctx, jetstream.WithSubjectFilter(processor.KVSubjects(bucket)))
	require.NoError(t, err)
	var out []*nats.Msg
	for subject := range info.State.Subjects {
		m, err := s.GetLastMsgForSubject(e.ctx, subject)
		require.NoError(t, err)
		if m.Header.Get("KV-Operation") != "" {
			continue
		}
		h := nats.Header{}
		for k, v := range m.Header {
			if !strings.HasPrefix(k, "Nats-") {
				h[k] = v
			}
		}
		out = append(out, &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data})
	}
	return out
}

// restoreBucket puts every message of backup back.
func (e *env) restoreBucket(t *testing.T, backup []*nats.Msg) {
	t.Helper()
	for _, m := range backup {
		_, err := e.JS.PublishMsg(e.ctx, m)
		require.NoError(t, err)
	}
}

// TestFloorsUnderARunningProcessorRestore: the same backup put back key by
// key under a running processor that holds few sessions in memory. The
// floors put back are past where its delivery began, but it decided a turn
// of each session since, which no state put back holds: it takes none of
// those states on a floor's word, and every compaction is decided on every
// turn.
func TestFloorsUnderARunningProcessorRestore(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.MaxSessions = cfg.WithDefaults().Shards // one a shard: the others are read fresh
	defer processor.IdleAfterEveryBatch()()     // and a sweep after every batch drops them
	// A session in memory whose state was put back is fenced, its input
	// left to its redelivery.
	cfg.AckWait = 2 * time.Second
	f := &fleet{t: t, e: e, cfg: cfg, prefix: "rs"}
	const n = 60
	r := e.start(t, cfg)
	f.wave(0, n, f.open)
	f.wave(0, n, func(i int) *nats.Msg { return f.turn(i, 0) })
	f.wave(0, n, func(i int) *nats.Msg { return f.turn(i, 1) })
	backup := e.backupBucket(t, cfg.Names().Sessions)
	f.wave(0, n, func(i int) *nats.Msg { return f.turn(i, 2) })
	e.restoreBucket(t, backup)
	f.wave(0, n, func(i int) *nats.Msg { return f.compaction(i, 3) })
	st := r.p.Stats()
	require.NoError(t, r.stop(t))
	t.Logf("%d states shown caught up by a floor; %d inputs caught up from the stream", st.Floored, st.CaughtUp)
	f.allAllowed(n, "every turn received, those the backup lost too")
}

// fleet is a test's sessions, each named by its index: their events as
// CloudEvents in binary mode, published in waves, each wave decided
// before the next.
type fleet struct {
	t      *testing.T
	e      *env
	cfg    processor.Config
	prefix string
}

func (f *fleet) id(i int) string { return fmt.Sprintf("%s%03d", f.prefix, i) }

func (f *fleet) msg(i int, suffix, typ, data string) *nats.Msg {
	sess := f.id(i)
	return binaryMsg(f.t, f.cfg.Subjects(), fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:t","type":"io.seamguard.%s","subject":%q,"data":%s}`, sess+"-"+suffix, typ, sess, data))
}

func (f *fleet) open(i int) *nats.Msg {
	return f.msg(i, "o", "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`)
}

func (f *fleet) turn(i, off int) *nats.Msg {
	return f.msg(i, fmt.Sprintf("t%d", off), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"role":"user","content":"turn %d"}`, off, off))
}

// compaction asks to summarize turns [0, end-1) and keep the last.
func (f *fleet) compaction(i, end int) *nats.Msg {
	return f.msg(i, "r", "compaction.requested", fmt.Sprintf(`{"request_id":"r","summarizer_input":{"start":0,"end":%d},"summary_range":{"start":0,"end":%d},"tail_start":%d}`, end, end-1, end-1))
}

// wave publishes each(i) for the sessions from up to to, and waits until
// every event is decided.
func (f *fleet) wave(from, to int, each func(i int) *nats.Msg) {
	var msgs []*nats.Msg
	for i := from; i < to; i++ {
		msgs = append(msgs, each(i))
	}
	f.e.publishAll(f.t, msgs)
	f.e.waitIdle(f.t, f.cfg, 20*time.Second)
}

// allAllowed checks that every verdict allows a compaction, n in all.
func (f *fleet) allAllowed(n int, why string) {
	vs := f.e.verdicts(f.t, f.cfg)
	require.Len(f.t, vs, n, "one verdict a compaction")
	for _, v := range vs {
		require.Equal(f.t, events.TypeCompactionAllowed, v.v.Type, "%s: %s", why, describe(v.v))
	}
}
