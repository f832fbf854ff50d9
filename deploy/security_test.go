package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	sgclient "github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// These tests load the shipped configuration into real in-process
// nats-servers on loopback and use it the way the processor, agents and
// operators do, with nats.go's jetstream package: every allowed operation
// must succeed without a single permissions violation, every denied one must
// be refused by the server naming the subject.

// serverLog records what the server logs, shown when a test fails.
type serverLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *serverLog) add(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, level+" "+fmt.Sprintf(format, v...))
}
func (l *serverLog) Noticef(format string, v ...any) {}
func (l *serverLog) Warnf(format string, v ...any)   { l.add("WRN", format, v...) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.add("FTL", format, v...) }
func (l *serverLog) Errorf(format string, v ...any)  { l.add("ERR", format, v...) }
func (l *serverLog) Debugf(format string, v ...any)  {}
func (l *serverLog) Tracef(format string, v ...any)  {}

// startServer starts opts on loopback with storage in a temporary directory
// and stops it when the test ends.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host = "127.0.0.1"
	opts.Port = server.RANDOM_PORT
	opts.HTTPHost = "127.0.0.1"
	if opts.HTTPPort != 0 {
		opts.HTTPPort = server.RANDOM_PORT
	}
	opts.StoreDir = t.TempDir()
	opts.NoSigs = true
	opts.NoLog = true
	opts.LameDuckDuration = 0
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	log := &serverLog{}
	s.SetLogger(log, false, false)
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
		if t.Failed() {
			log.mu.Lock()
			defer log.mu.Unlock()
			for _, l := range log.lines {
				t.Logf("server %s: %s", opts.ServerName, l)
			}
		}
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("server %s not ready", opts.ServerName)
	}
	return s
}

// startStandalone runs deploy/nats/standalone.conf, with the server's
// feature flags set (e.g. js_ack_fc_v2).
func startStandalone(t *testing.T, featureFlags ...string) *server.Server {
	t.Helper()
	setPasswords(t)
	opts := natsConfig(t, "standalone.conf", nil)
	opts.HTTPPort = 0
	opts.Cluster = server.ClusterOpts{}
	opts.Routes = nil
	for _, f := range featureFlags {
		if opts.FeatureFlags == nil {
			opts.FeatureFlags = map[string]bool{}
		}
		opts.FeatureFlags[f] = true
	}
	return startServer(t, opts)
}

// client is one identity's connection.
type client struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error // asynchronous errors: permissions violations
}

// inboxes are the inbox prefixes of the shipped identities: seamguard
// serve's and the CLI's defaults; agents keep NATS's _INBOX.
var inboxes = map[string]string{"processor": "_INBOX_processor", "operator": "_INBOX_operator"}

// connect connects as user, with the identity's own inbox prefix.
func connect(t *testing.T, s *server.Server, user, password string) *client {
	t.Helper()
	return connectWith(t, s, user, password, inboxes[user])
}

// connectWith connects as user with the given inbox prefix ("": _INBOX).
func connectWith(t *testing.T, s *server.Server, user, password, inbox string) *client {
	t.Helper()
	c := &client{user: user, errs: make(chan error, 256)}
	opts := []nats.Option{nats.UserInfo(user, password), nats.Name(user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		})}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *client) drain() {
	for {
		select {
		case <-c.errs:
		default:
			return
		}
	}
}

// allowed runs op, which must succeed without any permissions violation.
func (c *client) allowed(t *testing.T, what string, op func(ctx context.Context) error) {
	t.Helper()
	c.drain()
	before := c.nc.LastError()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := op(ctx); err != nil {
		t.Errorf("%s as %s: %v", what, c.user, err)
	}
	// A round trip: an -ERR for anything op sent is processed before the PONG.
	if err := c.nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush as %s: %v", c.user, err)
	}
	if after := c.nc.LastError(); after != before && after != nil {
		t.Errorf("%s as %s: %v", what, c.user, after)
	}
	select {
	case err := <-c.errs:
		t.Errorf("%s as %s: %v", what, c.user, err)
	case <-time.After(20 * time.Millisecond):
	}
}

// denied runs op and expects the server to refuse a publish or subscription
// on a subject starting with subject. When opFails is set, op must also
// return an error (a request whose publish was dropped never gets a reply).
func (c *client) denied(t *testing.T, what, subject string, opFails bool, op func(ctx context.Context) error) {
	t.Helper()
	c.drain()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	var violation error
	timeout := time.After(5 * time.Second)
wait:
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `to "`+subject) {
				violation = err
				break wait
			}
		case <-timeout:
			break wait
		}
	}
	cancel() // a refused request would wait for its reply forever
	err := <-done
	if violation == nil {
		t.Errorf("%s as %s: the server reported no permissions violation on %s… (op returned %v)", what, c.user, subject, err)
	}
	if opFails && err == nil {
		t.Errorf("%s as %s succeeded", what, c.user)
	}
}

func (c *client) msgs(t *testing.T, stream string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s as %s: %v", stream, c.user, err)
	}
	return s.CachedInfo().State.Msgs
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

const spillName = "s1/1.jsonl"

// TestPermissions is the security matrix of deploy/nats/accounts.conf, with
// the acknowledgement and flow-control subjects of today's servers
// ($JS.ACK.<stream>.<consumer>.…) and with the v2 format a server may be
// switched to ($JS.ACK.<domain>.<account hash>.<stream>.…).
func TestPermissions(t *testing.T) {
	t.Run("v1 ack subjects", func(t *testing.T) { testPermissions(t) })
	t.Run("v2 ack subjects", func(t *testing.T) { testPermissions(t, "js_ack_fc_v2") })
}

