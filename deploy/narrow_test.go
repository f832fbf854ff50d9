package deploy

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	sgclient "github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
)

// The way NATS narrows an agent to its own sessions inside a tenant:
// decentralized (JWT) authentication, with a scoped signing key of the
// tenant's account whose role template grants the subjects of the sessions
// a user's JWT names in its tags. Whoever holds that signing key (the
// tenant's control plane) issues each agent a user JWT tagged
// session:<id> for each session it may run, and the server expands the
// template per connection: the agent may publish on those sessions'
// events subjects and hear their verdicts, nothing else, and its replies
// come to an inbox of its own name, _INBOX.<name> (inside NATS's default
// inbox prefix, where the recover service answers). The user JWT cannot widen that: a user
// signed by a scoped key carries no permissions of its own.

// agentScope is the agent role of a tenant's account: the permission
// template deploy/README.md shows.
func agentScope(t *testing.T) (*jwt.UserScope, nkeys.KeyPair) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	s := jwt.NewUserScope()
	s.Key, s.Role = pub, "agent"
	s.Description = "seamguard agent: the sessions of its session tags"
	s.Template.Pub.Allow.Add("seamguard.events.{{tag(session)}}", "seamguard.recover.{{tag(session)}}")
	s.Template.Sub.Allow.Add("seamguard.verdicts.{{tag(session)}}.>", "_INBOX.{{name()}}.>")
	return s, kp
}

// jwtTenant starts a server in operator mode with a system account and one
// tenant account with JetStream, whose signing keys include the agent
// scope. It returns the server and the credentials maker of the account.
type jwtTenant struct {
	srv      *server.Server
	account  nkeys.KeyPair // the account's own key: signs unrestricted users
	agentKey nkeys.KeyPair // the scoped signing key of the agent role
	accPub   string
}

func startJWTTenant(t *testing.T) *jwtTenant {
	t.Helper()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "seamguard-test"

	skp, _ := nkeys.CreateAccount()
	spub, _ := skp.PublicKey()
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sjwt, err := sc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	oc.SystemAccount = spub
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ocl, err := jwt.DecodeOperatorClaims(ojwt)
	if err != nil {
		t.Fatal(err)
	}

	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Name = "ACME"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	scope, agentKey := agentScope(t)
	ac.SigningKeys.AddScopedSigner(scope)
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}

	res := &server.MemAccResolver{}
	if err := res.Store(spub, sjwt); err != nil {
		t.Fatal(err)
	}
	if err := res.Store(apub, ajwt); err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{
		ServerName:       "seamguard-jwt",
		JetStream:        true,
		TrustedOperators: []*jwt.OperatorClaims{ocl},
		SystemAccount:    spub,
		AccountResolver:  res,
	}
	return &jwtTenant{srv: startServer(t, opts), account: akp, agentKey: agentKey, accPub: apub}
}

// responder returns the credentials of the identity serve's recover
// service answers as: subscribe to the requests, publish to inboxes,
// nothing else (RESPONDER_PERMISSIONS of deploy/nats as user claims).
func (jt *jwtTenant) responder(t *testing.T) nats.Option {
	t.Helper()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "responder"
	uc.Pub.Allow.Add("_INBOX.>", "_INBOX_operator.>")
	uc.Sub.Allow.Add("seamguard.recover.>", "$SRV.>")
	tok, err := uc.Encode(jt.account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	return nats.UserJWTAndSeed(tok, string(seed))
}

// user returns connection options for a new user named name, signed by
// signer (the account's key, or a scoped signing key), with tags.
func (jt *jwtTenant) user(t *testing.T, name string, signer nkeys.KeyPair, tags ...string) nats.Option {
	t.Helper()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.Tags.Add(tags...)
	if signer != jt.account {
		uc.IssuerAccount = jt.accPub
		uc.SetScoped(true)
	}
	tok, err := uc.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	return nats.UserJWTAndSeed(tok, string(seed))
}

// connectJWT connects with the given credentials and inbox prefix,
// recording permission violations.
func (jt *jwtTenant) connect(t *testing.T, who string, creds nats.Option, inbox string) *client {
	t.Helper()
	c := &client{user: who, errs: make(chan error, 256)}
	opts := []nats.Option{creds, nats.Name(who), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	})}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(jt.srv.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", who, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	return c
}

