package processor_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// reflection is a request an agent sends so that the processor's answer
// lands where the agent may not publish itself.
type reflection struct {
	name    string
	subject string // the request's subject
	reply   string // where the answer would go
	body    []byte
}

// reflections are the requests of the confused-deputy attack on one
// server: the JetStream API, the session bucket, and another session's
// control, events and verdict subjects, through a recover read (whose
// bytes the agent chose: the first line of its own spill), a refusal (a
// spill that does not exist) and the discovery requests, and reply
// subjects that only look like inboxes.
func reflections(cfg processor.Config, h events.SpillHandle, firstLine int) []reflection {
	n := cfg.Names()
	subj := cfg.Subjects()
	read, _ := json.Marshal(events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Max: firstLine})
	// A read at the end answers with no bytes, as the JetStream API's
	// purge and delete requests are.
	empty, _ := json.Marshal(events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Offset: h.Size})
	missing, _ := json.Marshal(events.RecoverRequest{Name: "ops-agent-42/99.jsonl"})
	rec := subj.Recover("ops-agent-42")
	return []reflection{
		{"purge the events stream with an empty read", rec, "$JS.API.STREAM.PURGE." + n.Events, empty},
		{"purge the events stream with a spill's bytes", rec, "$JS.API.STREAM.PURGE." + n.Events, read},
		{"delete the spill store with a refusal", rec, "$JS.API.STREAM.DELETE.OBJ_" + n.Spills, missing},
		{"delete the verdict stream with a refusal", rec, "$JS.API.STREAM.DELETE." + n.Verdicts, missing},
		{"overwrite another session's state", rec, "$KV." + n.Sessions + ".victim", read},
		{"lift another session's halt", rec, subj.Control("victim"), read},
		{"publish another session's events", rec, "seamguard.events.victim", read},
		{"forge another session's verdict", rec, "seamguard.verdicts.victim.allowed", read},
		{"purge the events stream with a ping", "$SRV.PING", "$JS.API.STREAM.PURGE." + n.Events, nil},
		{"purge the events stream with the service's info", "$SRV.INFO.seamguard", "$JS.API.STREAM.PURGE." + n.Events, nil},
		{"purge the events stream with its stats", "$SRV.STATS", "$JS.API.STREAM.PURGE." + n.Events, nil},
		{"a wildcard inbox", rec, "_INBOX.*", read},
		{"a full wildcard inbox", rec, "_INBOX.>", read},
		{"the bare inbox prefix", rec, "_INBOX", read},
		{"an empty token", rec, "_INBOX..x", read},
		{"a look-alike prefix", rec, "_INBOXES.x", read},
	}
}

// sideEffects are what the attacks aim at, measured before and after.
type sideEffects struct {
	events, verdicts, spillMsgs uint64
	spillStream, verdictStream  bool
	victimState                 bool
}

func (e *env) sideEffects(t *testing.T, cfg processor.Config) sideEffects {
	t.Helper()
	n := cfg.Names()
	var s sideEffects
	s.events = e.streamInfo(t, n.Events).State.Msgs
	// A stream found may be deleted before its info is read (the attacks
	// run while this looks): then it is not there.
	if str, err := e.JS.Stream(e.ctx, n.Verdicts); err == nil {
		info, err := str.Info(e.ctx)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			require.NoError(t, err)
			s.verdictStream = true
			s.verdicts = info.State.Msgs
		}
	}
	if str, err := e.JS.Stream(e.ctx, "OBJ_"+n.Spills); err == nil {
		info, err := str.Info(e.ctx)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			require.NoError(t, err)
			s.spillStream = true
			s.spillMsgs = info.State.Msgs
		}
	}
	kv, err := e.JS.KeyValue(e.ctx, n.Sessions)
	require.NoError(t, err)
	_, err = kv.Get(e.ctx, "victim")
	s.victimState = err == nil
	return s
}

