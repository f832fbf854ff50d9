package deploy

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	sgclient "github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// tenantNames are the two tenants of deploy/tenants/nats-server.conf.
var tenantNames = []string{"acme", "globex"}

// tenantPassword is the test password of a tenant's user.
func tenantPassword(tenant, role string) string { return tenant + "-" + role + "-test" }

// startTenants runs deploy/tenants/nats-server.conf with every tenant's
// passwords set.
func startTenants(t *testing.T) *server.Server {
	t.Helper()
	for _, ten := range tenantNames {
		for _, role := range []string{"agent", "processor", "responder", "operator", "forwarder"} {
			t.Setenv(strings.ToUpper(ten+"_"+role)+"_PASSWORD", tenantPassword(ten, role))
		}
	}
	opts, err := server.ProcessConfigFile(filepath.Join("tenants", "nats-server.conf"))
	if err != nil {
		t.Fatalf("deploy/tenants/nats-server.conf: %v", err)
	}
	opts.HTTPPort = 0
	for _, u := range opts.Users {
		if u.Permissions != nil && u.Permissions.Response != nil {
			t.Errorf("user %s has allow_responses: a requester could name where it publishes", u.Username)
		}
	}
	return startServer(t, opts)
}

// tenant is one tenant's three identities and its processor.
type tenant struct {
	name            string
	agent, operator *client
	proc            *client
	verdicts        *nats.Subscription // the agent's subscription to every verdict
}

