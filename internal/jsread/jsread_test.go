package jsread_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/jsread"
)

// fill creates a memory stream name on subjects t.> (direct gets as
// direct says) and stores n messages, message i (1-based) on
// t.<i%3>.s<i%5> with a header h=<i> and data "m<i>", and deletes
// message 7 and 8. It returns the sequences it left, in order.
func fill(t testing.TB, js jetstream.JetStream, name string, direct bool, n int) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	str, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage, AllowDirect: direct})
	require.NoError(t, err)
	var futs []jetstream.PubAckFuture
	for i := 1; i <= n; i++ {
		m := nats.NewMsg(subjectOf(name, i))
		m.Header.Set("h", fmt.Sprint(i))
		m.Data = []byte(fmt.Sprintf("m%d", i))
		f, err := js.PublishMsgAsync(m)
		require.NoError(t, err)
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	var seqs []uint64
	for i := 1; i <= n; i++ {
		if i == 7 || i == 8 {
			require.NoError(t, str.DeleteMsg(ctx, uint64(i)))
			continue
		}
		seqs = append(seqs, uint64(i))
	}
	return seqs
}

func subjectOf(stream string, i int) string { return fmt.Sprintf("%s.%d.s%d", stream, i%3, i%5) }

// collect reads with r and checks every message against what fill stored.
func collect(t *testing.T, r *jsread.Reader, from, to uint64, filters []string) []uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []uint64
	err := r.Read(ctx, from, to, filters, func(m *jsread.Msg) error {
		i := int(m.Seq)
		assert.Equal(t, subjectOf(r.Stream, i), m.Subject)
		assert.Equal(t, fmt.Sprintf("m%d", i), string(m.Data))
		assert.Equal(t, nats.Header{"h": []string{fmt.Sprint(i)}}, m.Header, "the message's own headers alone")
		assert.WithinDuration(t, time.Now(), m.Time, time.Minute)
		got = append(got, m.Seq)
		return nil
	})
	require.NoError(t, err)
	return got
}

