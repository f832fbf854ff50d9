package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	sgclient "github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// The confused-deputy attack, against each shipped configuration: an agent
// names, as the reply subject of its requests to the processor's recover
// service, a subject it may not publish to itself (the JetStream API,
// the session bucket, another session's control, events and verdict
// subjects), hoping the processor's answer lands there on the processor's
// identity; the operator tries the same with the discovery requests. Two
// layers stop it, and each is shown to stop it alone: the service answers
// only reply subjects inside an inbox prefix (processor
// TestServicesAnswerOnlyInboxes shows the attacks landing with that check
// off), and the identity that answers, responder, may publish to inboxes
// and nothing else. Here a rogue answerer with the responder identity
// replies to every request, as a slip in the code would: the server
// refuses each reply. With allow_responses on an identity that holds
// publish rights (the processor's, before it had a responder), the same
// rogue answers purge, delete and overwrite.

// deputyTargets are the reply subjects of the attack, for a victim
// session the attacker may not touch.
func deputyTargets(victim string) []string {
	return []string{
		"$JS.API.STREAM.PURGE.SEAMGUARD_EVENTS",
		"$JS.API.STREAM.DELETE.OBJ_seamguard-spills",
		"$JS.API.STREAM.DELETE.SEAMGUARD_VERDICTS",
		"$KV.seamguard-sessions." + victim,
		"seamguard.control." + victim,
		"seamguard.events." + victim,
		"seamguard.verdicts." + victim + ".allowed",
	}
}

// effects are what the attack aims at, read with the processor's identity.
type effects struct {
	events, verdicts, spills int64 // messages; -1: the stream is gone
	victimState              bool
}

func readEffects(t *testing.T, proc *client, victim string) effects {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	count := func(name string) int64 {
		str, err := proc.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return -1
		}
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := str.Info(ctx)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return -1
		}
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		return int64(info.State.Msgs)
	}
	e := effects{events: count("SEAMGUARD_EVENTS"), verdicts: count("SEAMGUARD_VERDICTS"), spills: count("OBJ_seamguard-spills")}
	if kv, err := proc.js.KeyValue(ctx, "seamguard-sessions"); err == nil {
		_, err := kv.Get(ctx, victim)
		e.victimState = err == nil
	}
	return e
}

// truncatedSession opens session as the agent c (recovery floor 4
// turns), appends 12 turns and truncates [0, 3) before any summary saw
// them: a compaction that summarizes from turn 3 is then refused.
func truncatedSession(ctx context.Context, c *sgclient.Client, session string) (*sgclient.Session, error) {
	s, err := c.Open(ctx, sgclient.SessionConfig{ID: session, Span: 4})
	if err != nil {
		return nil, err
	}
	for range 12 {
		if _, err := s.Append(ctx, sgclient.Turn{Content: "turn"}); err != nil {
			return nil, err
		}
	}
	return s, s.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget")
}

// truncatedRequest is the compaction truncatedSession's session refuses.
var truncatedRequest = events.CompactionRequested{RequestID: "c1", SummarizerInput: events.Range{Start: 3, End: 12}, SummaryRange: events.Range{Start: 3, End: 8}, TailStart: 8}

// spillOwnSession runs session through a refusal with a spill as an agent
// would, and returns the spill's handle.
func spillOwnSession(t *testing.T, agent *client, session string) events.SpillHandle {
	t.Helper()
	var h events.SpillHandle
	agent.allowed(t, "spill its own session", func(ctx context.Context) error {
		c, err := sgclient.New(agent.nc, sgclient.Config{Source: "urn:agent:" + agent.user})
		if err != nil {
			return err
		}
		s, err := truncatedSession(ctx, c, session)
		if err != nil {
			return err
		}
		v, err := s.RequestCompaction(ctx, truncatedRequest)
		if err != nil {
			return err
		}
		if v.Refused() == nil || v.Refused().Spill == nil {
			return fmt.Errorf("want refused with a spill, got %+v", v)
		}
		h = *v.Refused().Spill
		return nil
	})
	return h
}