func testPermissions(t *testing.T, featureFlags ...string) {
	s := startStandalone(t, featureFlags...)
	proc := connect(t, s, "processor", processorPassword)
	resp := connect(t, s, "responder", responderPassword)
	agent := connect(t, s, "agent", agentPassword)
	op := connect(t, s, "operator", operatorPassword)

	// A spill of 24 chunks (the default chunk is 128 KiB) and then some:
	// over 1 MiB unacknowledged, a push consumer asks for flow control.
	spillData := randomBytes(t, 24*128<<10+4321)
	var res *processor.Resources
	var agentVerdicts *nats.Subscription

	t.Run("processor", func(t *testing.T) {
		proc.allowed(t, "provision streams, bucket and object store", func(ctx context.Context) error {
			var err error
			res, err = processor.Provision(ctx, proc.js, processor.Config{})
			return err
		})
		if res == nil {
			t.FailNow()
		}
		proc.allowed(t, "provision again (checks and updates)", func(ctx context.Context) error {
			_, err := processor.Provision(ctx, proc.js, processor.Config{Replicas: 1, EventsMaxAge: 48 * time.Hour, VerdictsMaxAge: 30 * 24 * time.Hour})
			return err
		})
		agent.allowed(t, "subscribe to verdicts", func(ctx context.Context) error {
			var err error
			agentVerdicts, err = agent.nc.SubscribeSync("seamguard.verdicts.>")
			return err
		})
		proc.allowed(t, "publish a verdict", func(ctx context.Context) error {
			ack, err := proc.js.Publish(ctx, "seamguard.verdicts.s1.allowed", []byte(`{"verdict":1}`), jetstream.WithMsgID("v1"), jetstream.WithExpectStream("SEAMGUARD_VERDICTS"))
			if err == nil && ack.Stream != "SEAMGUARD_VERDICTS" {
				err = fmt.Errorf("stored in %s", ack.Stream)
			}
			return err
		})
		proc.allowed(t, "put a spill", func(ctx context.Context) error {
			_, err := res.Spills.Put(ctx, jetstream.ObjectMeta{Name: spillName}, bytes.NewReader(spillData))
			return err
		})
		proc.allowed(t, "replace a spill (purges the old chunks)", func(ctx context.Context) error {
			if _, err := res.Spills.PutBytes(ctx, "s1/0.jsonl", []byte("old")); err != nil {
				return err
			}
			_, err := res.Spills.PutBytes(ctx, "s1/0.jsonl", []byte("new"))
			return err
		})
		proc.allowed(t, "read a spill back as the spill verifier does", func(ctx context.Context) error {
			var buf bytes.Buffer
			st := &spill.Store{JS: proc.js, Stream: "SEAMGUARD_EVENTS", Bucket: "seamguard-spills"}
			if _, err := st.Get(ctx, spillName, &buf); err != nil {
				return err
			}
			if !bytes.Equal(buf.Bytes(), spillData) {
				return errors.New("read back other bytes")
			}
			return nil
		})
		proc.allowed(t, "store session state with compare-and-swap", func(ctx context.Context) error {
			rev, err := res.Sessions.Create(ctx, "s1", []byte("state-1"))
			if err != nil {
				return err
			}
			if _, err := res.Sessions.Update(ctx, "s1", []byte("state-2"), rev); err != nil {
				return err
			}
			if _, err := res.Sessions.Update(ctx, "s1", []byte("stale"), rev); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				return fmt.Errorf("a stale update: %v, want ErrKeyRevisionMismatch", err)
			}
			e, err := res.Sessions.Get(ctx, "s1")
			if err == nil && string(e.Value()) != "state-2" {
				err = fmt.Errorf("read %q", e.Value())
			}
			return err
		})
		if m, err := agentVerdicts.NextMsg(5 * time.Second); err != nil || m.Subject != "seamguard.verdicts.s1.allowed" {
			t.Errorf("the agent's verdict subscription got %v, %v", m, err)
		}
	})
	if res == nil {
		t.FailNow()
	}

	t.Run("agent", func(t *testing.T) {
		agent.allowed(t, "publish an event with a JetStream ack", func(ctx context.Context) error {
			ack, err := agent.js.Publish(ctx, "seamguard.events.s1", []byte(`{"event":1}`), jetstream.WithMsgID("e1"))
			if err == nil && ack.Stream != "SEAMGUARD_EVENTS" {
				err = fmt.Errorf("stored in %s", ack.Stream)
			}
			return err
		})
		verdicts := proc.msgs(t, "SEAMGUARD_VERDICTS")
		agent.denied(t, "publish a verdict", "seamguard.verdicts.s1.allowed", false, func(ctx context.Context) error {
			return agent.nc.Publish("seamguard.verdicts.s1.allowed", []byte(`{"forged":true}`))
		})
		agent.denied(t, "publish a verdict with a JetStream ack", "seamguard.verdicts.s1.refused", true, func(ctx context.Context) error {
			_, err := agent.js.Publish(ctx, "seamguard.verdicts.s1.refused", []byte(`{"forged":true}`))
			return err
		})
		if n := proc.msgs(t, "SEAMGUARD_VERDICTS"); n != verdicts {
			t.Errorf("the verdict stream went from %d to %d messages", verdicts, n)
		}
		agent.denied(t, "subscribe to everyone's events", "seamguard.events.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("seamguard.events.>")
			return err
		})
		agent.denied(t, "publish a resume on the control subject", "seamguard.control.s1", true, func(ctx context.Context) error {
			_, err := agent.js.Publish(ctx, "seamguard.control.s1", []byte(`{"resume":true}`))
			return err
		})
		agent.denied(t, "subscribe to control subjects", "seamguard.control.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("seamguard.control.>")
			return err
		})
		agent.denied(t, "open the spill object store", "$JS.API.STREAM.INFO.OBJ_seamguard-spills", true, func(ctx context.Context) error {
			_, err := agent.js.ObjectStore(ctx, "seamguard-spills")
			return err
		})
		meta := "$O.seamguard-spills.M." + base64.URLEncoding.EncodeToString([]byte(spillName))
		agent.denied(t, "read a spill's info by direct get", "$JS.API.DIRECT.GET.OBJ_seamguard-spills", true, func(ctx context.Context) error {
			_, err := agent.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.OBJ_seamguard-spills."+meta, nil)
			return err
		})
		agent.denied(t, "read spill chunks with a consumer", "$JS.API.CONSUMER.CREATE.OBJ_seamguard-spills", true, func(ctx context.Context) error {
			_, err := agent.js.OrderedConsumer(ctx, "OBJ_seamguard-spills", jetstream.OrderedConsumerConfig{})
			return err
		})
		agent.denied(t, "subscribe to spill subjects", "$O.seamguard-spills.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("$O.seamguard-spills.>")
			return err
		})
		agent.denied(t, "open the session bucket", "$JS.API.STREAM.INFO.KV_seamguard-sessions", true, func(ctx context.Context) error {
			_, err := agent.js.KeyValue(ctx, "seamguard-sessions")
			return err
		})
		agent.denied(t, "write session state", "$KV.seamguard-sessions.s1", false, func(ctx context.Context) error {
			return agent.nc.Publish("$KV.seamguard-sessions.s1", []byte("forged"))
		})
		agent.denied(t, "write a spill chunk", "$O.seamguard-spills.C.", false, func(ctx context.Context) error {
			return agent.nc.Publish("$O.seamguard-spills.C.forged", []byte("forged"))
		})
		agent.denied(t, "any JetStream API call", "$JS.API.INFO", true, func(ctx context.Context) error {
			_, err := agent.js.AccountInfo(ctx)
			return err
		})
		agent.denied(t, "delete the events stream", "$JS.API.STREAM.DELETE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			return agent.js.DeleteStream(ctx, "SEAMGUARD_EVENTS")
		})
		proc.allowed(t, "check the session state is untouched", func(ctx context.Context) error {
			e, err := res.Sessions.Get(ctx, "s1")
			if err == nil && string(e.Value()) != "state-2" {
				err = fmt.Errorf("session state is now %q", e.Value())
			}
			return err
		})
	})

	t.Run("processor consumes", func(t *testing.T) {
		// As processor.Run does: a durable consumer per partition.
		cfg := processor.Config{}
		subj := cfg.Subjects()
		part := subj.Partition("s1")
		stored := subj.Stored("s1")
		var cons jetstream.Consumer
		proc.allowed(t, "create the partition's durable consumer", func(ctx context.Context) error {
			var err error
			cons, err = partitionConsumer(ctx, proc.js, part)
			return err
		})
		if cons == nil {
			t.FailNow()
		}
		proc.allowed(t, "fetch and acknowledge an event", func(ctx context.Context) error {
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return err
			}
			n := 0
			for m := range batch.Messages() {
				n++
				if m.Subject() != stored {
					return fmt.Errorf("got %s, want %s", m.Subject(), stored)
				}
				if err := m.DoubleAck(ctx); err != nil {
					return fmt.Errorf("ack: %w", err)
				}
			}
			if n != 1 {
				return fmt.Errorf("fetched %d messages (%v)", n, batch.Error())
			}
			return nil
		})
		proc.allowed(t, "read an event by sequence for a catch-up", func(ctx context.Context) error {
			_, err := res.Events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(stored))
			return err
		})
		proc.allowed(t, "read a session's events with an ordered consumer, then delete it", func(ctx context.Context) error {
			oc, err := proc.js.OrderedConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.OrderedConsumerConfig{
				FilterSubjects: []string{stored}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1,
			})
			if err != nil {
				return err
			}
			if _, err := oc.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil {
				return err
			}
			return proc.js.DeleteConsumer(ctx, "SEAMGUARD_EVENTS", oc.CachedInfo().Name)
		})
		proc.allowed(t, "read the verdict stream for a rebuild", func(ctx context.Context) error {
			oc, err := proc.js.OrderedConsumer(ctx, "SEAMGUARD_VERDICTS", jetstream.OrderedConsumerConfig{})
			if err != nil {
				return err
			}
			_, err = oc.Next(jetstream.FetchMaxWait(5 * time.Second))
			return err
		})
		proc.denied(t, "publish a resume", "seamguard.control.s1", false, func(ctx context.Context) error {
			return proc.nc.Publish("seamguard.control.s1", []byte(`{"resume":true}`))
		})
		proc.denied(t, "publish an event", "seamguard.events.s1", false, func(ctx context.Context) error {
			return proc.nc.Publish("seamguard.events.s1", []byte(`{"made":"up"}`))
		})
		proc.denied(t, "delete the events stream", "$JS.API.STREAM.DELETE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			return proc.js.DeleteStream(ctx, "SEAMGUARD_EVENTS")
		})
	})

	t.Run("recover service", func(t *testing.T) {
		// As the processor's recover service does, on serve's responder
		// connection: a queue subscription on every session's recover
		// subject, micro's discovery subjects, and a reply to each request
		// (to the requester's inbox, which the responder may publish to).
		proc.denied(t, "serve recover requests (that is the responder's)", "seamguard.recover.*", false, func(ctx context.Context) error {
			_, err := proc.nc.QueueSubscribe("seamguard.recover.*", "seamguard", func(*nats.Msg) {})
			return err
		})
		resp.allowed(t, "serve recover requests in the queue group", func(ctx context.Context) error {
			_, err := resp.nc.QueueSubscribe("seamguard.recover.*", "seamguard", func(m *nats.Msg) {
				_ = m.Respond([]byte("answer to " + m.Subject))
			})
			return err
		})
		resp.allowed(t, "answer micro's discovery", func(ctx context.Context) error {
			_, err := resp.nc.Subscribe("$SRV.>", func(m *nats.Msg) {
				_ = m.Respond([]byte(`{"name":"seamguard","type":"io.nats.micro.v1.ping_response"}`))
			})
			return err
		})
		resp.allowed(t, "answer an agent's request", func(ctx context.Context) error {
			agent.allowed(t, "request a spill from the recover service", func(ctx context.Context) error {
				m, err := agent.nc.RequestWithContext(ctx, "seamguard.recover.s1", []byte(`{"name":"s1/1.jsonl"}`))
				if err == nil && string(m.Data) != "answer to seamguard.recover.s1" {
					err = fmt.Errorf("answered %q", m.Data)
				}
				return err
			})
			return nil
		})
		resp.allowed(t, "answer an operator's discovery", func(ctx context.Context) error {
			op.allowed(t, "find the services (nats micro ls)", func(ctx context.Context) error {
				_, err := op.nc.RequestWithContext(ctx, "$SRV.PING", nil)
				return err
			})
			return nil
		})
		agent.denied(t, "subscribe to the recover requests", "seamguard.recover.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("seamguard.recover.>")
			return err
		})
		agent.denied(t, "subscribe to micro's discovery", "$SRV.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("$SRV.>")
			return err
		})
		agent.denied(t, "ask micro's discovery", "$SRV.PING", true, func(ctx context.Context) error {
			_, err := agent.nc.RequestWithContext(ctx, "$SRV.PING", nil)
			return err
		})
		op.denied(t, "subscribe to the recover requests", "seamguard.recover.>", false, func(ctx context.Context) error {
			_, err := op.nc.SubscribeSync("seamguard.recover.>")
			return err
		})
		proc.denied(t, "make a recover request", "seamguard.recover.s1", true, func(ctx context.Context) error {
			_, err := proc.nc.RequestWithContext(ctx, "seamguard.recover.s1", []byte(`{"name":"s1/1.jsonl"}`))
			return err
		})
		proc.denied(t, "publish to an inbox nobody asked it to answer", "_INBOX.forged", false, func(ctx context.Context) error {
			return proc.nc.Publish("_INBOX.forged", []byte("unasked"))
		})
	})

	t.Run("operator", func(t *testing.T) {
		var obs jetstream.ObjectStore
		op.allowed(t, "open the spill object store", func(ctx context.Context) error {
			var err error
			obs, err = op.js.ObjectStore(ctx, "seamguard-spills")
			return err
		})
		if obs == nil {
			t.FailNow()
		}
		op.allowed(t, "read a spill's info", func(ctx context.Context) error {
			info, err := obs.GetInfo(ctx, spillName)
			if err == nil && info.Size != uint64(len(spillData)) {
				err = fmt.Errorf("size %d", info.Size)
			}
			return err
		})
		op.denied(t, "read a spill with ObjectStore.Get (a push consumer)", "$JS.API.CONSUMER.CREATE.OBJ_seamguard-spills", true, func(ctx context.Context) error {
			r, err := obs.Get(ctx, spillName)
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = io.ReadAll(r)
			return err
		})
		op.allowed(t, "read a spill as seamguard spill get does", func(ctx context.Context) error {
			var buf bytes.Buffer
			st := &spill.Store{JS: op.js, Stream: "SEAMGUARD_EVENTS", Bucket: "seamguard-spills"}
			if _, err := st.Get(ctx, spillName, &buf); err != nil {
				return err
			}
			if !bytes.Equal(buf.Bytes(), spillData) {
				return errors.New("read back other bytes")
			}
			return nil
		})
		op.allowed(t, "follow verdicts as seamguard watch does (batched direct gets)", func(ctx context.Context) error {
			r, _, err := jsread.Open(ctx, op.js, "SEAMGUARD_VERDICTS")
			if err != nil {
				return err
			}
			if !r.Direct {
				return errors.New("the verdict stream does not allow direct gets")
			}
			fctx, stop := context.WithCancel(ctx)
			defer stop()
			var got string
			err = r.Follow(fctx, 1, "seamguard.verdicts.*.*", 0, func(m *jsread.Msg) error {
				got = m.Subject
				stop()
				return nil
			})
			if err == nil && got != "seamguard.verdicts.s1.allowed" {
				err = fmt.Errorf("got %q", got)
			}
			return err
		})
		op.denied(t, "follow verdicts with an ordered consumer", "$JS.API.CONSUMER.CREATE.SEAMGUARD_VERDICTS", true, func(ctx context.Context) error {
			_, err := op.js.OrderedConsumer(ctx, "SEAMGUARD_VERDICTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"seamguard.verdicts.*.*"}})
			return err
		})
		op.allowed(t, "look up a rejected input by stream sequence, from the stream's leader", func(ctx context.Context) error {
			m, err := jsread.LeaderGet(ctx, op.nc, "SEAMGUARD_EVENTS", 1, "")
			if err == nil && (m == nil || !strings.HasSuffix(m.Subject, ".s1")) {
				err = fmt.Errorf("got %+v", m)
			}
			return err
		})
		op.denied(t, "look up an input by direct get (the processor's alone)", "$JS.API.DIRECT.GET.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			s, err := op.js.Stream(ctx, "SEAMGUARD_EVENTS")
			if err != nil {
				return err
			}
			_, err = s.GetMsg(ctx, 1)
			return err
		})
		op.allowed(t, "look up a verdict by stream sequence", func(ctx context.Context) error {
			s, err := op.js.Stream(ctx, "SEAMGUARD_VERDICTS")
			if err != nil {
				return err
			}
			_, err = s.GetMsg(ctx, 1)
			return err
		})
		var live *nats.Subscription
		op.allowed(t, "subscribe to verdicts as they are published", func(ctx context.Context) error {
			var err error
			live, err = op.nc.SubscribeSync("seamguard.verdicts.*.refused")
			return err
		})
		proc.allowed(t, "publish another verdict", func(ctx context.Context) error {
			_, err := proc.js.Publish(ctx, "seamguard.verdicts.s1.refused", []byte(`{"verdict":2}`), jetstream.WithMsgID("v2"))
			return err
		})
		if live != nil {
			if m, err := live.NextMsg(5 * time.Second); err != nil || m.Subject != "seamguard.verdicts.s1.refused" {
				t.Errorf("the operator's verdict subscription got %v, %v", m, err)
			}
		}
		op.allowed(t, "publish session.resumed on the control subject", func(ctx context.Context) error {
			m := nats.NewMsg("seamguard.control.s1")
			m.Header.Set("Content-Type", "application/cloudevents+json")
			m.Data = []byte(`{"specversion":"1.0","id":"resume-1","source":"urn:seamguard:operator:test","type":"io.seamguard.session.resumed","subject":"s1","data":{"note":"test"}}`)
			ack, err := op.js.PublishMsg(ctx, m, jetstream.WithMsgID("resume-1"))
			if err == nil && ack.Stream != "SEAMGUARD_EVENTS" {
				err = fmt.Errorf("stored in %s", ack.Stream)
			}
			return err
		})
		verdicts := proc.msgs(t, "SEAMGUARD_VERDICTS")
		op.denied(t, "publish a verdict", "seamguard.verdicts.s1.allowed", false, func(ctx context.Context) error {
			return op.nc.Publish("seamguard.verdicts.s1.allowed", []byte(`{"forged":true}`))
		})
		op.denied(t, "publish a verdict with a JetStream ack", "seamguard.verdicts.s1.halted", true, func(ctx context.Context) error {
			_, err := op.js.Publish(ctx, "seamguard.verdicts.s1.halted", []byte(`{"forged":true}`))
			return err
		})
		if n := proc.msgs(t, "SEAMGUARD_VERDICTS"); n != verdicts {
			t.Errorf("the verdict stream went from %d to %d messages", verdicts, n)
		}
		op.denied(t, "put a spill", "$O.seamguard-spills.C.", true, func(ctx context.Context) error {
			_, err := obs.PutBytes(ctx, "s1/2.jsonl", []byte("forged"))
			return err
		})
		op.denied(t, "overwrite a spill", "$O.seamguard-spills.C.", true, func(ctx context.Context) error {
			_, err := obs.PutBytes(ctx, spillName, []byte("forged"))
			return err
		})
		op.denied(t, "delete a spill", "$O.seamguard-spills.M.", true, func(ctx context.Context) error {
			return obs.Delete(ctx, spillName)
		})
		op.denied(t, "purge the spills", "$JS.API.STREAM.PURGE.OBJ_seamguard-spills", true, func(ctx context.Context) error {
			st, err := op.js.Stream(ctx, "OBJ_seamguard-spills")
			if err != nil {
				return err
			}
			return st.Purge(ctx)
		})
		proc.allowed(t, "check the spill is intact", func(ctx context.Context) error {
			info, err := res.Spills.GetInfo(ctx, spillName)
			if err == nil && (info.Size != uint64(len(spillData)) || info.Deleted) {
				err = fmt.Errorf("spill is now %d bytes, deleted %v", info.Size, info.Deleted)
			}
			if _, err := res.Spills.GetInfo(ctx, "s1/2.jsonl"); !errors.Is(err, jetstream.ErrObjectNotFound) {
				return fmt.Errorf("the operator's put left an object: %v", err)
			}
			return err
		})
		// The session bucket, read only (seamguard inspect, replay).
		var sessions jetstream.KeyValue
		op.allowed(t, "open the session bucket and read a session's snapshot, as seamguard inspect does", func(ctx context.Context) error {
			var err error
			if sessions, err = op.js.KeyValue(ctx, "seamguard-sessions"); err != nil {
				return err
			}
			e, err := sessions.Get(ctx, "s1")
			if err == nil && string(e.Value()) != "state-2" {
				err = fmt.Errorf("read %q", e.Value())
			}
			return err
		})
		if sessions == nil {
			t.FailNow()
		}
		op.denied(t, "write a session's state", "$KV.seamguard-sessions.s1", true, func(ctx context.Context) error {
			_, err := sessions.Put(ctx, "s1", []byte("forged"))
			return err
		})
		op.denied(t, "delete a session's state", "$KV.seamguard-sessions.s1", true, func(ctx context.Context) error {
			return sessions.Delete(ctx, "s1")
		})
		op.denied(t, "purge the session bucket", "$JS.API.STREAM.PURGE.KV_seamguard-sessions", true, func(ctx context.Context) error {
			st, err := op.js.Stream(ctx, "KV_seamguard-sessions")
			if err != nil {
				return err
			}
			return st.Purge(ctx)
		})
		op.denied(t, "change the session bucket", "$JS.API.STREAM.UPDATE.KV_seamguard-sessions", true, func(ctx context.Context) error {
			st, err := op.js.Stream(ctx, "KV_seamguard-sessions")
			if err != nil {
				return err
			}
			cfg := st.CachedInfo().Config
			cfg.MaxAge = time.Minute
			_, err = op.js.UpdateStream(ctx, cfg)
			return err
		})
		proc.allowed(t, "check the session state is untouched", func(ctx context.Context) error {
			e, err := res.Sessions.Get(ctx, "s1")
			if err == nil && string(e.Value()) != "state-2" {
				err = fmt.Errorf("session state is now %q", e.Value())
			}
			return err
		})

		// The events, with the leader's STREAM.MSG.GET (seamguard inspect
		// --rebuild, replay): a session's two subjects, or everything. The
		// events stream allows direct gets (the processor's lookups), which
		// the operator's tools do not use.
		evSubj := processor.Config{}.Subjects()
		op.allowed(t, "read a session's events and control messages, as seamguard inspect --rebuild does", func(ctx context.Context) error {
			r, info, err := jsread.Open(ctx, op.js, "SEAMGUARD_EVENTS")
			if err != nil {
				return err
			}
			if !r.Direct {
				return errors.New("the events stream does not allow direct gets")
			}
			r.Direct = false // as inspect reads it
			n := 0
			err = r.Read(ctx, 1, info.State.LastSeq, evSubj.SessionFilters("s1"), func(m *jsread.Msg) error {
				n++
				if !strings.HasSuffix(m.Subject, ".s1") {
					return fmt.Errorf("got %s", m.Subject)
				}
				return nil
			})
			if err == nil && n == 0 {
				err = errors.New("read nothing")
			}
			return err
		})
		op.allowed(t, "read the whole events stream, as seamguard replay does", func(ctx context.Context) error {
			r, info, err := jsread.Open(ctx, op.js, "SEAMGUARD_EVENTS")
			if err != nil {
				return err
			}
			r.Direct = false
			var n uint64
			err = r.Read(ctx, 1, info.State.LastSeq, nil, func(*jsread.Msg) error { n++; return nil })
			if err == nil && n != info.State.Msgs {
				err = fmt.Errorf("read %d of %d", n, info.State.Msgs)
			}
			return err
		})
		op.denied(t, "read the events stream with an ordered consumer", "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			_, err := op.js.OrderedConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.OrderedConsumerConfig{})
			return err
		})
		op.denied(t, "create a consumer on the events stream with a filter token in the subject (the CLI's filter on two subjects or none)", "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS.reader.seamguard.partitioned", true, func(ctx context.Context) error {
			_, err := op.js.CreateConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.ConsumerConfig{Name: "reader", FilterSubject: "seamguard.partitioned.*.events.s1", AckPolicy: jetstream.AckNonePolicy})
			return err
		})
		op.denied(t, "create a durable consumer with the legacy subject", "$JS.API.CONSUMER.DURABLE.CREATE.SEAMGUARD_EVENTS.reader", true, func(ctx context.Context) error {
			_, err := op.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.DURABLE.CREATE.SEAMGUARD_EVENTS.reader", []byte(`{"stream_name":"SEAMGUARD_EVENTS","config":{"durable_name":"reader","ack_policy":"none"}}`))
			return err
		})
		op.denied(t, "purge the events stream", "$JS.API.STREAM.PURGE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			str, err := op.js.Stream(ctx, "SEAMGUARD_EVENTS")
			if err != nil {
				return err
			}
			return str.Purge(ctx)
		})
		op.denied(t, "delete an event", "$JS.API.STREAM.MSG.DELETE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			str, err := op.js.Stream(ctx, "SEAMGUARD_EVENTS")
			if err != nil {
				return err
			}
			return str.DeleteMsg(ctx, 1)
		})
		op.denied(t, "change the events stream", "$JS.API.STREAM.UPDATE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
			cfg := res.Events.CachedInfo().Config
			cfg.MaxAge = time.Minute
			_, err := op.js.UpdateStream(ctx, cfg)
			return err
		})
		pc := processor.Config{}.ConsumerName(processor.Config{}.Subjects().Partition("s1"))
		op.denied(t, "replace the processor's consumer (name only in the subject, as an ordered consumer's)", "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS."+pc, true, func(ctx context.Context) error {
			_, err := op.js.CreateOrUpdateConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.ConsumerConfig{
				Name: pc, FilterSubjects: []string{"seamguard.partitioned.*.events.s1", "seamguard.partitioned.*.control.s1"}, AckPolicy: jetstream.AckNonePolicy,
			})
			return err
		})
		op.denied(t, "look at the processor's consumer", "$JS.API.CONSUMER.INFO.SEAMGUARD_EVENTS."+pc, true, func(ctx context.Context) error {
			_, err := op.js.Consumer(ctx, "SEAMGUARD_EVENTS", pc)
			return err
		})
		op.denied(t, "pull from the processor's consumer", "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS."+pc, true, func(ctx context.Context) error {
			_, err := op.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS."+pc, []byte(`{"batch":1,"no_wait":true,"group":"seamguard"}`))
			return err
		})
		op.denied(t, "delete the processor's consumer", "$JS.API.CONSUMER.DELETE.SEAMGUARD_EVENTS."+pc, true, func(ctx context.Context) error {
			return op.js.DeleteConsumer(ctx, "SEAMGUARD_EVENTS", pc)
		})
		op.denied(t, "delete the verdict stream", "$JS.API.STREAM.DELETE.SEAMGUARD_VERDICTS", true, func(ctx context.Context) error {
			return op.js.DeleteStream(ctx, "SEAMGUARD_VERDICTS")
		})
		op.denied(t, "subscribe to everyone's events", "seamguard.events.>", false, func(ctx context.Context) error {
			_, err := op.nc.SubscribeSync("seamguard.events.>")
			return err
		})
		op.denied(t, "publish an event", "seamguard.events.s1", true, func(ctx context.Context) error {
			_, err := op.js.Publish(ctx, "seamguard.events.s1", []byte(`{"event":1}`))
			return err
		})
		op.denied(t, "subscribe to the processor's inbox", "_INBOX_processor.>", false, func(ctx context.Context) error {
			_, err := op.nc.SubscribeSync("_INBOX_processor.>")
			return err
		})
		op.denied(t, "subscribe to the agents' inbox", "_INBOX.>", false, func(ctx context.Context) error {
			_, err := op.nc.SubscribeSync("_INBOX.>")
			return err
		})
	})

	t.Run("inboxes", func(t *testing.T) {
		// Each identity reads its own replies only: with the default
		// prefix, the processor and the operator cannot even make a
		// request, and an agent cannot listen where they are answered.
		for _, who := range []struct{ user, password string }{{"processor", processorPassword}, {"operator", operatorPassword}} {
			c := connectWith(t, s, who.user, who.password, "")
			c.denied(t, "read a stream's info with the agents' inbox", "_INBOX.", true, func(ctx context.Context) error {
				_, err := c.js.Stream(ctx, "SEAMGUARD_VERDICTS")
				return err
			})
		}
		agent.denied(t, "subscribe to the processor's inbox", "_INBOX_processor.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("_INBOX_processor.>")
			return err
		})
		agent.denied(t, "subscribe to the operator's inbox", "_INBOX_operator.>", false, func(ctx context.Context) error {
			_, err := agent.nc.SubscribeSync("_INBOX_operator.>")
			return err
		})
		sneak := connectWith(t, s, "agent", agentPassword, "_INBOX_processor")
		sneak.denied(t, "read replies with the processor's inbox prefix", "_INBOX_processor.", true, func(ctx context.Context) error {
			_, err := sneak.js.Publish(ctx, "seamguard.events.s1", []byte(`{"event":2}`))
			return err
		})
	})
}

