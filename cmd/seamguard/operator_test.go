package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/processor"
)

// The tests of this file run the operator's commands against a real
// nats-server loaded with the shipped deploy/nats/standalone.conf (its
// accounts and permissions), as the shipped identities.

var shippedPasswords = map[string]string{"agent": "agent-test-pw", "processor": "processor-test-pw", "responder": "responder-test-pw", "operator": "operator-test-pw", "forwarder": "forwarder-test-pw"}

// startShipped starts deploy/nats/standalone.conf on a random loopback port
// with storage in a temporary directory, and returns its URL.
func startShipped(t *testing.T) string {
	t.Helper()
	t.Setenv("NATS_AGENT_PASSWORD", shippedPasswords["agent"])
	t.Setenv("NATS_PROCESSOR_PASSWORD", shippedPasswords["processor"])
	t.Setenv("NATS_RESPONDER_PASSWORD", shippedPasswords["responder"])
	t.Setenv("NATS_OPERATOR_PASSWORD", shippedPasswords["operator"])
	t.Setenv("NATS_FORWARDER_PASSWORD", shippedPasswords["forwarder"])
	opts, err := server.ProcessConfigFile("../../deploy/nats/standalone.conf")
	require.NoError(t, err)
	opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	opts.HTTPPort = 0
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(10*time.Second))
	return srv.ClientURL()
}

// identityConn connects to url as a shipped identity with the given inbox
// prefix ("" for NATS's default) and records the permissions violations the
// server reports on it.
type identityConn struct {
	nc *nats.Conn
	js jetstream.JetStream

	mu         sync.Mutex
	violations []string
}

func connectAs(t *testing.T, url, user, inbox string) *identityConn {
	t.Helper()
	c := &identityConn{}
	opts := []nats.Option{nats.UserInfo(user, shippedPasswords[user]), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.violations = append(c.violations, err.Error())
	})}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	c.nc = nc
	c.js, err = jetstream.New(nc)
	require.NoError(t, err)
	return c
}

// refused returns the violations so far, after a round trip.
func (c *identityConn) refused(t *testing.T) []string {
	t.Helper()
	require.NoError(t, c.nc.FlushTimeout(5*time.Second))
	time.Sleep(20 * time.Millisecond) // the error handler runs on its own goroutine
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.violations)
}