// TestServicesAnswerOnlyInboxes sends every reflection to a running
// processor: none gets an answer, nothing it aims at changes, each is
// counted as denied, and a request with an inbox reply is still answered.
// With the check off (as a build without it), the same requests purge
// the events stream, delete the verdict stream and the spill store, and
// write another session's state.
func TestServicesAnswerOnlyInboxes(t *testing.T) {
	for _, checked := range []bool{true, false} {
		t.Run(fmt.Sprintf("checked=%v", checked), func(t *testing.T) {
			e := newEnv(t)
			cfg := baseConfig()
			r := e.start(t, cfg)
			h, want := e.seedSpill(t, cfg)
			firstLine := bytes.IndexByte(want, '\n')
			require.Positive(t, firstLine)

			agent, err := nats.Connect(e.Server.ClientURL())
			require.NoError(t, err)
			defer agent.Close()
			// A witness hears every subject the attacks aim at.
			witness, err := nats.Connect(e.Server.ClientURL())
			require.NoError(t, err)
			defer witness.Close()
			var mu sync.Mutex
			heard := map[string]int{}
			attacks := reflections(cfg, h, firstLine)
			for _, a := range attacks {
				if a.reply == "_INBOX.*" || a.reply == "_INBOX.>" || a.reply == "_INBOX" || a.reply == "_INBOX..x" {
					continue // not a subject one can publish or subscribe to as such
				}
				_, err := witness.Subscribe(a.reply, func(m *nats.Msg) {
					mu.Lock()
					heard[m.Subject]++
					mu.Unlock()
				})
				require.NoError(t, err)
			}
			require.NoError(t, witness.Flush())

			before := e.sideEffects(t, cfg)
			deniedBefore := r.p.Stats().ServiceDenied
			if !checked {
				defer processor.AnswerAnyReply()()
			}
			for _, a := range attacks {
				require.NoError(t, agent.PublishMsg(&nats.Msg{Subject: a.subject, Reply: a.reply, Data: a.body}), a.name)
			}
			require.NoError(t, agent.Flush())

			if !checked {
				// The deputy does the agent's bidding.
				var after sideEffects
				deadline := time.Now().Add(10 * time.Second)
				for {
					after = e.sideEffects(t, cfg)
					if after.events < before.events && !after.verdictStream && !after.spillStream && after.victimState {
						break
					}
					require.True(t, time.Now().Before(deadline), "the attacks did not land: before %+v, after %+v", before, after)
					time.Sleep(20 * time.Millisecond)
				}
				return
			}
			waitFor(t, 10*time.Second, "every attack counted as denied", func() bool {
				return r.p.Stats().ServiceDenied-deniedBefore >= uint64(len(attacks))
			})
			assert.Equal(t, uint64(len(attacks)), r.p.Stats().ServiceDenied-deniedBefore)
			// The service still answers an inbox, after all of that.
			m := ask(t, agent, cfg.Subjects().Recover("ops-agent-42"), events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Max: firstLine})
			require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
			require.Equal(t, want[:firstLine], m.Data)
			require.NoError(t, witness.Flush())
			mu.Lock()
			assert.Empty(t, heard, "answers published where the agent may not publish")
			mu.Unlock()
			assert.Equal(t, before, e.sideEffects(t, cfg))
		})
	}
}

// TestRecoverFloodDelaysOnlyItself: one session floods the recover
// service with reads near the end of its spill while another reads its
// own spill request by request. The flood's surplus is answered 503 at
// once (no request of either times out), and the other session's reads
// take about what they take alone: the ratio of its median latency under
// the flood to its median alone is printed and bounded loosely.
func TestRecoverFloodDelaysOnlyItself(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	r := e.start(t, cfg)
	h, want := e.seedSpill(t, cfg)
	// A second session, the seed story under another id, with its spill.
	subj := cfg.Subjects()
	var msgs []*nats.Msg
	for _, l := range readLines(t, seedStory) {
		msgs = append(msgs, binaryMsg(t, subj, bytes.ReplaceAll(l, []byte("ops-agent-42"), []byte("quiet-agent"))))
	}
	e.publishAll(t, msgs)
	e.waitIdle(t, cfg, 30*time.Second)
	quietName := "quiet-agent/1.jsonl"

	flooder, err := nats.Connect(e.Server.ClientURL())
	require.NoError(t, err)
	defer flooder.Close()
	quiet, err := nats.Connect(e.Server.ClientURL())
	require.NoError(t, err)
	defer quiet.Close()

	readQuiet := func(n int) []time.Duration {
		var took []time.Duration
		for i := range n {
			start := time.Now()
			m := ask(t, quiet, subj.Recover("quiet-agent"), events.RecoverRequest{Op: events.RecoverOpRead, Name: quietName, Offset: uint64(i * 100), Max: 100})
			took = append(took, time.Since(start))
			require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), "the quiet session refused: %s", m.Header.Get(micro.ErrorHeader))
			require.Len(t, m.Data, 100)
		}
		return took
	}
	median := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	alone := median(readQuiet(40))

	// The flood: 2,000 reads near the end of the flooder's spill, sent
	// without waiting, each with its own inbox.
	const flood = 2000
	replies := make(chan *nats.Msg, flood)
	sub, err := flooder.ChanSubscribe(flooder.NewRespInbox()+".*", replies)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	prefix := sub.Subject[:len(sub.Subject)-1]
	body, err := json.Marshal(events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Offset: h.Size - 10})
	require.NoError(t, err)
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for i := range flood {
			_ = flooder.PublishMsg(&nats.Msg{Subject: subj.Recover("ops-agent-42"), Reply: prefix + strconv.Itoa(i), Data: body})
			if i%100 == 99 {
				_ = flooder.Flush()
			}
		}
		_ = flooder.Flush()
	}()
	under := median(readQuiet(40))
	<-flooded

	// Every flood request is answered, with the data or 503: none is
	// left to time out.
	var ok, busy int
	deadline := time.After(30 * time.Second)
	for ok+busy < flood {
		select {
		case m := <-replies:
			switch code := m.Header.Get(micro.ErrorCodeHeader); code {
			case "":
				require.Equal(t, want[h.Size-10:], m.Data)
				ok++
			case "503":
				busy++
			default:
				t.Fatalf("a flood request refused %s: %s", code, m.Header.Get(micro.ErrorHeader))
			}
		case <-deadline:
			t.Fatalf("%d of %d flood requests answered (%d with data, %d 503) within 30s", ok+busy, flood, ok, busy)
		}
	}
	ratio := float64(under) / float64(alone)
	t.Logf("quiet session's median read: %s alone, %s under a flood of %d requests (%.2fx); flood: %d answered, %d refused 503 at once; denied %d",
		alone, under, flood, ratio, ok, busy, r.p.Stats().ServiceDenied)
	assert.Positive(t, busy, "a flood beyond the queue is answered 503")
	assert.Less(t, under, 2*time.Second, "the quiet session waited on the flood")
}