// TestProcessorEndToEnd runs the real processor as the processor identity
// on the seed story, published by an agent: its verdicts, spill, snapshots
// and acks must need nothing the configuration denies, and the operator
// must be able to read back the spill it wrote.
func TestProcessorEndToEnd(t *testing.T) {
	s := startStandalone(t)
	proc := connect(t, s, "processor", processorPassword)
	agent := connect(t, s, "agent", agentPassword)
	op := connect(t, s, "operator", operatorPassword)
	resp := connect(t, s, "responder", responderPassword)

	stop := runProcessor(t, proc, processor.Config{SpillVerify: true}, processor.WithResponder(resp.nc))

	story := readLines(t, filepath.Join(root, "testdata", "stories", "seed-story.jsonl"))
	golden := readLines(t, filepath.Join(root, "testdata", "stories", "golden", "seed-story.out.jsonl"))
	agent.allowed(t, "publish the seed story", func(ctx context.Context) error {
		for _, line := range story {
			var e struct{ ID, Subject string }
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				return err
			}
			m := nats.NewMsg("seamguard.events." + e.Subject)
			m.Header.Set("Content-Type", "application/cloudevents+json")
			m.Data = []byte(line)
			if _, err := agent.js.PublishMsg(ctx, m, jetstream.WithMsgID(e.ID)); err != nil {
				return err
			}
		}
		return nil
	})

	deadline := time.Now().Add(60 * time.Second)
	for proc.msgs(t, "SEAMGUARD_VERDICTS") < uint64(len(golden)) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d verdicts after 60s", proc.msgs(t, "SEAMGUARD_VERDICTS"), len(golden))
		}
		time.Sleep(50 * time.Millisecond)
	}

	var spillHandle events.SpillHandle
	op.allowed(t, "replay the verdicts", func(ctx context.Context) error {
		r, info, err := jsread.Open(ctx, op.js, "SEAMGUARD_VERDICTS")
		if err != nil {
			return err
		}
		var read []*jsread.Msg
		if err := r.Read(ctx, 1, info.State.LastSeq, nil, func(m *jsread.Msg) error { read = append(read, m); return nil }); err != nil {
			return err
		}
		if len(read) < len(golden) {
			return fmt.Errorf("read %d verdicts, want %d", len(read), len(golden))
		}
		for i, want := range golden {
			m := read[i]
			var got, exp struct {
				Type string
				Data json.RawMessage
			}
			if err := json.Unmarshal(m.Data, &got); err != nil {
				return err
			}
			if err := json.Unmarshal([]byte(want), &exp); err != nil {
				return err
			}
			if got.Type != exp.Type {
				return fmt.Errorf("verdict %d is %s, the offline decision says %s", i, got.Type, exp.Type)
			}
			if got.Type == "io.seamguard.transcript.spilled" {
				if err := json.Unmarshal(got.Data, &spillHandle); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if spillHandle.Name == "" {
		t.Fatal("the processor wrote no spill")
	}
	var opRead bytes.Buffer
	op.allowed(t, "read the processor's spill and verify its digest", func(ctx context.Context) error {
		buf := &opRead
		st := &spill.Store{JS: op.js, Stream: "SEAMGUARD_EVENTS", Bucket: spillHandle.Bucket}
		info, err := st.Get(ctx, spillHandle.Name, buf)
		if err != nil {
			return err
		}
		if info.Digest != spillHandle.Digest {
			return fmt.Errorf("digest %s, the verdict says %s", info.Digest, spillHandle.Digest)
		}
		if !bytes.Contains(buf.Bytes(), []byte("Do not touch anything under /etc.")) {
			return errors.New("the spill lacks turn 0")
		}
		return nil
	})
	agent.allowed(t, "recover the same spill through the processor's recover service", func(ctx context.Context) error {
		c, err := sgclient.New(agent.nc, sgclient.Config{})
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if _, err := c.Recover(ctx, "ops-agent-42", spillHandle, &buf); err != nil {
			return err
		}
		if !bytes.Equal(buf.Bytes(), opRead.Bytes()) {
			return fmt.Errorf("recovered %d bytes, the operator read %d", buf.Len(), opRead.Len())
		}
		return nil
	})
	op.allowed(t, "find the recover service (nats micro info seamguard)", func(ctx context.Context) error {
		m, err := op.nc.RequestWithContext(ctx, "$SRV.INFO.seamguard", nil)
		if err == nil && !bytes.Contains(m.Data, []byte(`"subject":"seamguard.recover.*"`)) {
			err = fmt.Errorf("the service's info is %s", m.Data)
		}
		return err
	})

	// The zombie agent: it cannot publish a resume where one counts, and
	// one it publishes on its events subject is rejected, not applied.
	agent.denied(t, "publish a resume on the control subject", "seamguard.control.ops-agent-42", true, func(ctx context.Context) error {
		m := nats.NewMsg("seamguard.control.ops-agent-42")
		m.Header.Set("Content-Type", "application/cloudevents+json")
		m.Data = []byte(`{"specversion":"1.0","id":"zombie-1","source":"urn:agent:zombie","type":"io.seamguard.session.resumed","subject":"ops-agent-42","data":{"note":"waived by myself"}}`)
		_, err := agent.js.PublishMsg(ctx, m)
		return err
	})
	verdicts := proc.msgs(t, "SEAMGUARD_VERDICTS")
	agent.allowed(t, "publish a resume on the events subject", func(ctx context.Context) error {
		m := nats.NewMsg("seamguard.events.ops-agent-42")
		m.Header.Set("Content-Type", "application/cloudevents+json")
		m.Data = []byte(`{"specversion":"1.0","id":"zombie-2","source":"urn:agent:zombie","type":"io.seamguard.session.resumed","subject":"ops-agent-42","data":{"note":"waived by myself"}}`)
		_, err := agent.js.PublishMsg(ctx, m, jetstream.WithMsgID("zombie-2"))
		return err
	})
	deadline = time.Now().Add(30 * time.Second)
	for proc.msgs(t, "SEAMGUARD_VERDICTS") == verdicts {
		if time.Now().After(deadline) {
			t.Fatal("no verdict answered the zombie's resume")
		}
		time.Sleep(50 * time.Millisecond)
	}
	op.allowed(t, "read the answer to the zombie's resume", func(ctx context.Context) error {
		str, err := op.js.Stream(ctx, "SEAMGUARD_VERDICTS")
		if err != nil {
			return err
		}
		m, err := str.GetLastMsgForSubject(ctx, "seamguard.verdicts.ops-agent-42.rejected")
		if err != nil {
			return err
		}
		if !bytes.Contains(m.Data, []byte(`"code":"not_permitted"`)) || !bytes.Contains(m.Data, []byte(`"causationid":"zombie-2"`)) {
			return fmt.Errorf("the answer is %s", m.Data)
		}
		return nil
	})

	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := proc.nc.FlushTimeout(5 * time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		t.Error(err)
	}
	if err := proc.nc.LastError(); err != nil {
		t.Errorf("the processor's connection reported %v", err)
	}
	proc.drain()
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) == 0 {
		t.Fatalf("%s is empty", path)
	}
	return lines
}

// partitionConsumer creates the durable consumer of partition part as
// processor.Run does.
func partitionConsumer(ctx context.Context, js jetstream.JetStream, part int) (jetstream.Consumer, error) {
	return js.CreateOrUpdateConsumer(ctx, "SEAMGUARD_EVENTS", processor.Config{}.ConsumerConfig(part))
}

// TestPartitionedEventsPermissions checks the partitioned events stream
// against the permissions: agents publish on seamguard.events.<session>, the
// stream stores seamguard.partitioned.<p>.events.<session> with p = FNV-32a(session)
// mod 16, the processor consumes each partition through its durable
// seamguard-p<p>, holding the partition's lease in the leases bucket, and
// can hand a partition over; nobody else can touch those consumers or
// leases.
func TestPartitionedEventsPermissions(t *testing.T) {
	s := startStandalone(t)
	proc := connect(t, s, "processor", processorPassword)
	agent := connect(t, s, "agent", agentPassword)
	op := connect(t, s, "operator", operatorPassword)

	cfg := processor.Config{}
	parts := processor.DefaultPartitions
	var res *processor.Resources
	proc.allowed(t, "provision the partitioned events stream", func(ctx context.Context) error {
		var err error
		res, err = processor.Provision(ctx, proc.js, cfg)
		return err
	})
	if res == nil {
		t.FailNow()
	}
	stream := res.Events
	if tr := stream.CachedInfo().Config.SubjectTransform; tr == nil || !strings.Contains(tr.Destination, fmt.Sprintf("{{partition(%d,2)}}", parts)) {
		t.Fatalf("the events stream has transform %+v, want {{partition(%d,2)}}", tr, parts)
	}
	proc.allowed(t, "create a durable consumer per partition", func(ctx context.Context) error {
		for part := range parts {
			if _, err := partitionConsumer(ctx, proc.js, part); err != nil {
				return err
			}
		}
		return nil
	})
	// The leases, as processor.Run keeps them: take, renew, count the
	// instances from the bucket's stream, read, hand over.
	var rev uint64
	proc.allowed(t, "take a partition's lease", func(ctx context.Context) error {
		var err error
		rev, err = res.Leases.Create(ctx, "p3", []byte("instance-a"))
		return err
	})
	proc.allowed(t, "renew it", func(ctx context.Context) error {
		var err error
		rev, err = res.Leases.Update(ctx, "p3", []byte("instance-a"), rev)
		return err
	})
	proc.allowed(t, "announce an instance and count the instances", func(ctx context.Context) error {
		if _, err := res.Leases.Put(ctx, "m.instance-a", []byte("instance-a")); err != nil {
			return err
		}
		str, err := proc.js.Stream(ctx, "KV_seamguard-leases")
		if err != nil {
			return err
		}
		info, err := str.Info(ctx, jetstream.WithSubjectFilter("$KV.seamguard-leases.m.*"))
		if err != nil {
			return err
		}
		if len(info.State.Subjects) != 1 {
			return fmt.Errorf("listed %v", info.State.Subjects)
		}
		_, err = res.Leases.Get(ctx, "m.instance-a")
		return err
	})
	proc.allowed(t, "hand the partition over", func(ctx context.Context) error {
		return res.Leases.Delete(ctx, "p3", jetstream.LastRevision(rev))
	})
	for _, who := range []*client{agent, op} {
		who.denied(t, "take a partition's lease", "$KV.seamguard-leases.p3", false, func(ctx context.Context) error {
			return who.nc.Publish("$KV.seamguard-leases.p3", []byte("forged"))
		})
	}

	sessions := []string{"s1", "ops-agent-42", "b", "a-much-longer-session-id_with_underscores"}
	partitions := map[string]bool{}
	handles := map[string]jetstream.Consumer{}
	for i, sess := range sessions {
		h := fnv.New32a()
		h.Write([]byte(sess))
		part := int(h.Sum32() % uint32(parts))
		name := fmt.Sprintf("seamguard-p%d", part)
		if got := cfg.ConsumerName(cfg.Subjects().Partition(sess)); got != name {
			t.Errorf("session %s: the processor consumes it from %s, FNV-32a mod %d gives %s", sess, got, parts, name)
		}
		partitions[name] = true
		agent.allowed(t, "publish an event of "+sess, func(ctx context.Context) error {
			_, err := agent.js.Publish(ctx, "seamguard.events."+sess, []byte(`{"event":1}`), jetstream.WithMsgID(sess+"-1"))
			return err
		})
		want := fmt.Sprintf("seamguard.partitioned.%d.events.%s", part, sess)
		proc.allowed(t, "read the stored subject", func(ctx context.Context) error {
			m, err := stream.GetMsg(ctx, uint64(i+1))
			if err == nil && m.Subject != want {
				err = fmt.Errorf("stored as %s, want %s (FNV-32a mod %d)", m.Subject, want, parts)
			}
			return err
		})
		proc.allowed(t, "fetch it from "+name+" and acknowledge", func(ctx context.Context) error {
			cons, ok := handles[name]
			if !ok {
				var err error
				if cons, err = proc.js.Consumer(ctx, "SEAMGUARD_EVENTS", name); err != nil {
					return err
				}
				handles[name] = cons
			}
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return err
			}
			n := 0
			for m := range batch.Messages() {
				n++
				if m.Subject() != want {
					return fmt.Errorf("got %s", m.Subject())
				}
				if err := m.Ack(); err != nil {
					return err
				}
			}
			if n != 1 {
				return fmt.Errorf("fetched %d (%v)", n, batch.Error())
			}
			return nil
		})
	}
	p1 := cfg.ConsumerName(cfg.Subjects().Partition("s1"))

	agent.denied(t, "publish on a partition subject", "seamguard.partitioned.3.s1", false, func(ctx context.Context) error {
		return agent.nc.Publish("seamguard.partitioned.3.s1", []byte(`{}`))
	})
	op.denied(t, "pull from a partition consumer", "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS."+p1, true, func(ctx context.Context) error {
		_, err := op.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS."+p1, []byte(`{"batch":1,"no_wait":true}`))
		return err
	})
	op.denied(t, "replace a partition consumer", "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS.seamguard-p0", true, func(ctx context.Context) error {
		_, err := op.js.CreateOrUpdateConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.ConsumerConfig{Durable: "seamguard-p0", FilterSubject: "seamguard.partitioned.0.*"})
		return err
	})

	// The operator reads the partitioned events by get requests, and may
	// create no consumer: neither one of its own nor one named as the
	// processor's (every partition's of the deployment that runs the most,
	// deploy/kubernetes, and seamguard-invalid).
	op.allowed(t, "read the partitioned events by get requests", func(ctx context.Context) error {
		r, info, err := jsread.Open(ctx, op.js, "SEAMGUARD_EVENTS")
		if err != nil {
			return err
		}
		var n int
		err = r.Read(ctx, 1, info.State.LastSeq, []string{"seamguard.partitioned.*.events.s1", "seamguard.partitioned.*.control.s1"}, func(*jsread.Msg) error { n++; return nil })
		if err == nil && n != 1 {
			err = fmt.Errorf("read %d events of s1, want 1", n)
		}
		return err
	})
	op.denied(t, "create a consumer of its own on the events stream", "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS", true, func(ctx context.Context) error {
		_, err := op.js.OrderedConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.OrderedConsumerConfig{})
		return err
	})
	shipped := kubernetesPartitions(t)
	if shipped < parts {
		t.Fatalf("deploy/kubernetes runs %d partitions, fewer than the default %d", shipped, parts)
	}
	names := []string{cfg.ConsumerName(-1)}
	for part := range shipped {
		names = append(names, cfg.ConsumerName(part))
	}
	for _, name := range names {
		op.denied(t, "create or replace the processor's consumer "+name, "$JS.API.CONSUMER.CREATE.SEAMGUARD_EVENTS."+name, true, func(ctx context.Context) error {
			_, err := op.js.CreateOrUpdateConsumer(ctx, "SEAMGUARD_EVENTS", jetstream.ConsumerConfig{
				Name: name, FilterSubjects: []string{"seamguard.partitioned.*.events.s1", "seamguard.partitioned.*.control.s1"}, AckPolicy: jetstream.AckNonePolicy,
			})
			return err
		})
		op.denied(t, "pull from the processor's consumer "+name, "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS."+name, true, func(ctx context.Context) error {
			_, err := op.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT.SEAMGUARD_EVENTS."+name, []byte(`{"batch":1,"no_wait":true}`))
			return err
		})
		op.denied(t, "delete the processor's consumer "+name, "$JS.API.CONSUMER.DELETE.SEAMGUARD_EVENTS."+name, true, func(ctx context.Context) error {
			return op.js.DeleteConsumer(ctx, "SEAMGUARD_EVENTS", name)
		})
	}
	proc.allowed(t, "check the processor's consumers are all there", func(ctx context.Context) error {
		for part := range parts {
			if _, err := proc.js.Consumer(ctx, "SEAMGUARD_EVENTS", cfg.ConsumerName(part)); err != nil {
				return fmt.Errorf("%s: %w", cfg.ConsumerName(part), err)
			}
		}
		return nil
	})
}