// TestTenants runs two tenants of deploy/tenants/nats-server.conf, each with
// its own processor (its tenant's processor identity), and the same session
// id in both: ACME's session truncates turns no summary saw and is refused
// and spilled, GLOBEX's is allowed at once. Each tenant's agent sees its own
// verdicts and no other's, each tenant's streams hold its own events only,
// each operator reads its own tenant's spill and finds none of another's, and
// each account has the JetStream limits the file gives it.
func TestTenants(t *testing.T) {
	s := startTenants(t)

	tenants := map[string]*tenant{}
	for _, name := range tenantNames {
		ten := &tenant{name: name}
		ten.proc = connectWith(t, s, name+"-processor", tenantPassword(name, "processor"), "_INBOX_processor")
		ten.agent = connectWith(t, s, name+"-agent", tenantPassword(name, "agent"), "")
		ten.operator = connectWith(t, s, name+"-operator", tenantPassword(name, "operator"), "_INBOX_operator")
		resp := connectWith(t, s, name+"-responder", tenantPassword(name, "responder"), "")
		runProcessor(t, ten.proc, processor.Config{SpillVerify: true, Source: "urn:seamguard:processor:" + name}, processor.WithResponder(resp.nc))
		ten.agent.allowed(t, "subscribe to every verdict", func(ctx context.Context) error {
			var err error
			ten.verdicts, err = ten.agent.nc.SubscribeSync("seamguard.verdicts.>")
			return err
		})
		tenants[name] = ten
	}

	// Account limits: each tenant's JetStream is its own, with its share.
	for _, ten := range tenants {
		ten.proc.allowed(t, "read the account's JetStream limits", func(ctx context.Context) error {
			info, err := ten.proc.js.AccountInfo(ctx)
			if err != nil {
				return err
			}
			if info.Limits.MaxStore != 20e9 || info.Limits.MaxMemory != 256e6 {
				t.Errorf("%s's JetStream limits are %d file, %d memory bytes; the file gives 20G and 256M", ten.name, info.Limits.MaxStore, info.Limits.MaxMemory)
			}
			return nil
		})
	}

	// The same session id in both tenants.
	const session = "shared-id"
	verdictOf := map[string]*sgclient.Verdict{}
	for _, ten := range tenants {
		ten.agent.allowed(t, "run a session through compaction", func(ctx context.Context) error {
			c, err := sgclient.New(ten.agent.nc, sgclient.Config{Source: "urn:agent:" + ten.name})
			if err != nil {
				return err
			}
			sess, err := c.Open(ctx, sgclient.SessionConfig{ID: session, Span: 4})
			if err != nil {
				return err
			}
			for range 12 {
				if _, err := sess.Append(ctx, sgclient.Turn{Content: ten.name + " turn"}); err != nil {
					return err
				}
			}
			req := events.CompactionRequested{RequestID: "c1", SummarizerInput: events.Range{Start: 0, End: 12}, SummaryRange: events.Range{Start: 0, End: 8}, TailStart: 8}
			if ten.name == "acme" {
				// Turns 0-2 dropped by a budget cut that no summary saw.
				if err := sess.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget"); err != nil {
					return err
				}
				req.SummarizerInput, req.SummaryRange = events.Range{Start: 3, End: 12}, events.Range{Start: 3, End: 8}
			}
			v, err := sess.Compact(ctx, req)
			if err != nil {
				return err
			}
			verdictOf[ten.name] = v
			return sess.Close(ctx)
		})
	}
	acme, globex := verdictOf["acme"], verdictOf["globex"]
	if acme == nil || globex == nil {
		t.Fatalf("verdicts: acme %v, globex %v", acme, globex)
	}
	if acme.Allowed() == nil || acme.Previous == nil || acme.Previous.Refused() == nil || acme.Previous.Refused().Spill == nil {
		t.Fatalf("ACME's session should be refused with a spill, then allowed: %+v", acme)
	}
	if globex.Allowed() == nil || globex.Previous != nil {
		t.Fatalf("GLOBEX's session of the same id should be allowed at once, knowing nothing of ACME's: %+v", globex)
	}
	handle := acme.Previous.Refused().Spill

	for _, ten := range tenants {
		// What the tenant's streams hold: its own agent's events alone,
		// and verdicts of its own processor alone.
		var evs, vds []jetstream.Msg
		ten.proc.allowed(t, "read the tenant's events and verdicts", func(ctx context.Context) error {
			var err error
			if evs, err = readAll(ctx, ten.proc.js, "SEAMGUARD_EVENTS"); err != nil {
				return err
			}
			vds, err = readAll(ctx, ten.proc.js, "SEAMGUARD_VERDICTS")
			return err
		})
		if len(evs) == 0 || len(vds) == 0 {
			t.Fatalf("%s: %d events, %d verdicts", ten.name, len(evs), len(vds))
		}
		for _, m := range evs {
			if src := m.Headers().Get("ce-source"); src != "urn:agent:"+ten.name {
				t.Errorf("%s's events stream holds an event of %q", ten.name, src)
			}
		}
		ids := map[string]bool{}
		for _, m := range vds {
			v, err := events.DecodeVerdict(m.Data())
			if err != nil {
				t.Fatal(err)
			}
			if v.Source != "urn:seamguard:processor:"+ten.name {
				t.Errorf("%s's verdict stream holds a verdict of %s", ten.name, v.Source)
			}
			ids[string(m.Data())] = true
		}
		// Its agent saw exactly those verdicts: none of the other tenant's.
		seen := 0
		for {
			m, err := ten.verdicts.NextMsg(200 * time.Millisecond)
			if errors.Is(err, nats.ErrTimeout) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			seen++
			if !ids[string(m.Data)] {
				t.Errorf("%s's agent saw a verdict its tenant's stream does not hold: %s", ten.name, m.Data)
			}
		}
		if seen != len(vds) {
			t.Errorf("%s's agent saw %d verdicts, its stream holds %d", ten.name, seen, len(vds))
		}
	}

	// Spills: ACME's operator reads ACME's spill; GLOBEX's operator, asking
	// its own JetStream for the same name, finds nothing.
	tenants["acme"].operator.allowed(t, "read the tenant's spill and check its digest", func(ctx context.Context) error {
		var buf bytes.Buffer
		st := &spill.Store{JS: tenants["acme"].operator.js, Stream: "SEAMGUARD_EVENTS", Bucket: handle.Bucket}
		info, err := st.Get(ctx, handle.Name, &buf)
		if err != nil {
			return err
		}
		if info.Digest != handle.Digest || !bytes.Contains(buf.Bytes(), []byte("acme turn")) {
			t.Errorf("ACME's spill: digest %s (verdict %s), %d bytes", info.Digest, handle.Digest, buf.Len())
		}
		return nil
	})
	// And agents recover their own transcripts through their own tenant's
	// processor: ACME's agent reads it, GLOBEX's agent, asking for the same
	// session and name, is told there is no such spill.
	for _, ten := range tenants {
		ten.agent.allowed(t, "recover the session's spill", func(ctx context.Context) error {
			c, err := sgclient.New(ten.agent.nc, sgclient.Config{})
			if err != nil {
				return err
			}
			var buf bytes.Buffer
			_, err = c.Recover(ctx, session, *handle, &buf)
			switch {
			case ten.name == "acme" && err != nil:
				return err
			case ten.name == "acme" && !bytes.Contains(buf.Bytes(), []byte("acme turn")):
				t.Errorf("ACME's agent recovered %d bytes without its turns", buf.Len())
			case ten.name == "globex" && !errors.Is(err, sgclient.ErrSpillNotFound):
				t.Errorf("GLOBEX's agent asked for ACME's spill and got %v (%d bytes), not ErrSpillNotFound", err, buf.Len())
			}
			return nil
		})
	}
	tenants["globex"].operator.allowed(t, "look for the other tenant's spill", func(ctx context.Context) error {
		obs, err := tenants["globex"].operator.js.ObjectStore(ctx, handle.Bucket)
		if err != nil {
			return err
		}
		if _, err := obs.GetInfo(ctx, handle.Name); !errors.Is(err, jetstream.ErrObjectNotFound) {
			t.Errorf("GLOBEX's operator asked for ACME's spill %s and got %v, not object not found", handle.Name, err)
		}
		return nil
	})
}