// bigSpill plays a session whose turns carry 100 KiB each (6 MiB in all),
// truncates its first turns and asks for a compaction, and returns the
// handle of the spill it writes: an object of many chunks.
func (e *env) bigSpill(t *testing.T, cfg processor.Config, session string) events.SpillHandle {
	t.Helper()
	subj := cfg.Subjects()
	content := strings.Repeat("x", 100<<10)
	line := func(i int, typ, data string) []byte {
		return []byte(fmt.Sprintf(`{"specversion":"1.0","id":"%s-%04d","source":"urn:agent:big","type":"io.seamguard.%s","subject":"%s","datacontenttype":"application/json","data":%s}`,
			session, i, typ, session, data))
	}
	var msgs []*nats.Msg
	msgs = append(msgs, binaryMsg(t, subj, line(0, "session.opened", `{"unit":"turns","recovery_floor":{"span":4,"unit":"turns"}}`)))
	const turns = 60
	for i := range turns {
		msgs = append(msgs, binaryMsg(t, subj, line(i+1, "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"content":%q}`, i, content))))
	}
	msgs = append(msgs, binaryMsg(t, subj, line(turns+1, "context.truncated", `{"range":{"start":0,"end":8},"stage":"budget"}`)))
	msgs = append(msgs, binaryMsg(t, subj, line(turns+2, "compaction.requested",
		fmt.Sprintf(`{"request_id":"c1","summarizer_input":{"start":8,"end":%d},"summary_range":{"start":8,"end":%d},"tail_start":%d}`, turns, turns-10, turns-10))))
	e.publishOrdered(t, msgs)
	e.waitIdle(t, cfg, time.Minute)
	for _, v := range e.verdicts(t, cfg) {
		if d, ok := v.v.Data.(*events.SpillHandle); ok && strings.HasPrefix(d.Name, session+"/") {
			return *d
		}
	}
	t.Fatal("no spill written")
	return events.SpillHandle{}
}

// TestRecoverReadCostsOneChunk: a read near the end of a spill of many
// chunks makes the processor read one chunk, not every chunk before it.
// Measured as the bytes the processor's connection receives while it
// answers; with the spill's chunk index removed from its info (as a
// spill written without one), the same read costs the whole spill.
func TestRecoverReadCostsOneChunk(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	e.start(t, cfg)
	h := e.bigSpill(t, cfg, "big-agent")
	obs, err := e.JS.ObjectStore(e.ctx, cfg.Names().Spills)
	require.NoError(t, err)
	info, err := obs.GetInfo(e.ctx, h.Name)
	require.NoError(t, err)
	require.Greater(t, info.Chunks, uint32(8), "the spill must have many chunks")
	chunk := uint64(info.Opts.ChunkSize)

	agent, err := nats.Connect(e.Server.ClientURL())
	require.NoError(t, err)
	defer agent.Close()
	readEnd := func() uint64 {
		t.Helper()
		before := e.NC.Stats().InBytes
		m := ask(t, agent, cfg.Subjects().Recover("big-agent"), events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Offset: h.Size - 100})
		require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
		require.Len(t, m.Data, 100)
		return e.NC.Stats().InBytes - before
	}
	indexed := readEnd()
	t.Logf("a read of 100 bytes at the end of a %d-byte spill in %d chunks of %d: %d bytes read with the index", h.Size, info.Chunks, chunk, indexed)
	assert.Less(t, indexed, 2*chunk, "the read cost more than one chunk")

	// Without the index, the service reads from the first chunk.
	meta := info.ObjectMeta
	meta.Metadata = maps.Clone(meta.Metadata)
	delete(meta.Metadata, "seamguard-chunk-seqs")
	require.NoError(t, obs.UpdateMeta(e.ctx, h.Name, meta))
	scanned := readEnd()
	t.Logf("without it: %d bytes read (%.1fx)", scanned, float64(scanned)/float64(indexed))
	assert.Greater(t, scanned, h.Size/2, "the control read no more without the index")
}