// cliRun runs one command line in-process with a deadline, and how long it took.
func cliRun(t *testing.T, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	start := time.Now()
	code = run(ctx, args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String(), time.Since(start)
}

// TestOperatorToolsShippedIdentities runs every operator command through
// the CLI as the shipped operator identity, against the processor running
// (serve) as the shipped processor identity and the seed and gap stories
// published by the shipped agent identity: each works, prints what it
// should, and no connection meets a single permissions violation. Then the
// same commands as the agent identity fail at once, saying which
// permission is missing and that the operator identity holds it, and serve
// as the operator says the processor identity is needed.
func TestOperatorToolsShippedIdentities(t *testing.T) {
	url := startShipped(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveOut, serveErr lockedBuffer
	go func() {
		served <- run(ctx, []string{"serve", "--nats-url", url, "--user", "processor", "--password", shippedPasswords["processor"],
			"--responder-user", "responder", "--responder-password", shippedPasswords["responder"], "--log-level", "warn"},
			strings.NewReader(""), &serveOut, &serveErr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-served:
			assert.Equal(t, 0, code, serveErr.String())
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop after its context was cancelled")
		}
		assert.NotContains(t, serveErr.String(), "refused a permission", "serve as the processor")
	})
	require.Eventually(t, func() bool { return strings.Contains(serveOut.String(), "seamguard serving on") }, 20*time.Second, 10*time.Millisecond, serveErr.String())

	agent := connectAs(t, url, "agent", "")
	seed := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	gap := readLines(t, filepath.Join(storiesDir, "gap-then-resume.jsonl"))
	publishLines(t, agent.js, seed)
	publishLines(t, agent.js, gap[:6]) // up to the halt (k1) and the refused retry (k2)

	asOperator := func(args ...string) []string {
		return append(args, "--nats-url", url, "--user", "operator", "--password", shippedPasswords["operator"])
	}
	ok := func(t *testing.T, args ...string) (string, string) {
		t.Helper()
		code, out, errs, took := cliRun(t, asOperator(args...)...)
		require.Equal(t, 0, code, "%v: %s", args, errs)
		assert.NotContains(t, errs, "permission")
		assert.Less(t, took, 5*time.Second, "%v", args)
		return out, errs
	}

	proc := connectAs(t, url, "processor", shippedInboxes["processor"])
	consumers := func(stream string) int {
		str, err := proc.js.Stream(context.Background(), stream)
		require.NoError(t, err)
		return str.CachedInfo().State.Consumers
	}

	var spillName string
	t.Run("operator", func(t *testing.T) {
		out, errs := ok(t, "watch", "--all", "--session", "ops-agent-42", "--max", "3")
		assert.Contains(t, errs, "watching seamguard.verdicts.ops-agent-42.*")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 3, out)
		assert.Contains(t, lines[0], "spilled")
		assert.Contains(t, lines[1], "refused")
		assert.Contains(t, lines[1], "coverage_hole [0, 8)")
		assert.Contains(t, lines[2], "allowed")
		out, _ = ok(t, "watch", "--all", "--session", "gap-then-resume", "--max", "2")
		assert.Contains(t, out, "halted")

		out, _ = ok(t, "watch", "--all", "--json", "--session", "ops-agent-42", "--kind", "spilled", "--max", "1")
		var spilled struct {
			Data struct{ Name, Digest string }
		}
		require.NoError(t, json.Unmarshal([]byte(out), &spilled), out)
		spillName = spilled.Data.Name
		require.Equal(t, "ops-agent-42/1.jsonl", spillName)

		file := filepath.Join(t.TempDir(), "transcript.jsonl")
		_, errs = ok(t, "spill", "get", spillName, "-o", file)
		assert.Contains(t, errs, "verified "+spillName)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		assert.Equal(t, 55, bytes.Count(b, []byte("\n")))
		assert.Contains(t, string(b), "Do not touch anything under /etc.")

		out, errs = ok(t, "inspect", "ops-agent-42", "--color", "never", "--verify-spills")
		assert.Contains(t, out, "session ops-agent-42: open")
		assert.Contains(t, out, "ledger from bucket seamguard-sessions")
		assert.Contains(t, out, "decisions: 3 verdict(s) in SEAMGUARD_VERDICTS")
		assert.Contains(t, errs, "the chain holds exactly the session's accepted events")

		out, _ = ok(t, "inspect", "ops-agent-42", "--rebuild", "--color", "never")
		assert.Contains(t, out, "ledger rebuilt from stream SEAMGUARD_EVENTS")
		assert.Contains(t, out, "s spilled (P): a spill holds it        [0, 52)")

		out, _ = ok(t, "inspect", "gap-then-resume", "--color", "never")
		assert.Contains(t, out, "session gap-then-resume: HALTED")

		out, _ = ok(t, "resume", "gap-then-resume", "--note", "chunk lost upstream; accepted (OPS-311)")
		assert.Contains(t, out, "published session.resumed")
		assert.Contains(t, out, "offsets [1200, 1500) are waived")
		// The processor takes the resume: the next compaction is allowed,
		// the gap cured by the waiver. A watch from now (no --all),
		// started before, follows it as it is decided.
		live := make(chan string, 1)
		go func() {
			_, out, errs, _ := cliRun(t, asOperator("watch", "--session", "gap-then-resume", "--kind", "allowed", "--max", "1")...)
			live <- out + errs
		}()
		time.Sleep(500 * time.Millisecond) // watch has noted where the stream ends
		publishLines(t, agent.js, []string{strings.Replace(gap[8], `"k3"`, `"k9"`, 1)})
		select {
		case got := <-live:
			assert.Contains(t, got, "k9")
			assert.NotContains(t, got, "permission")
		case <-time.After(20 * time.Second):
			t.Fatal("watch did not follow the new verdict")
		}
		out, _ = ok(t, "watch", "--all", "--session", "gap-then-resume", "--kind", "allowed", "--max", "1")
		assert.Contains(t, out, "k9")
		assert.Contains(t, out, "cured [sequence_gap]")

		out, _ = ok(t, "replay")
		assert.Contains(t, out, "replayed 65 events of 2 session(s) from SEAMGUARD_EVENTS")
		assert.Contains(t, out, "no difference")
		out, _ = ok(t, "replay", "--session", "gap-then-resume")
		assert.Contains(t, out, "no difference")

		// None of it needed a consumer: the shipped operator may not
		// create one (deploy: TestOperatorPushConsumerAttack), and every
		// command above succeeded without a refusal. Nothing is left on
		// the streams only the operator reads with consumers of its own
		// (the events stream has the processor's).
		for _, stream := range []string{"SEAMGUARD_VERDICTS", "OBJ_seamguard-spills"} {
			assert.Zero(t, consumers(stream), "consumers of %s", stream)
		}
	})

	// As the agent, with its own inbox: the first thing each command asks
	// for is refused, at once, and the message says what and who may.
	t.Run("agent", func(t *testing.T) {
		for _, tc := range []struct {
			args    []string
			subject string // the refused subject starts with this
		}{
			{[]string{"inspect", "ops-agent-42"}, "$JS.API.STREAM.INFO.KV_seamguard-sessions"},
			{[]string{"inspect", "ops-agent-42", "--rebuild"}, "$JS.API.STREAM.INFO.SEAMGUARD_VERDICTS"},
			{[]string{"replay"}, "$JS.API.STREAM.INFO.SEAMGUARD_VERDICTS"},
			{[]string{"watch", "--all", "--max", "1"}, "$JS.API.STREAM.INFO.SEAMGUARD_VERDICTS"},
			{[]string{"spill", "get", "ops-agent-42/1.jsonl", "-o", filepath.Join(t.TempDir(), "t.jsonl")}, "$JS.API.STREAM.INFO.OBJ_seamguard-spills"},
			// resume reads the session's state before it publishes, to
			// report what the resume changed.
			{[]string{"resume", "ops-agent-42", "--note", "not mine to lift"}, "$JS.API.STREAM.INFO.KV_seamguard-sessions"},
		} {
			args := append(tc.args, "--nats-url", url, "--user", "agent", "--password", shippedPasswords["agent"], "--inbox-prefix", "_INBOX")
			code, out, errs, took := cliRun(t, args...)
			assert.Equal(t, 1, code, "%v", tc.args)
			assert.Less(t, took, 2*time.Second, "%v: %s", tc.args, errs)
			assert.Contains(t, errs, `permission denied: user "agent" may not publish to "`+tc.subject, "%v", tc.args)
			assert.Contains(t, errs, "the shipped operator identity (deploy/nats/permissions.conf) may: connect as operator (--user operator)", "%v", tc.args)
			assert.NotContains(t, out, "published", "%v", tc.args)
		}

		// With the operator's inbox prefix (the CLI's default), which the
		// agent may not subscribe to: the message says to pass its own.
		code, _, errs, took := cliRun(t, "inspect", "ops-agent-42", "--nats-url", url, "--user", "agent", "--password", shippedPasswords["agent"])
		assert.Equal(t, 1, code)
		assert.Less(t, took, 2*time.Second, errs)
		assert.Contains(t, errs, `user "agent" may not subscribe to "_INBOX_operator.`)
		assert.Contains(t, errs, "--inbox-prefix _INBOX for the shipped agent identity")
		assert.Contains(t, errs, "the shipped operator identity (deploy/nats/permissions.conf) may")
	})

	// serve as the operator: the processor's permissions are missing.
	t.Run("serve as operator", func(t *testing.T) {
		code, _, errs, took := cliRun(t, "serve", "--nats-url", url, "--user", "operator", "--password", shippedPasswords["operator"],
			"--inbox-prefix", "_INBOX_operator", "--log-level", "error", "--data-dir", t.TempDir())
		assert.Equal(t, 1, code)
		assert.Less(t, took, 3*time.Second, errs)
		assert.Contains(t, errs, `permission denied: user "operator" may not publish to "$JS.API.`)
		assert.Contains(t, errs, "the shipped processor identity (deploy/nats/permissions.conf) may: connect as processor (--user processor)")
		assert.NotContains(t, errs, "$SYS.REQ", "the durability check's refusal is not the processor's")
	})

	t.Run("no violations", func(t *testing.T) {
		assert.Empty(t, agent.refused(t), "the agent's connection")
	})
}