// attack sends the agent's reflections (a read of its spill, an empty
// read, a refusal) and the operator's (discovery) for every target.
func attack(t *testing.T, agent, op *client, h events.SpillHandle, session, victim string) {
	t.Helper()
	read, _ := json.Marshal(events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Max: 200})
	empty, _ := json.Marshal(events.RecoverRequest{Op: events.RecoverOpRead, Name: h.Name, Offset: h.Size})
	missing, _ := json.Marshal(events.RecoverRequest{Name: session + "/99.jsonl"})
	for _, target := range deputyTargets(victim) {
		for _, body := range [][]byte{read, empty, missing} {
			if err := agent.nc.PublishMsg(&nats.Msg{Subject: "seamguard.recover." + session, Reply: target, Data: body}); err != nil {
				t.Fatal(err)
			}
		}
		if op != nil {
			for _, subj := range []string{"$SRV.PING", "$SRV.INFO.seamguard", "$SRV.STATS"} {
				if err := op.nc.PublishMsg(&nats.Msg{Subject: subj, Reply: target}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, c := range []*client{agent, op} {
		if c != nil {
			if err := c.nc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// settle waits until a request from the agent has been answered after
// the attacks (each instance answers in order per session), and a little
// more for answers that went elsewhere.
func settle(t *testing.T, agent *client, h events.SpillHandle, session string) {
	t.Helper()
	body, _ := json.Marshal(events.RecoverRequest{Name: h.Name})
	deadline := time.Now().Add(15 * time.Second)
	for {
		m, err := agent.nc.Request("seamguard.recover."+session, body, 5*time.Second)
		if err == nil && m.Header.Get("Nats-Service-Error-Code") == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the recover service no longer answers the agent: %v %v", err, m)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
}

// rogueAnswerer answers every recover request of session and every
// discovery request, to whatever reply subject it names, as c.
func rogueAnswerer(t *testing.T, c *client, session string) {
	t.Helper()
	for _, subj := range []string{"seamguard.recover." + session, "$SRV.>"} {
		if _, err := c.nc.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
			t.Fatalf("%s subscribes to %s: %v", c.user, subj, err)
		}
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// noDeputy runs the attack against a running processor, then again with
// a rogue answerer of identity rogue: nothing the attacker aims at moves.
func noDeputy(t *testing.T, proc, agent, op, rogue *client, session, victim string) {
	t.Helper()
	h := spillOwnSession(t, agent, session)
	before := readEffects(t, proc, victim)
	attack(t, agent, op, h, session, victim)
	settle(t, agent, h, session)
	if after := readEffects(t, proc, victim); after != before {
		t.Fatalf("the processor's answers landed: before %+v, after %+v", before, after)
	}
	rogueAnswerer(t, rogue, session)
	attack(t, agent, op, h, session, victim)
	settle(t, agent, h, session)
	if after := readEffects(t, proc, victim); after != before {
		t.Fatalf("a rogue answerer as %s reached what the agent may not: before %+v, after %+v", rogue.user, before, after)
	}
}

// TestNoDeputyStandalone: deploy/nats as shipped (standalone.conf, the
// same users and permissions as the cluster's). The control: an identity
// with the processor's publish rights and allow_responses, answering as
// the rogue, lets the same attack purge the events stream, delete the
// verdict stream and the spill store, and write another session's state.
func TestNoDeputyStandalone(t *testing.T) {
	setPasswords(t)
	opts := natsConfig(t, "standalone.conf", nil)
	opts.HTTPPort = 0
	// The control identity: the processor's permissions with the service
	// subscriptions and allow_responses, as it had them before the
	// responder took the service over.
	for _, u := range opts.Users {
		if u.Username == "processor" {
			legacy := *u
			legacy.Username, legacy.Password = "legacy", "legacy-test-pw"
			perms := *u.Permissions
			sub := *perms.Subscribe
			sub.Allow = append([]string{"seamguard.recover.>", "$SRV.>"}, sub.Allow...)
			perms.Subscribe = &sub
			perms.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
			legacy.Permissions = &perms
			opts.Users = append(opts.Users, &legacy)
			break
		}
	}
	s := startServer(t, opts)
	proc := connect(t, s, "processor", processorPassword)
	resp := connect(t, s, "responder", responderPassword)
	agent := connect(t, s, "agent", agentPassword)
	op := connect(t, s, "operator", operatorPassword)
	stop := runProcessor(t, proc, processor.Config{SpillVerify: true}, processor.WithResponder(resp.nc))
	// The victim's state exists, so that an overwrite would show.
	victim := "victim-1"
	spillOwnSession(t, agent, victim)
	noDeputy(t, proc, agent, op, connectWith(t, s, "responder", responderPassword, ""), "attacker-1", victim)

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Run("control: allow_responses on the processor's rights", func(t *testing.T) {
		legacy := connectWith(t, s, "legacy", "legacy-test-pw", "_INBOX_processor")
		before := readEffects(t, proc, victim)
		rogueAnswerer(t, legacy, "attacker-1")
		// One request per target: the server counts a delivery to a reply
		// subject already granted against its grant of one response.
		for _, target := range deputyTargets(victim) {
			if err := agent.nc.PublishMsg(&nats.Msg{Subject: "seamguard.recover.attacker-1", Reply: target}); err != nil {
				t.Fatal(err)
			}
		}
		if err := agent.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			after := readEffects(t, proc, victim)
			if after.events < before.events && after.verdicts == -1 && after.spills == -1 {
				break
			}
			if time.Now().After(deadline) {
				var errs []error
				for len(legacy.errs) > 0 {
					errs = append(errs, <-legacy.errs)
				}
				t.Fatalf("the attack did not land through allow_responses: before %+v, after %+v (the answerer's errors: %v)", before, after, errs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestNoDeputyTenants: deploy/tenants as shipped; ACME's agent attacks
// ACME's own streams and sessions (GLOBEX is another account: nothing of
// ACME's reaches it at all).
func TestNoDeputyTenants(t *testing.T) {
	s := startTenants(t)
	proc := connectWith(t, s, "acme-processor", tenantPassword("acme", "processor"), "_INBOX_processor")
	resp := connectWith(t, s, "acme-responder", tenantPassword("acme", "responder"), "")
	agent := connectWith(t, s, "acme-agent", tenantPassword("acme", "agent"), "")
	op := connectWith(t, s, "acme-operator", tenantPassword("acme", "operator"), "_INBOX_operator")
	runProcessor(t, proc, processor.Config{SpillVerify: true}, processor.WithResponder(resp.nc))
	spillOwnSession(t, agent, "victim-1")
	noDeputy(t, proc, agent, op, connectWith(t, s, "acme-responder", tenantPassword("acme", "responder"), ""), "attacker-1", "victim-1")
}

// TestNoDeputyNarrowedAgents: the JWT set-up of deploy/README.md; agent-7,
// narrowed to s-1, attacks s-3, agent-8's session.
func TestNoDeputyNarrowedAgents(t *testing.T) {
	jt := startJWTTenant(t)
	proc := jt.connect(t, "processor", jt.user(t, "processor", jt.account), "_INBOX_processor")
	if err := newJS(t, proc); err != nil {
		t.Fatal(err)
	}
	resp := jt.connect(t, "responder", jt.responder(t), "")
	runProcessor(t, proc, processor.Config{SpillVerify: true}, processor.WithResponder(resp.nc))
	victim := jt.connect(t, "agent-8", jt.user(t, "agent-8", jt.agentKey, "session:s-3"), "_INBOX.agent-8")
	spillOwnSession(t, victim, "s-3")
	agent := jt.connect(t, "agent-7", jt.user(t, "agent-7", jt.agentKey, "session:s-1"), "_INBOX.agent-7")
	noDeputy(t, proc, agent, nil, jt.connect(t, "responder", jt.responder(t), ""), "s-1", "s-3")
}