// want is what of seqs a read of [from, to] on filters must give.
func want(stream string, seqs []uint64, from, to uint64, filters ...string) []uint64 {
	var out []uint64
	for _, s := range seqs {
		if s < from || s > to {
			continue
		}
		subj := subjectOf(stream, int(s))
		ok := len(filters) == 0
		for _, f := range filters {
			ok = ok || matches(f, subj)
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

func matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range p {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || t != "*" && t != s[i] {
			return false
		}
	}
	return len(p) == len(s)
}

// TestRead reads the same messages both ways, whole and filtered, with
// small batches and windows so that reads take many requests: every
// message in range and on the filters, in order, once, with its subject,
// headers and data.
func TestRead(t *testing.T) {
	e := embedded.StartTest(t)
	const n = 500
	for _, direct := range []bool{false, true} {
		name := map[bool]string{false: "LEADER", true: "DIRECT"}[direct]
		seqs := fill(t, e.JS, name, direct, n)
		ctx := context.Background()
		r, info, err := jsread.Open(ctx, e.JS, name)
		require.NoError(t, err)
		require.Equal(t, direct, r.Direct)
		require.True(t, r.Confirm)
		r.Batch, r.MaxBytes, r.Window = 7, 200, 5
		last := info.State.LastSeq
		for _, tc := range []struct {
			from, to uint64
			filters  []string
		}{
			{1, last, nil},
			{0, math.MaxUint64, nil},
			{5, 9, nil},
			{7, 8, nil}, // deleted
			{1, last, []string{name + ".1.*"}},
			{3, 300, []string{name + ".*.s2"}},
			{1, last, []string{name + ".0.>", name + ".*.s4"}},  // overlapping: each message once
			{1, last, []string{name + ".2.s1", name + ".2.s1"}}, // the same filter twice
			{1, last, []string{name + ".9.*"}},                  // none
			{last + 1, last + 10, nil},
		} {
			got := collect(t, r, tc.from, tc.to, tc.filters)
			assert.Equal(t, want(name, seqs, max(tc.from, 1), tc.to, tc.filters...), got, "%s [%d, %d] %v", name, tc.from, tc.to, tc.filters)
		}
	}
}

// TestReadErrors: fn's error ends the read; a stream that does not exist,
// a direct read of a stream without allow_direct, and bad filters are
// errors that say so.
func TestReadErrors(t *testing.T) {
	e := embedded.StartTest(t)
	fill(t, e.JS, "LEADER", false, 20)
	ctx := context.Background()
	r, _, err := jsread.Open(ctx, e.JS, "LEADER")
	require.NoError(t, err)
	stop := errors.New("stop")
	for _, filters := range [][]string{nil, {"LEADER.>"}, {"LEADER.1.*", "LEADER.2.*"}} {
		n := 0
		err = r.Read(ctx, 1, 20, filters, func(*jsread.Msg) error {
			n++
			if n == 3 {
				return stop
			}
			return nil
		})
		assert.ErrorIs(t, err, stop, "%v", filters)
		assert.Equal(t, 3, n)
	}

	_, _, err = jsread.Open(ctx, e.JS, "NOPE")
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	gone := &jsread.Reader{JS: e.JS, Stream: "NOPE", Timeout: 2 * time.Second}
	err = gone.Read(ctx, 1, 10, nil, func(*jsread.Msg) error { return nil })
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	err = gone.Read(ctx, 1, 10, []string{"a.b", "c.d"}, func(*jsread.Msg) error { return nil })
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound)

	notDirect := &jsread.Reader{JS: e.JS, Stream: "LEADER", Direct: true, Timeout: 2 * time.Second}
	err = notDirect.Read(ctx, 1, 10, nil, func(*jsread.Msg) error { return nil })
	assert.ErrorIs(t, err, jsread.ErrNoDirect)

	err = r.Read(ctx, 1, 10, []string{"", "a..b", "x y"}, func(*jsread.Msg) error { return nil })
	require.Error(t, err)
	for _, f := range []string{`""`, `"a..b"`, `"x y"`} {
		assert.Contains(t, err.Error(), "filter "+f+" is not a subject")
	}
	err = (&jsread.Reader{JS: e.JS, Stream: "A.B"}).Read(ctx, 1, 1, nil, nil)
	assert.ErrorContains(t, err, `Reader.Stream "A.B" is not a stream name`)
}

// TestReadNoAnswer: a get nobody answers (here: a direct get that a
// responder swallows) fails after Timeout, naming the stream.
func TestReadNoAnswer(t *testing.T) {
	e := embedded.StartTest(t)
	fill(t, e.JS, "LEADER", false, 5)
	sub, err := e.NC.Subscribe("$JS.API.DIRECT.GET.LEADER", func(*nats.Msg) {})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	r := &jsread.Reader{JS: e.JS, Stream: "LEADER", Direct: true, Timeout: 300 * time.Millisecond}
	start := time.Now()
	err = r.Read(context.Background(), 1, 5, nil, func(*jsread.Msg) error { return nil })
	assert.ErrorIs(t, err, jsread.ErrNoAnswer)
	assert.ErrorContains(t, err, "stream LEADER")
	assert.Less(t, time.Since(start), 3*time.Second)
}

// TestReadConfirm: direct gets answered by a replica that holds nothing
// (a stand-in that answers every direct get "404", as a replica far
// behind its leader would) do not end a read early: the leader is asked,
// and every message is read. Without Confirm the read ends where the
// replica says.
func TestReadConfirm(t *testing.T) {
	e := embedded.StartTest(t)
	seqs := fill(t, e.JS, "LAGGING", false, 30)
	var asked atomic.Int64
	sub, err := e.NC.Subscribe("$JS.API.DIRECT.GET.LAGGING", func(m *nats.Msg) {
		asked.Add(1)
		r := nats.NewMsg(m.Reply)
		r.Header.Set("Status", "404")
		r.Header.Set("Description", "Message Not Found")
		_ = m.RespondMsg(r)
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	r := &jsread.Reader{JS: e.JS, Stream: "LAGGING", Direct: true, Confirm: true}
	assert.Equal(t, seqs, collect(t, r, 1, 30, nil))
	assert.Equal(t, want("LAGGING", seqs, 1, 30, "LAGGING.1.*"), collect(t, r, 1, 30, []string{"LAGGING.1.*"}))
	assert.Positive(t, asked.Load())
	r.Confirm = false
	assert.Empty(t, collect(t, r, 1, 30, nil))
}

// TestFollow reads what is there, then each message as it is stored, and
// ends with its context.
func TestFollow(t *testing.T) {
	e := embedded.StartTest(t)
	for _, direct := range []bool{false, true} {
		name := map[bool]string{false: "FLEADER", true: "FDIRECT"}[direct]
		fill(t, e.JS, name, direct, 10)
		r, _, err := jsread.Open(context.Background(), e.JS, name)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		got := make(chan uint64, 100)
		done := make(chan error, 1)
		go func() {
			// a long poll: the wake-up subscription brings new messages
			done <- r.Follow(ctx, 9, name+".*.*", time.Hour, func(m *jsread.Msg) error {
				got <- m.Seq
				return nil
			})
		}()
		for _, w := range []uint64{9, 10} {
			assert.Equal(t, w, <-got)
		}
		for i := 11; i <= 13; i++ {
			_, err := e.JS.Publish(ctx, subjectOf(name, i), []byte(fmt.Sprintf("m%d", i)))
			require.NoError(t, err)
			select {
			case s := <-got:
				assert.Equal(t, uint64(i), s)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: message %d not followed", name, i)
			}
		}
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Follow did not end with its context")
		}
	}
}