// TestShippedGrants checks the table of shipped permissions that permission
// errors quote against deploy/nats/permissions.conf in a real server: for
// every grant, each identity it names may publish (or subscribe) to a
// subject of its pattern, and no other shipped identity may; and the
// processor's durable consumers, which the operator's grants on the events
// stream would match, are the processor's alone.
func TestShippedGrants(t *testing.T) {
	url := startShipped(t)
	conns := map[string]*identityConn{}
	for _, who := range []string{"agent", "processor", "responder", "operator", "forwarder"} {
		conns[who] = connectAs(t, url, who, shippedInboxes[who])
	}
	grants := shippedGrants(processor.Config{})
	type check struct {
		g       grant
		subject string
	}
	var checks []check
	for _, g := range grants {
		if g.when != nil {
			// every partition's of the deployment that runs the most
			// (deploy/kubernetes: 16), and the consumer of invalid events
			names := []string{"seamguard-invalid"}
			for part := range 16 {
				names = append(names, fmt.Sprintf("seamguard-p%d", part))
			}
			for _, name := range names {
				for _, op := range []string{"CREATE", "DELETE", "INFO", "MSG.NEXT"} {
					s := "$JS.API.CONSUMER." + op + ".SEAMGUARD_EVENTS." + name
					if subjectMatches(g.pattern, s) && g.when(s) {
						checks = append(checks, check{g, s})
					}
				}
			}
			continue
		}
		s := strings.ReplaceAll(strings.ReplaceAll(g.pattern, "*", "x1"), ">", "x1.x2")
		checks = append(checks, check{g, s})
	}
	for _, c := range checks {
		got, ok := grantFor(grants, c.g.verb, c.subject)
		if assert.True(t, ok, c.subject) {
			assert.Equal(t, c.g.pattern, got.pattern, "%s %s is explained by an earlier grant", c.g.verb, c.subject)
		}
	}
	for who, conn := range conns {
		for _, c := range checks {
			if c.g.verb == "publish" {
				require.NoError(t, conn.nc.Publish(c.subject, nil), c.subject)
			} else {
				sub, err := conn.nc.SubscribeSync(c.subject)
				require.NoError(t, err, c.subject)
				require.NoError(t, conn.nc.Flush())
				require.NoError(t, sub.Unsubscribe())
			}
		}
		refused := strings.Join(conn.refused(t), "\n")
		for _, c := range checks {
			verb := "Publish"
			if c.g.verb == "subscribe" {
				verb = "Subscription"
			}
			denied := strings.Contains(refused, "for "+verb+" to \""+c.subject+"\"")
			if slices.Contains(c.g.holders, who) {
				assert.False(t, denied, "%s holds %s %s (%s), but may not %s to %s", who, c.g.verb, c.g.pattern, c.g.need, c.g.verb, c.subject)
			} else {
				assert.True(t, denied, "%s does not hold %s %s by the table, but may %s to %s", who, c.g.verb, c.g.pattern, c.g.verb, c.subject)
			}
		}
	}
}

