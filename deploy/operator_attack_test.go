package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/processor"
)

// The push-consumer attack: an identity that may create a consumer on a
// stream may create a push consumer, and a push consumer's deliver subject
// is in the request's body, where subject permissions cannot reach. The
// server then delivers the stream's messages there on that identity's
// behalf: onto a verdict subject, where the verdict stream stores them as
// verdicts. An operator, who may publish on the control subject, could so
// publish a forged verdict there and have the server deliver it into the
// verdict stream. The shipped operator may create no consumer at all.

// oldOperatorPermissions is the operator's block as it was shipped when
// operators read with ordered consumers (its allow list, and the deny list
// without the names of the processor's consumers): the fixture that shows
// the attack works, and so that its test can fail.
const oldOperatorPermissions = `OPERATOR_PERMISSIONS: {
  publish: {
    allow: [
      "$JS.API.STREAM.INFO.SEAMGUARD_EVENTS", "$JS.API.STREAM.MSG.GET.SEAMGUARD_EVENTS"
      "$JS.API.STREAM.INFO.SEAMGUARD_VERDICTS", "$JS.API.STREAM.MSG.GET.SEAMGUARD_VERDICTS"
      "$JS.API.STREAM.INFO.OBJ_seamguard-spills"
      "$JS.API.DIRECT.GET.OBJ_seamguard-spills.>"
      "$JS.API.CONSUMER.CREATE.SEAMGUARD_VERDICTS.>", "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_VERDICTS.*"
      "$JS.API.CONSUMER.DELETE.SEAMGUARD_VERDICTS.*"
      "$JS.API.CONSUMER.CREATE.OBJ_seamguard-spills.>", "$JS.API.CONSUMER.MSG.NEXT.OBJ_seamguard-spills.*"
      "$JS.API.CONSUMER.INFO.OBJ_seamguard-spills.*", "$JS.API.CONSUMER.DELETE.OBJ_seamguard-spills.*"
      "$JS.API.STREAM.INFO.KV_seamguard-sessions", "$JS.API.DIRECT.GET.KV_seamguard-sessions.>"
      "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS.*", "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS.*"
      "$JS.API.CONSUMER.DELETE.SEAMGUARD_EVENTS.*"
      "$JS.FC.OBJ_seamguard-spills.>", "$JS.FC.*.*.OBJ_seamguard-spills.>"
      "seamguard.control.>"
      "$SRV.>"
    ]
    deny: ["seamguard.events.>", "seamguard.verdicts.>", "$KV.>", "$O.>", "$JS.ACK.>"]
  }
  subscribe: {
    allow: ["_INBOX_operator.>", "seamguard.verdicts.>"]
    deny: ["seamguard.events.>", "$KV.>", "$O.>"]
  }
}`

