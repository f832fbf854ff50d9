package processor_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// seedSpill plays the seed story into a running processor and returns the
// handle of the spill it wrote and the spill's chain as spill.Store reads
// it.
func (e *env) seedSpill(t *testing.T, cfg processor.Config) (events.SpillHandle, []byte) {
	t.Helper()
	subj := cfg.Subjects()
	var msgs []*nats.Msg
	for _, l := range readLines(t, seedStory) {
		msgs = append(msgs, binaryMsg(t, subj, l))
	}
	e.publishAll(t, msgs)
	e.waitIdle(t, cfg, 30*time.Second)
	var h *events.SpillHandle
	for _, v := range e.verdicts(t, cfg) {
		if d, ok := v.v.Data.(*events.SpillHandle); ok {
			h = d
		}
	}
	require.NotNil(t, h, "the seed story wrote no spill")
	store := &spill.Store{JS: e.JS, Stream: cfg.Names().Events, Subjects: subj, Bucket: cfg.Names().Spills}
	var want bytes.Buffer
	_, err := store.GetChain(e.ctx, h.Name, &want)
	require.NoError(t, err)
	return *h, want.Bytes()
}

// ask sends one request to the recover service as an agent would, on its
// own connection, and returns the reply.
func ask(t *testing.T, nc *nats.Conn, subject string, body any) *nats.Msg {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case []byte:
		data = b
	default:
		var err error
		data, err = json.Marshal(b)
		require.NoError(t, err)
	}
	m, err := nc.Request(subject, data, 5*time.Second)
	require.NoError(t, err, "request on %s", subject)
	return m
}

// refusedWith checks that m is a refusal with code and a message holding
// each of says.
func refusedWith(t *testing.T, m *nats.Msg, code int, says ...string) {
	t.Helper()
	require.Equal(t, strconv.Itoa(code), m.Header.Get(micro.ErrorCodeHeader), "refusal %q", m.Header.Get(micro.ErrorHeader))
	require.Empty(t, m.Data)
	for _, s := range says {
		assert.Contains(t, m.Header.Get(micro.ErrorHeader), s)
	}
}