// kubernetesPartitions reads SEAMGUARD_PARTITIONS of deploy/kubernetes/configmap.yaml.
func kubernetesPartitions(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("kubernetes", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*SEAMGUARD_PARTITIONS:\s*"?(\d+)"?\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/kubernetes/configmap.yaml sets no SEAMGUARD_PARTITIONS")
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCluster starts the three nodes of docker-compose.yaml from
// deploy/nats/nats-server.conf with the services' own environment (routes
// and ports moved to loopback), connects with seamguard's credentials from
// the compose file, provisions R3 and serves an agent.
func TestCluster(t *testing.T) {
	c := loadCompose(t)
	natsServices, seamguards := composeServices(t, c)
	if len(natsServices) != 3 || len(seamguards) == 0 {
		t.Fatalf("compose services %v and %v", natsServices, seamguards)
	}
	ports := freePorts(t, len(natsServices))
	var servers []*server.Server
	var natsEnv map[string]string
	for i, name := range natsServices {
		env := resolvedEnv(t, c.Services[name])
		natsEnv = env
		var routes []string
		for j := range natsServices {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[j]))
			}
		}
		env["NATS_ROUTES"] = "[" + strings.Join(routes, ", ") + "]"
		opts := natsConfig(t, "nats-server.conf", env)
		opts.Cluster.Host = "127.0.0.1"
		opts.Cluster.Port = ports[i]
		servers = append(servers, startServer(t, opts))
	}

	sg := resolvedEnv(t, c.Services[seamguards[0]])
	proc := connect(t, servers[0], sg["SEAMGUARD_USER"], sg["SEAMGUARD_PASSWORD"])
	replicas, err := strconv.Atoi(sg["SEAMGUARD_REPLICAS"])
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := proc.js.AccountInfo(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the JetStream cluster formed no meta leader in 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	proc.drain()

	var res *processor.Resources
	proc.allowed(t, fmt.Sprintf("provision with %d replicas", replicas), func(ctx context.Context) error {
		var err error
		res, err = processor.Provision(ctx, proc.js, processor.Config{Replicas: replicas})
		return err
	})
	if res == nil {
		t.FailNow()
	}
	if ci := res.Events.CachedInfo().Cluster; ci == nil || len(ci.Replicas)+1 != replicas {
		t.Errorf("the events stream has cluster info %+v, want %d replicas", ci, replicas)
	}
	agent := connect(t, servers[2], "agent", natsEnv["NATS_AGENT_PASSWORD"])
	agent.allowed(t, "publish an event on another node", func(ctx context.Context) error {
		_, err := agent.js.Publish(ctx, "seamguard.events.s1", []byte(`{}`), jetstream.WithMsgID("e1"))
		return err
	})
	for _, s := range servers {
		resp, err := http.Get("http://" + s.MonitorAddr().String() + "/healthz?js-enabled-only=true")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: /healthz?js-enabled-only=true answered %s", s.Name(), resp.Status)
		}
	}
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// TestBcryptPassword: a password variable may hold a bcrypt hash, quoted.
func TestBcryptPassword(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("agent-secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	setPasswords(t)
	t.Setenv("NATS_AGENT_PASSWORD", `"`+string(hash)+`"`)
	opts := natsConfig(t, "standalone.conf", nil)
	opts.HTTPPort = 0
	s := startServer(t, opts)
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("agent", "agent-secret"))
	if err != nil {
		t.Fatalf("agent with the password behind the hash: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("agent", string(hash))); err == nil {
		nc.Close()
		t.Error("the hash itself was accepted as the password")
	}
}

// runProcessor starts a processor as c (which must succeed without a
// permissions violation) and runs it until stop, or the end of the test.
func runProcessor(t *testing.T, c *client, cfg processor.Config, opts ...processor.Option) (stop func() error) {
	t.Helper()
	var p *processor.Processor
	c.allowed(t, "start the processor", func(ctx context.Context) error {
		var err error
		p, err = processor.New(ctx, c.js, cfg, opts...)
		return err
	})
	if p == nil {
		t.FailNow()
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(ctx) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-ran:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("Run did not return 30s after its context ended")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("%s's processor: %v", c.user, err)
		}
	})
	return stop
}