// readAll reads every message of stream with an ordered consumer.
func readAll(ctx context.Context, js jetstream.JetStream, stream string) ([]jetstream.Msg, error) {
	str, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	n := str.CachedInfo().State.Msgs
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for uint64(len(out)) < n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

// TestTenantsCompose checks deploy/tenants/docker-compose.yaml against the
// tenants' server config and seamguard serve: the server runs that config,
// every processor connects as a processor user of a tenant with the
// password the server is given, one processor per tenant, and every
// SEAMGUARD_ variable is a flag of serve.
func TestTenantsCompose(t *testing.T) {
	var c composeFile
	decodeYAML(t, filepath.Join("tenants", "docker-compose.yaml"), &c)
	natsSvc, ok := c.Services["nats"]
	if !ok || !slices.Contains(natsSvc.Command, "/etc/nats/tenants/nats-server.conf") {
		t.Fatalf("the nats service should run /etc/nats/tenants/nats-server.conf: %+v", natsSvc.Command)
	}
	for k, v := range natsSvc.Environment {
		t.Setenv(k, interpolate(t, v))
	}
	opts, err := server.ProcessConfigFile(filepath.Join("tenants", "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	us := users(opts)
	served := map[string]bool{}
	for name, svc := range c.Services {
		if svc.Build == nil {
			continue
		}
		var env []string
		for k := range svc.Environment {
			env = append(env, k)
		}
		checkSeamguardEnv(t, name, env)
		user := svc.Environment["SEAMGUARD_USER"]
		u, ok := us[user]
		if !ok || !strings.HasSuffix(user, "-processor") {
			t.Errorf("%s connects as %q, not a tenant's processor user", name, user)
			continue
		}
		if pw := interpolate(t, svc.Environment["SEAMGUARD_PASSWORD"]); pw != u.Password {
			t.Errorf("%s's password is not the one the server gives %s", name, user)
		}
		served[u.Account.Name] = true
	}
	for _, ten := range tenantNames {
		if !served[strings.ToUpper(ten)] {
			t.Errorf("no processor serves tenant %s", strings.ToUpper(ten))
		}
	}
}