// TestDenialMessages checks what a refusal says in the cases the shipped
// identities do not show.
func TestDenialMessages(t *testing.T) {
	grants := shippedGrants(processor.Config{})
	for _, tc := range []struct {
		d     *denials
		v     denial
		wants []string
	}{
		{&denials{grants: grants, prefer: "operator"}, denial{"publish", "$JS.API.STREAM.DELETE.SEAMGUARD_EVENTS"},
			[]string{`this identity may not publish to "$JS.API.STREAM.DELETE.SEAMGUARD_EVENTS", and no shipped identity`}},
		{&denials{grants: grants, prefer: "operator", user: "operator"}, denial{"publish", "$JS.API.STREAM.INFO.KV_seamguard-sessions"},
			[]string{`user "operator" may not publish`, "so this server's operator is not configured as shipped: grant publish on $JS.API.STREAM.INFO.KV_seamguard-sessions to it"}},
		{&denials{grants: grants, prefer: "operator", user: "ops-alice"}, denial{"publish", "$JS.API.CONSUMER.DELETE.SEAMGUARD_EVENTS.seamguard-p3"},
			[]string{"the processor's durable consumers", "the shipped processor identity"}},
		{&denials{grants: grants, prefer: "operator", user: "ops-alice", inbox: "_INBOX_operator"}, denial{"subscribe", "_INBOX_operator.abc.*"},
			[]string{`user "ops-alice" may not subscribe to "_INBOX_operator.abc.*"`, "(--inbox-prefix _INBOX_operator, the shipped operator identity's)", "e.g. --inbox-prefix _INBOX"}},
		{&denials{grants: grants, prefer: "processor", user: "processor", inbox: "_INBOX_processor"}, denial{"subscribe", "_INBOX_processor.abc.*"},
			[]string{"this server's processor is not configured as shipped", "grant subscribe on _INBOX_processor.> to it"}},
	} {
		got := tc.d.describe(tc.v)
		for _, w := range tc.wants {
			assert.Contains(t, got, w)
		}
	}
	for msg, want := range map[string]denial{
		`Permissions Violation for Publish to "$JS.API.INFO"`:                 {"publish", "$JS.API.INFO"},
		`Permissions Violation for Subscription to "_INBOX.x.*"`:              {"subscribe", "_INBOX.x.*"},
		`Permissions Violation for Subscription to "a.b" using queue "q"`:     {"subscribe", "a.b"},
		`Permissions Violation for Publish with Reply of "_INBOX_operator.x"`: {"reply", "_INBOX_operator.x"},
	} {
		got, ok := denialOf(fmt.Errorf("%w: %s", nats.ErrPermissionViolation, msg))
		assert.True(t, ok, msg)
		assert.Equal(t, want, got, msg)
	}
	_, ok := denialOf(nats.ErrSlowConsumer)
	assert.False(t, ok)
	reply := (&denials{grants: grants}).describe(denial{"reply", "_INBOX_operator.x"})
	assert.Contains(t, reply, `this identity may not publish with the reply subject "_INBOX_operator.x", and no shipped identity`)

	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"a.*.c", "a.b.c", true}, {"a.*.c", "a.b.c.d", false}, {"a.>", "a", false}, {"a.>", "a.b.c", true},
		{"$JS.API.INFO", "$JS.API.INFO", true}, {"a.b", "a", false},
	} {
		assert.Equal(t, tc.want, subjectMatches(tc.pattern, tc.subject), "%s ~ %s", tc.pattern, tc.subject)
	}
}

// TestDenialsToldBounded: a connection denied ever new subjects remembers
// which it told about up to maxDenials, then tells no more.
func TestDenialsToldBounded(t *testing.T) {
	var d denials
	told := 0
	for i := range 10 * maxDenials {
		if d.first(denial{verb: "publish", subject: fmt.Sprintf("nobody.grants.this.%d", i)}) {
			told++
		}
	}
	require.Equal(t, maxDenials, told)
	require.Len(t, d.told, maxDenials)
	require.False(t, d.first(denial{verb: "publish", subject: "nobody.grants.this.0"}), "told once")
}
