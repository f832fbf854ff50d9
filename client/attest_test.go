package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
)

// forger answers every compaction request it sees on the events subject of
// session with forged verdicts published directly on the verdict subjects
// (as an identity allowed to publish there, or a push consumer delivering
// there, would): unsigned, signed by another key, a genuine signature over
// a body changed afterwards, and a verdict the processor's key signed for
// another session copied onto this session's subject.
type forger struct {
	nc      *nats.Conn
	key     *attest.Signer // the processor's
	other   *attest.Signer
	session string
	sent    chan int // how many were sent for a request
}

func (f *forger) start(t *testing.T) {
	t.Helper()
	sub, err := f.nc.Subscribe("seamguard.events."+f.session, func(m *nats.Msg) {
		ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, events.Subjects{})
		if err != nil {
			return
		}
		req, ok := ev.Body.(*events.CompactionRequested)
		if !ok {
			return
		}
		allowed := func(session string) []byte {
			_, _, body, err := events.Encoder{}.Encode(events.Output{Type: events.TypeCompactionAllowed, Session: session,
				Cause: events.Cause{ID: ev.ID, Source: ev.Source},
				Data:  &events.CompactionAllowed{RequestID: req.RequestID, Head: 99, TailStart: 0}})
			if err != nil {
				panic(err)
			}
			return body
		}
		subject := "seamguard.verdicts." + f.session + ".allowed"
		body := allowed(f.session)
		var failed error // the connection closed under a late request: the test has ended
		send := func(data []byte, h nats.Header) {
			if failed == nil {
				failed = f.nc.PublishMsg(&nats.Msg{Subject: subject, Data: data, Header: h})
			}
		}
		send(body, nats.Header{})
		h := nats.Header{}
		f.other.SignMsg(h, body)
		send(body, h)
		h = nats.Header{}
		f.key.SignMsg(h, body)
		send([]byte(strings.Replace(string(body), `"head":99`, `"head":98`, 1)), h)
		elsewhere := allowed("another-session")
		h = nats.Header{}
		f.key.SignMsg(h, elsewhere)
		send(elsewhere, h)
		if failed == nil {
			select {
			case f.sent <- 4:
			default: // nobody counts requests past the test's
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, f.nc.Flush())
}

// TestForgedVerdictsAreNotAnswers: forged verdicts that reach the client
// before the processor's are each reported, none is taken for the
// answer, and the genuine verdict that follows is returned, trusted.
func TestForgedVerdictsAreNotAnswers(t *testing.T) {
	key, err := attest.Generate()
	require.NoError(t, err)
	other, err := attest.Generate()
	require.NoError(t, err)
	cfg := processorConfig()
	cfg.SigningKey = string(key.Seed())
	sg, err := startSeamguard(cfg, false) // the processor runs once the forgeries are in
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sg.Close()) })
	ctx := testContext(t)

	f := &forger{nc: sg.nc, key: key, other: other, session: "forged", sent: make(chan int, 4)}
	f.start(t)
	var mu sync.Mutex
	var reported []client.Unattributed
	c, err := client.New(sg.nc, client.Config{TrustedKeys: []string{key.PublicKey()}, OnUnattributed: func(u client.Unattributed) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, u)
	}})
	require.NoError(t, err)
	s, err := c.Open(ctx, client.SessionConfig{ID: "forged", Span: 2})
	require.NoError(t, err)
	for range 4 {
		_, err := s.Append(ctx, client.Turn{Content: "x"})
		require.NoError(t, err)
	}
	type result struct {
		v   *client.Verdict
		err error
	}
	got := make(chan result, 1)
	go func() {
		v, err := s.RequestCompaction(ctx, events.CompactionRequested{
			SummarizerInput: events.Range{Start: 0, End: 4}, SummaryRange: events.Range{Start: 0, End: 2}, TailStart: 2})
		got <- result{v, err}
	}()
	select {
	case <-f.sent:
	case <-ctx.Done():
		t.Fatal("the forger saw no request")
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(reported) == 4 }, 10*time.Second, 10*time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("a forged verdict was taken for the answer: %+v, %v", r.v, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	sg.Run()
	r := <-got
	require.NoError(t, r.err)
	assert.True(t, r.v.Trusted)
	assert.Equal(t, key.PublicKey(), r.v.Signer)
	assert.Equal(t, uint64(4), r.v.Allowed().Head, "the processor's verdict, not a forged one")
	require.Len(t, r.v.Unattributed, 4, "every forgery claimed to answer the request")

	mu.Lock()
	defer mu.Unlock()
	var reasons []string
	for _, u := range reported {
		require.ErrorIs(t, u.Err, client.ErrUnattributed)
		require.Equal(t, "seamguard.verdicts.forged.allowed", u.Subject)
		require.NotNil(t, u.Claims)
		reasons = append(reasons, attest.Reason(u.Err))
	}
	assert.Equal(t, []string{attest.ReasonUnsigned, attest.ReasonUntrusted, attest.ReasonBadSignature, attest.ReasonMisrouted}, reasons)
}

// TestOnlyForgedVerdicts: when only forgeries come, the wait ends with
// ErrNoVerdict, and the error says that messages failed verification.
// Without trusted keys, the one signed by another key is taken (Trusted
// false): the reason to configure TrustedKeys.
func TestOnlyForgedVerdicts(t *testing.T) {
	key, err := attest.Generate()
	require.NoError(t, err)
	other, err := attest.Generate()
	require.NoError(t, err)
	cfg := processorConfig()
	cfg.SigningKey = string(key.Seed())
	sg, err := startSeamguard(cfg, false) // no processor at all
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sg.Close()) })
	ctx := testContext(t)
	f := &forger{nc: sg.nc, key: key, other: other, session: "only-forged", sent: make(chan int, 4)}
	f.start(t)

	request := func(c *client.Client, within time.Duration) (*client.Verdict, error) {
		s, err := c.Open(ctx, client.SessionConfig{ID: "only-forged", Span: 2})
		require.NoError(t, err)
		rctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		return s.RequestCompaction(rctx, events.CompactionRequested{
			SummarizerInput: events.Range{Start: 0, End: 0}, SummaryRange: events.Range{Start: 0, End: 0}, TailStart: 0})
	}
	trusting, err := client.New(sg.nc, client.Config{TrustedKeys: []string{key.PublicKey()}})
	require.NoError(t, err)
	_, err = request(trusting, 2*time.Second)
	require.ErrorIs(t, err, client.ErrNoVerdict)
	require.ErrorIs(t, err, client.ErrUnattributed)
	require.ErrorIs(t, err, attest.ErrUnsigned, "the first forgery is unsigned")
	assert.Contains(t, err.Error(), "4 message(s) claiming to answer it failed verification")

	open, err := client.New(sg.nc, client.Config{})
	require.NoError(t, err)
	v, err := request(open, 10*time.Second)
	require.NoError(t, err)
	assert.False(t, v.Trusted)
	assert.Equal(t, other.PublicKey(), v.Signer)
	require.Len(t, v.Unattributed, 1)
	assert.True(t, errors.Is(v.Unattributed[0].Err, attest.ErrUnsigned))

	_, err = client.New(sg.nc, client.Config{TrustedKeys: []string{string(key.Seed())}})
	require.ErrorIs(t, err, attest.ErrKey, "a seed is no trusted key")
}