// startWithOperatorBlock runs deploy/nats/standalone.conf with the
// shipped accounts and permissions, except that the operator's block is
// block.
func startWithOperatorBlock(t *testing.T, block string) *server.Server {
	t.Helper()
	setPasswords(t)
	dir := t.TempDir()
	for _, name := range []string{"standalone.conf", "accounts.conf", "permissions.conf"} {
		b, err := os.ReadFile(filepath.Join("nats", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "permissions.conf" {
			b = []byte(replaceBlock(t, string(b), "OPERATOR_PERMISSIONS: {", block))
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "standalone.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.HTTPPort = 0
	return startServer(t, opts)
}

// replaceBlock replaces the block of conf that starts with start, up to
// its matching closing brace, with block.
func replaceBlock(t *testing.T, conf, start, block string) string {
	t.Helper()
	i := strings.Index(conf, start)
	if i < 0 {
		t.Fatalf("no %q in the configuration", start)
	}
	depth := 0
	for j := i; j < len(conf); j++ {
		switch conf[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return conf[:i] + block + conf[j+1:]
			}
		}
	}
	t.Fatalf("%q has no closing brace", start)
	return ""
}

// consumerRequest is the body of a consumer create request.
func consumerRequest(stream string, cfg map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"stream_name": stream, "config": cfg})
	return b
}

// attackTarget is a stream the operator may read, and the subject of
// messages on it that it would have delivered as verdicts.
type attackTarget struct {
	stream, filter string
	// cycle: the stream stores the deliver subject itself, so the server
	// refuses such a consumer on its own (only the permissions are tried)
	cycle bool
}

// TestOperatorPushConsumerAttack: the shipped operator can create no
// consumer, push or pull, durable or ephemeral, named or not, on any
// stream it reads; the verdict stream holds nothing new and the streams no
// consumer. With the operator's old permissions the same push consumers
// are created, and the verdict stream stores what they deliver: a forged
// verdict the operator published on the control subject, and a spill's
// chunk. (On the verdict stream itself the server refuses a consumer that
// delivers into the stream, a cycle; the permissions are checked first.)
func TestOperatorPushConsumerAttack(t *testing.T) {
	t.Run("shipped", func(t *testing.T) {
		testPushConsumerAttack(t, startStandalone(t), false)
	})
	t.Run("old operator permissions", func(t *testing.T) {
		testPushConsumerAttack(t, startWithOperatorBlock(t, oldOperatorPermissions), true)
	})
}

func testPushConsumerAttack(t *testing.T, s *server.Server, succeeds bool) {
	proc := connect(t, s, "processor", processorPassword)
	agent := connect(t, s, "agent", agentPassword)
	op := connect(t, s, "operator", operatorPassword)

	var res *processor.Resources
	proc.allowed(t, "provision", func(ctx context.Context) error {
		var err error
		res, err = processor.Provision(ctx, proc.js, processor.Config{})
		return err
	})
	if res == nil {
		t.FailNow()
	}
	proc.allowed(t, "store a verdict and a spill", func(ctx context.Context) error {
		if _, err := proc.js.Publish(ctx, "seamguard.verdicts.s1.refused", []byte(`{"verdict":1}`)); err != nil {
			return err
		}
		_, err := res.Spills.PutBytes(ctx, "s1/1.jsonl", []byte("a spill\n"))
		return err
	})
	agent.allowed(t, "publish an event", func(ctx context.Context) error {
		_, err := agent.js.Publish(ctx, "seamguard.events.s1", []byte(`{"event":1}`))
		return err
	})
	forged := []byte(`{"specversion":"1.0","type":"io.seamguard.compaction.allowed","source":"urn:seamguard:forged","id":"forged-1","subject":"s1","data":{"request_id":"k1"}}`)
	op.allowed(t, "publish on the control subject", func(ctx context.Context) error {
		_, err := op.js.Publish(ctx, "seamguard.control.s1", forged)
		return err
	})
	stored := proc.msgs(t, "SEAMGUARD_VERDICTS")

	const deliverTo = "seamguard.verdicts.s1.allowed"
	// A push consumer delivers while someone listens on its deliver
	// subject: the operator may listen to verdicts.
	listen, err := op.nc.SubscribeSync(deliverTo)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Unsubscribe()
	targets := []attackTarget{
		{"SEAMGUARD_EVENTS", processor.Config{}.Subjects().StoredControl("s1"), false},
		{"SEAMGUARD_VERDICTS", "seamguard.verdicts.s1.refused", true},
		{"OBJ_seamguard-spills", "$O.seamguard-spills.C.>", false},
	}
	for _, tg := range targets {
		push := func(name string) map[string]any {
			cfg := map[string]any{"deliver_subject": deliverTo, "ack_policy": "none", "deliver_policy": "all", "filter_subjects": []string{tg.filter}}
			if name != "" {
				cfg["name"] = name
			}
			return cfg
		}
		named := "$JS.API.CONSUMER.CREATE." + tg.stream + ".evil"
		if succeeds && !tg.cycle {
			// The old permissions let the operator create a push consumer
			// of any name that delivers onto a verdict subject.
			op.allowed(t, "create a push consumer on "+tg.stream+" delivering to "+deliverTo, func(ctx context.Context) error {
				return consumerCreated(ctx, op.nc, named, consumerRequest(tg.stream, push("evil")))
			})
			continue
		}
		if succeeds {
			continue
		}
		for _, a := range []struct {
			what, subject string
			body          []byte
		}{
			{"a named push consumer", named, consumerRequest(tg.stream, push("evil"))},
			{"a named push consumer with its filter in the subject", named + "." + tg.filter, consumerRequest(tg.stream, push("evil"))},
			{"an ephemeral push consumer", "$JS.API.CONSUMER.CREATE." + tg.stream, consumerRequest(tg.stream, push(""))},
			{"a durable push consumer (the legacy subject)", "$JS.API.CONSUMER.DURABLE.CREATE." + tg.stream + ".evil", consumerRequest(tg.stream, map[string]any{"durable_name": "evil", "deliver_subject": deliverTo, "ack_policy": "none"})},
			{"a pull consumer", "$JS.API.CONSUMER.CREATE." + tg.stream + ".reader", consumerRequest(tg.stream, map[string]any{"name": "reader", "ack_policy": "none"})},
		} {
			op.denied(t, "create "+a.what+" on "+tg.stream, "$JS.API.CONSUMER.", true, func(ctx context.Context) error {
				return consumerCreated(ctx, op.nc, a.subject, a.body)
			})
		}
		op.denied(t, "create an ordered consumer on "+tg.stream+" with nats.go", "$JS.API.CONSUMER.CREATE."+tg.stream, true, func(ctx context.Context) error {
			_, err := op.js.OrderedConsumer(ctx, tg.stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{tg.filter}})
			return err
		})
	}

	if !succeeds {
		// Give a consumer that was created time to deliver; then nothing
		// new in the verdict stream, and no consumer anywhere.
		time.Sleep(500 * time.Millisecond)
		if n := proc.msgs(t, "SEAMGUARD_VERDICTS"); n != stored {
			t.Errorf("the verdict stream went from %d to %d messages", stored, n)
		}
		for _, tg := range targets {
			if n := consumers(t, proc, tg.stream); n != 0 {
				t.Errorf("stream %s has %d consumer(s)", tg.stream, n)
			}
		}
		return
	}

	// The server delivered each stream's message onto the verdict subject,
	// and the verdict stream stored it as a verdict.
	var delivered []attackTarget
	for _, tg := range targets {
		if !tg.cycle {
			delivered = append(delivered, tg)
		}
	}
	want := stored + uint64(len(delivered))
	deadline := time.Now().Add(10 * time.Second)
	for proc.msgs(t, "SEAMGUARD_VERDICTS") < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, err := readAll(ctx, proc.js, "SEAMGUARD_VERDICTS")
	if err != nil {
		t.Fatalf("read the verdict stream: %v", err)
	}
	// The server stores a delivered message under the subject it had in
	// the stream it came from (seamguard.partitioned.<p>.control.s1, $O.<bucket>.C.<nuid>),
	// which is not even one of the verdict stream's subjects: whole-stream
	// readers (replay) find it among the verdicts.
	var smuggled int
	for _, m := range msgs {
		if bytes.Equal(m.Data(), forged) || bytes.Equal(m.Data(), []byte("a spill\n")) {
			smuggled++
			t.Logf("stored in SEAMGUARD_VERDICTS by the operator's push consumer: %s %q", m.Subject(), m.Data())
		}
	}
	if smuggled != len(delivered) {
		t.Fatalf("the verdict stream holds %d message(s) the operator's push consumers delivered, want %d (one a stream): the attack did not work as shown", smuggled, len(delivered))
	}
}

// consumerCreated sends a consumer create request and returns nil if the
// server created the consumer.
func consumerCreated(ctx context.Context, nc *nats.Conn, subject string, body []byte) error {
	m, err := nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return err
	}
	var resp struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("%s: %s", subject, resp.Error.Description)
	}
	return nil
}

// consumers is how many consumers stream has, as its info says.
func consumers(t *testing.T, c *client, stream string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return s.CachedInfo().State.Consumers
}