// TestRecoverService runs the recover service of a real processor: micro's
// discovery finds it, an info request returns the spill's handle, reads
// of any size return exactly the bytes spill.Store reads (following the
// cursors, or without them), every malformed or unauthorized request is
// refused with its code, the stats count it all, and a drain takes the
// service away.
func TestRecoverService(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	r := e.start(t, cfg)
	h, want := e.seedSpill(t, cfg)
	session := "ops-agent-42"
	require.True(t, strings.HasPrefix(h.Name, session+"/"))
	require.Nil(t, h.Previous, "the seed story spills once")

	agent, err := nats.Connect(e.Server.ClientURL())
	require.NoError(t, err)
	defer agent.Close()
	subject := cfg.Subjects().Recover(session)
	require.Equal(t, "seamguard.recover.ops-agent-42", subject)

	t.Run("discovery", func(t *testing.T) {
		var ping micro.Ping
		require.NoError(t, json.Unmarshal(ask(t, agent, "$SRV.PING", nil).Data, &ping))
		assert.Equal(t, "seamguard", ping.Name)
		assert.Equal(t, processor.ServiceVersion(), ping.Version)

		var info micro.Info
		require.NoError(t, json.Unmarshal(ask(t, agent, "$SRV.INFO.seamguard", nil).Data, &info))
		assert.Equal(t, ping.ID, info.ID)
		assert.NotEmpty(t, info.Description)
		assert.Equal(t, "seamguard", info.Metadata["prefix"])
		assert.Equal(t, "seamguard-spills", info.Metadata["bucket"])
		require.Len(t, info.Endpoints, 1)
		ep := info.Endpoints[0]
		assert.Equal(t, "recover", ep.Name)
		assert.Equal(t, "seamguard.recover.*", ep.Subject)
		assert.Equal(t, "seamguard", ep.QueueGroup)
		assert.Equal(t, strconv.Itoa(events.MaxRecoverChunk), ep.Metadata["max_chunk"])
	})

	requests, refusals := 0, 0
	do := func(body any) *nats.Msg {
		t.Helper()
		requests++
		m := ask(t, agent, subject, body)
		if m.Header.Get(micro.ErrorCodeHeader) != "" {
			refusals++
		}
		return m
	}

	t.Run("info", func(t *testing.T) {
		m := do(events.RecoverRequest{Name: h.Name})
		require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
		var got events.SpillHandle
		require.NoError(t, json.Unmarshal(m.Data, &got))
		assert.Equal(t, h, got)
		assert.Equal(t, h.Digest, m.Header.Get(events.HeaderSpillDigest))
		assert.Equal(t, strconv.Itoa(len(want)), m.Header.Get(events.HeaderSpillSize))
		assert.EqualValues(t, len(want), h.Size)
	})

	t.Run("read", func(t *testing.T) {
		for _, max := range []int{0, 1000, 4093} {
			var got []byte
			var off uint64
			cursor, replies := "", 0
			for off < h.Size {
				m := do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: off, Cursor: cursor, Max: max})
				require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
				require.Equal(t, strconv.FormatUint(off, 10), m.Header.Get(events.HeaderOffset))
				require.Equal(t, h.Digest, m.Header.Get(events.HeaderSpillDigest))
				require.NotEmpty(t, m.Data)
				if max > 0 {
					require.LessOrEqual(t, len(m.Data), max)
				}
				got = append(got, m.Data...)
				off += uint64(len(m.Data))
				cursor = m.Header.Get(events.HeaderCursor)
				require.Equal(t, off == h.Size, cursor == "", "a cursor until the end, none at it")
				replies++
			}
			require.Equal(t, want, got, "max %d", max)
			per := max
			if per == 0 {
				per = events.MaxRecoverChunk
			}
			require.Equal(t, (len(want)+per-1)/per, replies, "max %d", max)
		}
		// Without a cursor, from any offset; at the end, nothing.
		m := do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: 1500, Max: 100})
		require.Equal(t, want[1500:1600], m.Data)
		m = do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: h.Size})
		require.Empty(t, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader))
		require.Empty(t, m.Data)
		require.Empty(t, m.Header.Get(events.HeaderCursor))
	})

	t.Run("refusals", func(t *testing.T) {
		first := do(events.RecoverRequest{Op: "read", Name: h.Name, Max: 10})
		cursor := first.Header.Get(events.HeaderCursor)
		require.NotEmpty(t, cursor)
		parts := strings.Split(cursor, ".")
		require.Len(t, parts, 3, "cursor %q", cursor)
		nuid, seq := parts[0], parts[1]

		// Another session's subject, asking for this session's spill: the
		// name must be of the subject's session.
		requests++
		refusals++
		refusedWith(t, ask(t, agent, cfg.Subjects().Recover("intruder"), events.RecoverRequest{Name: h.Name}), 403, "not a spill of session intruder")
		requests++
		refusals++
		refusedWith(t, ask(t, agent, cfg.Subjects().Recover("intruder"), events.RecoverRequest{Op: "read", Name: h.Name}), 403)
		refusedWith(t, do(events.RecoverRequest{Name: session + "/99.jsonl"}), 404, "no spill named", session+"/99.jsonl")
		refusedWith(t, do(events.RecoverRequest{Name: "other/1.jsonl"}), 403, "not a spill of session "+session)
		refusedWith(t, do(events.RecoverRequest{}), 400, "names no spill")
		refusedWith(t, do(events.RecoverRequest{Name: session + "/" + strings.Repeat("x", 300)}), 400, "spill name has")
		refusedWith(t, do([]byte("not json")), 400, "not a JSON object")
		refusedWith(t, do([]byte(`{"name":"`+h.Name+`","pad":"`+strings.Repeat("x", 2000)+`"}`)), 413)
		refusedWith(t, do(events.RecoverRequest{Op: "delete", Name: h.Name}), 400, `op "delete" is unknown`)
		refusedWith(t, do(events.RecoverRequest{Op: "read", Name: h.Name, Max: -1}), 400)
		refusedWith(t, do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: h.Size + 1}), 400, "past the end")
		refusedWith(t, do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: 10, Cursor: "garbage"}), 400, "cursor")
		refusedWith(t, do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: 10, Cursor: nuid + ".999999.10"}), 400, "does not point at a chunk")
		refusedWith(t, do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: 5, Cursor: nuid + "." + seq + ".100"}), 400, "after offset 5")
		refusedWith(t, do(events.RecoverRequest{Op: "read", Name: h.Name, Offset: 10, Cursor: "AnotherVersionOfTheSpil.1.0"}), 409, "written again")
	})

	t.Run("stats", func(t *testing.T) {
		var stats micro.Stats
		require.NoError(t, json.Unmarshal(ask(t, agent, "$SRV.STATS.seamguard", nil).Data, &stats))
		require.Len(t, stats.Endpoints, 1)
		assert.Equal(t, requests, stats.Endpoints[0].NumRequests)
		assert.Equal(t, refusals, stats.Endpoints[0].NumErrors)
	})

	// A drain takes the service away: nothing answers any more.
	require.NoError(t, r.stop(t))
	_, err = agent.Request("$SRV.PING.seamguard", nil, time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
	_, err = agent.Request(subject, []byte(`{"name":"`+h.Name+`"}`), time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
}

// TestRecoverServiceOff: with Config.NoRecoverService no service is
// registered, and the processor decides as ever.
func TestRecoverServiceOff(t *testing.T) {
	e := newEnv(t)
	cfg := baseConfig()
	cfg.NoRecoverService = true
	r := e.start(t, cfg)
	h, _ := e.seedSpill(t, cfg)
	_, err := e.NC.Request("$SRV.PING.seamguard", nil, time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
	_, err = e.NC.Request(cfg.Subjects().Recover("ops-agent-42"), []byte(`{"name":"`+h.Name+`"}`), time.Second)
	require.True(t, errors.Is(err, nats.ErrNoResponders), "%v", err)
	require.NoError(t, r.stop(t))
}
