package deploy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/forward"
	"github.com/seamguard/seamguard/processor"
)

// TestForwarderPermissions runs seamguard's forwarder as the shipped
// forwarder identity against deploy/nats/standalone.conf: it creates its
// consumer and the undeliverable stream, delivers a verdict, keeps one the
// receiver refuses, lists it and delivers it again, without one
// permissions violation; and it cannot publish verdicts, events or control
// messages, write state, read the events, or create, change or delete
// anything else.
func TestForwarderPermissions(t *testing.T) {
	s := startStandalone(t)
	proc := connect(t, s, "processor", processorPassword)
	proc.allowed(t, "provision", func(ctx context.Context) error {
		_, err := processor.Provision(ctx, proc.js, processor.Config{})
		return err
	})
	key, err := attest.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ver, err := attest.NewVerifier(events.Subjects{}, key.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	verdict := func(session string) []byte {
		id, subject, body, err := events.Encoder{}.Encode(events.Output{Type: events.TypeSessionHalted, Session: session,
			Cause: events.Cause{ID: "in-" + session, Source: "urn:test"}, Data: &events.SessionHalted{RequestID: "r1", Message: "halted"}})
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(subject)
		m.Data = body
		key.SignMsg(m.Header, body)
		proc.allowed(t, "publish a verdict", func(ctx context.Context) error {
			_, err := proc.js.PublishMsg(ctx, m, jetstream.WithMsgID(id))
			return err
		})
		return body
	}
	body := verdict("ok")
	verdict("bad")

	var mu sync.Mutex
	refuse := true
	var got []string
	r := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if refuse && req.Header.Get("Ce-Subject") == "bad" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		got = append(got, req.Header.Get("Ce-Subject"))
		w.WriteHeader(http.StatusOK)
	}))
	defer r.Close()

	fwd := connectWith(t, s, "forwarder", forwarderPassword, "_INBOX_forwarder")
	fwd.allowed(t, "forward, keep the refused verdict, list it and deliver it again", func(ctx context.Context) error {
		f, err := forward.New(ctx, fwd.js, forward.Config{To: r.URL, From: "start", MinBackoff: 10 * time.Millisecond},
			forward.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), forward.WithVerifier(ver))
		if err != nil {
			return err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(rctx) }()
		for f.Stats().Delivered < 1 || f.Stats().Kept < 1 {
			if ctx.Err() != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			return err
		}
		if st := f.Stats(); st.Delivered != 1 || st.Kept != 1 {
			t.Errorf("delivered %d, kept %d; want 1 and 1", st.Delivered, st.Kept)
		}
		u, err := forward.OpenUndeliverable(ctx, fwd.js, "", false, 0)
		if err != nil {
			return err
		}
		recs, err := u.List(ctx, "")
		if err != nil {
			return err
		}
		if len(recs) != 1 || recs[0].Session != "bad" || recs[0].Status != 422 {
			t.Errorf("kept %+v; want the verdict of session bad, status 422", recs)
			return nil
		}
		mu.Lock()
		refuse = false
		mu.Unlock()
		return u.Redeliver(ctx, nil, ver, recs[0], "", nil)
	})
	mu.Lock()
	if len(got) != 2 || got[0] != "ok" || got[1] != "bad" {
		t.Errorf("the receiver got %v; want [ok bad]", got)
	}
	mu.Unlock()

	for _, tc := range []struct {
		what, subject string
		op            func(ctx context.Context) error
	}{
		{"publish a verdict", "seamguard.verdicts.ok.halted", func(ctx context.Context) error {
			return fwd.nc.Publish("seamguard.verdicts.ok.halted", body)
		}},
		{"publish an event", "seamguard.events.ok", func(ctx context.Context) error { return fwd.nc.Publish("seamguard.events.ok", []byte("{}")) }},
		{"publish a resume", "seamguard.control.ok", func(ctx context.Context) error { return fwd.nc.Publish("seamguard.control.ok", []byte("{}")) }},
		{"write a session's state", "$KV.seamguard-sessions.ok", func(ctx context.Context) error {
			return fwd.nc.Publish("$KV.seamguard-sessions.ok", []byte("{}"))
		}},
		{"write a spill", "$O.seamguard-spills.", func(ctx context.Context) error { return fwd.nc.Publish("$O.seamguard-spills.C.x", []byte("x")) }},
		{"read the events stream", "$JS.API.STREAM.INFO.SEAMGUARD_EVENTS", func(ctx context.Context) error {
			_, err := fwd.js.Stream(ctx, "SEAMGUARD_EVENTS")
			return err
		}},
		{"read an event", "$JS.API.STREAM.MSG.GET.SEAMGUARD_EVENTS", func(ctx context.Context) error {
			return fwd.nc.Publish("$JS.API.STREAM.MSG.GET.SEAMGUARD_EVENTS", []byte(`{"seq":1}`))
		}},
		{"consume the events stream", "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS", func(ctx context.Context) error {
			_, err := fwd.js.CreateConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.ConsumerConfig{Durable: "x"})
			return err
		}},
		{"delete the processor's consumer", "$JS.API.CONSUMER.DELETE.SEAMGUARD_EVENTS", func(ctx context.Context) error {
			return fwd.js.DeleteConsumer(ctx, "SEAMGUARD_EVENTS", "seamguard-p0")
		}},
		{"delete a verdict consumer", "$JS.API.CONSUMER.DELETE.SEAMGUARD_VERDICTS", func(ctx context.Context) error {
			return fwd.js.DeleteConsumer(ctx, "SEAMGUARD_VERDICTS", "x")
		}},
		{"change the verdict stream", "$JS.API.STREAM.UPDATE.SEAMGUARD_VERDICTS", func(ctx context.Context) error {
			_, err := fwd.js.UpdateStream(ctx, jetstream.StreamConfig{Name: "SEAMGUARD_VERDICTS", Subjects: []string{"seamguard.verdicts.>"}})
			return err
		}},
		{"read verdicts by sequence", "$JS.API.STREAM.MSG.GET.SEAMGUARD_VERDICTS", func(ctx context.Context) error {
			return fwd.nc.Publish("$JS.API.STREAM.MSG.GET.SEAMGUARD_VERDICTS", []byte(`{"seq":1}`))
		}},
		{"create another stream", "$JS.API.STREAM.CREATE.OTHER", func(ctx context.Context) error {
			_, err := fwd.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
			return err
		}},
		{"delete the undeliverable stream", "$JS.API.STREAM.DELETE.SEAMGUARD_UNDELIVERABLE", func(ctx context.Context) error {
			return fwd.js.DeleteStream(ctx, "SEAMGUARD_UNDELIVERABLE")
		}},
		{"purge the undeliverable stream", "$JS.API.STREAM.PURGE.SEAMGUARD_UNDELIVERABLE", func(ctx context.Context) error {
			return fwd.nc.Publish("$JS.API.STREAM.PURGE.SEAMGUARD_UNDELIVERABLE", nil)
		}},
		{"listen to verdicts as published", "seamguard.verdicts.>", func(ctx context.Context) error {
			_, err := fwd.nc.SubscribeSync("seamguard.verdicts.>")
			return err
		}},
		{"read the processor's inbox", "_INBOX_processor.>", func(ctx context.Context) error {
			_, err := fwd.nc.SubscribeSync("_INBOX_processor.>")
			return err
		}},
		{"read the agents' inbox", "_INBOX.>", func(ctx context.Context) error {
			_, err := fwd.nc.SubscribeSync("_INBOX.>")
			return err
		}},
	} {
		fwd.denied(t, tc.what, tc.subject, false, tc.op)
	}
}