// TestAgentNarrowedToItsSessions: in a tenant on JWT authentication, agent
// agent-7 holds a user JWT tagged with sessions s-1 and s-2, signed by the
// agent role's scoped key. It runs s-1 through a refusal, spill and retry
// with the Go client, and may do nothing with s-3 (another agent's): not
// publish its events, not hear its verdicts, not listen to all verdicts,
// not read another agent's inbox.
func TestAgentNarrowedToItsSessions(t *testing.T) {
	jt := startJWTTenant(t)
	proc := jt.connect(t, "processor", jt.user(t, "processor", jt.account), "")
	if err := newJS(t, proc); err != nil {
		t.Fatal(err)
	}
	resp := jt.connect(t, "responder", jt.responder(t), "")
	runProcessor(t, proc, processor.Config{SpillVerify: true}, processor.WithResponder(resp.nc))

	agent := jt.connect(t, "agent-7", jt.user(t, "agent-7", jt.agentKey, "session:s-1", "session:s-2"), "_INBOX.agent-7")
	if err := newJS(t, agent); err != nil {
		t.Fatal(err)
	}
	agent.allowed(t, "run its session through refusal, spill and retry", func(ctx context.Context) error {
		c, err := sgclient.New(agent.nc, sgclient.Config{Source: "urn:agent:agent-7"})
		if err != nil {
			return err
		}
		s, err := truncatedSession(ctx, c, "s-1")
		if err != nil {
			return err
		}
		v, err := s.Compact(ctx, truncatedRequest)
		if err != nil {
			return err
		}
		if v.Allowed() == nil || v.Previous == nil || v.Previous.Refused().Spill == nil {
			t.Errorf("s-1: want refused with a spill, then allowed; got %+v", v)
			return s.Close(ctx)
		}
		var transcript bytes.Buffer
		if _, err := s.Recover(ctx, *v.Previous.Refused().Spill, &transcript); err != nil {
			return fmt.Errorf("recovering its own spill: %w", err)
		}
		return s.Close(ctx)
	})
	agent.denied(t, "publish into another agent's session", "seamguard.events.s-3", true, func(ctx context.Context) error {
		_, err := agent.js.Publish(ctx, "seamguard.events.s-3", []byte(`{"forged":true}`))
		return err
	})
	agent.denied(t, "ask for another agent's session's spills", "seamguard.recover.s-3", true, func(ctx context.Context) error {
		_, err := agent.nc.RequestWithContext(ctx, "seamguard.recover.s-3", []byte(`{"op":"info","name":"s-3/1.jsonl"}`))
		return err
	})
	agent.denied(t, "hear another agent's session's verdicts", "seamguard.verdicts.s-3.>", false, func(ctx context.Context) error {
		_, err := agent.nc.SubscribeSync("seamguard.verdicts.s-3.>")
		return err
	})
	agent.denied(t, "hear every session's verdicts", "seamguard.verdicts.>", false, func(ctx context.Context) error {
		_, err := agent.nc.SubscribeSync("seamguard.verdicts.>")
		return err
	})
	agent.denied(t, "read another agent's inbox", "_INBOX.agent-8.>", false, func(ctx context.Context) error {
		_, err := agent.nc.SubscribeSync("_INBOX.agent-8.>")
		return err
	})
	agent.denied(t, "lift a halt", "seamguard.control.s-1", false, func(ctx context.Context) error {
		return agent.nc.Publish("seamguard.control.s-1", []byte(`{}`))
	})

	// A second agent, s-3's, runs its own session untouched.
	other := jt.connect(t, "agent-8", jt.user(t, "agent-8", jt.agentKey, "session:s-3"), "_INBOX.agent-8")
	other.allowed(t, "run its own session", func(ctx context.Context) error {
		c, err := sgclient.New(other.nc, sgclient.Config{Source: "urn:agent:agent-8"})
		if err != nil {
			return err
		}
		s, err := c.Open(ctx, sgclient.SessionConfig{ID: "s-3", Span: 2})
		if err != nil {
			return err
		}
		for range 6 {
			if _, err := s.Append(ctx, sgclient.Turn{Content: "turn"}); err != nil {
				return err
			}
		}
		v, err := s.RequestCompaction(ctx, events.CompactionRequested{RequestID: "k1", SummarizerInput: events.Range{Start: 0, End: 6}, SummaryRange: events.Range{Start: 0, End: 4}, TailStart: 4})
		if err != nil {
			return err
		}
		if v.Allowed() == nil {
			t.Errorf("s-3: want allowed, got %+v", v)
		}
		return nil
	})
}

// newJS gives c a JetStream context.
func newJS(t *testing.T, c *client) error {
	t.Helper()
	var err error
	c.js, err = jetstreamNew(c.nc)
	return err
}

func jetstreamNew(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
