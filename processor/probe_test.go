package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/jsread"
)

// testProcessor provisions a processor of two partitions under prefix
// on a server of its own, without running it.
func testProcessor(t *testing.T, prefix string) (*embedded.Test, *Processor, context.Context) {
	t.Helper()
	e := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	p, err := New(ctx, e.JS, Config{Prefix: prefix, Partitions: 2})
	require.NoError(t, err)
	return e, p, ctx
}

// TestFindNext: a lookup answered by a real server reads the message whole
// when asked, and otherwise its subject and sequence alone; nothing found
// is nil; a position a catch-up comes to apply is read again whole.
func TestFindNext(t *testing.T) {
	e, p, ctx := testProcessor(t, "fn")
	pub := func(session, body string) uint64 {
		t.Helper()
		m := nats.NewMsg(p.subj.Events(session))
		m.Header.Set("ce-id", body)
		m.Data = []byte(body)
		ack, err := e.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
		return ack.Sequence
	}
	a1 := pub("a", "first of a")
	pub("b", "first of b")
	a2 := pub("a", "second of a")
	filter := p.subj.SessionFilters("a")[0]

	for _, whole := range []bool{true, false} {
		raw, position, err := p.findNext(ctx, a1+1, filter, func(uint64) bool { return whole })
		require.NoError(t, err)
		require.Equal(t, !whole, position)
		require.Equal(t, a2, raw.Sequence)
		require.Equal(t, p.subj.Stored("a"), raw.Subject)
		if whole {
			want, err := jsread.LeaderGet(ctx, e.JS.Conn(), p.cfg.Names().Events, a2, "")
			require.NoError(t, err)
			require.Equal(t, want.Data, raw.Data)
			require.Equal(t, want.Header, raw.Header)
			require.Equal(t, want.Time, raw.Time)
		} else {
			require.Nil(t, raw.Data)
			require.Nil(t, raw.Header)
		}
	}
	raw, _, err := p.findNext(ctx, a2+1, filter, func(uint64) bool { return true })
	require.NoError(t, err)
	require.Nil(t, raw, "nothing after the last")
	raw, _, err = p.findNext(ctx, a2+1, filter, func(uint64) bool { return false })
	require.NoError(t, err)
	require.Nil(t, raw)

	// A position read ahead and then applied is read again, whole.
	pf := &prefetch{lookups: map[string][]span{filter: {{from: 1, msg: &jetstream.RawStreamMsg{Subject: p.subj.Stored("a"), Sequence: a1}, position: true}}}}
	r := p.reader([]string{filter})
	r.pre = pf
	got, err := r.next(ctx, nil, 1)
	require.NoError(t, err)
	require.Equal(t, a1, got.Sequence)
	require.Nil(t, got.Data)
	got, err = r.whole(ctx, nil, got)
	require.NoError(t, err)
	require.Equal(t, []byte("first of a"), got.Data)
	require.Equal(t, "first of a", got.Header.Get("ce-id"))
	again, err := r.whole(ctx, nil, got)
	require.NoError(t, err)
	require.Same(t, got, again, "whole already")
}

// FuzzPositionOf: the position read from an answer in the server's form is
// the message's subject and sequence, whatever its headers and body; an
// answer it cannot read that way (an error, an escaped subject, anything
// else) is errPositionAnswer, never a wrong position.
func FuzzPositionOf(f *testing.F) {
	f.Add("seamguard.partitioned.1.events.s-1", uint64(7), []byte("NATS/1.0\r\nce-id: x\r\n\r\n"), []byte(`{"seq":3,"subject":"no"}`), false)
	f.Add("a.b", uint64(1), []byte(nil), []byte(nil), false)
	f.Add("odd<&>\"\\", uint64(42), []byte("h"), []byte("d"), false)
	f.Add("a.b", uint64(9), []byte(nil), []byte(nil), true)
	f.Fuzz(func(t *testing.T, subject string, seq uint64, hdrs, data []byte, asError bool) {
		type stored struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs,omitempty"`
			Data    []byte    `json:"data,omitempty"`
			Time    time.Time `json:"time"`
		}
		type apiErr struct {
			Code        int    `json:"code"`
			ErrCode     uint16 `json:"err_code"`
			Description string `json:"description"`
		}
		resp := struct {
			Type    string  `json:"type"`
			Error   *apiErr `json:"error,omitempty"`
			Message *stored `json:"message,omitempty"`
		}{Type: "io.nats.jetstream.api.v1.stream_msg_get_response"}
		if asError {
			resp.Error = &apiErr{Code: 404, ErrCode: 10037, Description: subject}
		} else {
			resp.Message = &stored{Subject: subject, Seq: seq, Header: hdrs, Data: data, Time: time.Unix(0, 0).UTC()}
		}
		b, err := json.Marshal(resp)
		require.NoError(t, err)
		gotSubj, gotSeq, err := positionOf(b)
		if err != nil {
			require.ErrorIs(t, err, errPositionAnswer)
			if !asError && seq != 0 {
				i := bytes.Index(b, []byte(`"subject":"`))
				end := bytes.Index(b[i:], []byte(`","seq"`))
				require.True(t, end > len(`"subject":"`) && bytes.Contains(b[i:i+end], []byte(`\`)) || subject == "",
					"only an escaped or empty subject is read the general way: %s", b)
			}
			return
		}
		require.False(t, asError, "an error answer has no position")
		require.Equal(t, subject, gotSubj)
		require.Equal(t, seq, gotSeq)
		if _, herr := nats.DecodeHeadersMsg(hdrs); len(hdrs) == 0 || herr == nil {
			raw, err := decodeMsgGet("S", b)
			require.NoError(t, err)
			require.Equal(t, gotSubj, raw.Subject, "the general way reads the same")
			require.Equal(t, gotSeq, raw.Sequence)
		}
	})
}
