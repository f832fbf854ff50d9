package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/forward"
	"github.com/seamguard/seamguard/processor"
)

// errPermission marks a command that failed because the server refused one
// of its publishes or subscriptions; the message says which, what for, and
// which shipped identity may.
var errPermission = errors.New("permission denied")

// shippedConfig is where the shipped identities' permissions are.
const shippedConfig = "deploy/nats/permissions.conf"

// shippedInboxes are the inbox prefixes of the shipped identities: each may
// subscribe to its own alone.
var shippedInboxes = map[string]string{"processor": processorInbox, "operator": operatorInbox, "agent": "_INBOX", "forwarder": forwarderInbox}

// A grant is one permission of the shipped identities, as
// deploy/nats/permissions.conf gives it: the verb and subject pattern, the
// identities that hold it, and what seamguard needs it for.
type grant struct {
	verb    string   // "publish" or "subscribe"
	pattern string   // a subject with NATS wildcards
	holders []string // the shipped identities allowed it; none: no shipped identity
	need    string   // what it is needed for, after "needed "
	// when, if set, narrows the pattern: the grant covers only the
	// subjects it accepts (the processor's durable consumers, which
	// permissions deny to the operator by name).
	when func(subject string) bool
}

// shippedGrants is the table of the shipped permissions for the deployment
// whose names cfg gives (its --prefix), in the order they are matched: the
// first grant whose pattern matches a subject explains it. The test
// TestShippedGrants loads deploy/nats/permissions.conf into a server and
// checks that every identity listed holds its grant and no other does.
func shippedGrants(cfg processor.Config) []grant {
	n := cfg.Names()
	prefix := cfg.Subjects().Prefix
	if prefix == "" {
		prefix = events.DefaultPrefix
	}
	ev, vd, kv, lk, obj := n.Events, n.Verdicts, n.SessionsStream(), n.LeasesStream(), n.SpillsStream()
	durable := strings.TrimSuffix(cfg.ConsumerName(-1), "invalid") // "seamguard-"
	processorConsumer := func(subject string) bool {
		name := subject[strings.LastIndex(subject, ".")+1:]
		rest, ok := strings.CutPrefix(name, durable)
		if !ok {
			return false
		}
		if rest == "invalid" {
			return true
		}
		digits, ok := strings.CutPrefix(rest, "p")
		return ok && digits != "" && strings.Trim(digits, "0123456789") == ""
	}
	const pub, sub = "publish", "subscribe"
	op, proc, agent, resp, fwd := "operator", "processor", "agent", "responder", "forwarder"
	und := forward.UndeliverableStream(prefix)
	return []grant{
		// The processor's durable consumers first: their names match the
		// operator's grants on the events stream, which deny them.
		{verb: pub, pattern: "$JS.API.CONSUMER.*." + ev + ".*", holders: []string{proc}, when: processorConsumer,
			need: "to create, look up or delete one of the processor's durable consumers (" + durable + "p<n>); no operator command needs that"},
		{verb: pub, pattern: "$JS.API.CONSUMER.MSG.NEXT." + ev + ".*", holders: []string{proc}, when: processorConsumer,
			need: "to pull from one of the processor's durable consumers (" + durable + "p<n>); no operator command needs that"},

		// What the operator's commands need (the processor holds most too).
		{verb: pub, pattern: "$JS.API.STREAM.INFO." + ev, holders: []string{op, proc}, need: "to look up the events stream " + ev},
		{verb: pub, pattern: "$JS.API.STREAM.MSG.GET." + ev, holders: []string{op, proc}, need: "to read an event of stream " + ev + " by its sequence"},
		{verb: pub, pattern: "$JS.API.STREAM.INFO." + vd, holders: []string{op, proc}, need: "to look up the verdict stream " + vd},
		{verb: pub, pattern: "$JS.API.STREAM.MSG.GET." + vd, holders: []string{op}, need: "to read a verdict of stream " + vd + " by its sequence"},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + vd, holders: []string{op}, need: "to read the verdicts of stream " + vd + " by batched direct gets"},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + vd + ".>", holders: []string{op}, need: "to read the last verdict on a subject of stream " + vd},
		{verb: pub, pattern: "$JS.API.STREAM.INFO." + kv, holders: []string{op, proc}, need: "to open the session bucket " + n.Sessions},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + kv + ".>", holders: []string{op, proc}, need: "to read a session's snapshot from the bucket " + n.Sessions},
		{verb: pub, pattern: "$JS.API.STREAM.INFO." + obj, holders: []string{op, proc}, need: "to open the spill bucket " + n.Spills},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + obj + ".>", holders: []string{op, proc}, need: "to read a spill's info from the bucket " + n.Spills},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + obj, holders: []string{op, proc}, need: "to read a spill's chunks by direct get"},
		{verb: pub, pattern: prefix + ".control.>", holders: []string{op}, need: "to publish session.resumed on the session's control subject"},
		{verb: pub, pattern: "$SRV.>", holders: []string{op}, need: "to discover the recover service (nats micro ls, info, stats)"},
		{verb: sub, pattern: operatorInbox + ".>", holders: []string{op}, need: "to receive replies on the operator's inbox"},
		{verb: sub, pattern: prefix + ".verdicts.>", holders: []string{op, agent}, need: "to listen to verdicts as they are published"},

		// The processor's own.
		{verb: pub, pattern: "$JS.API.INFO", holders: []string{proc}, need: "to read the account's JetStream limits"},
		{verb: pub, pattern: "$JS.API.STREAM.CREATE." + ev, holders: []string{proc}, need: "to create the events stream " + ev},
		{verb: pub, pattern: "$JS.API.STREAM.UPDATE." + ev, holders: []string{proc}, need: "to update the events stream " + ev},
		{verb: pub, pattern: "$JS.API.STREAM.CREATE." + vd, holders: []string{proc}, need: "to create the verdict stream " + vd},
		{verb: pub, pattern: "$JS.API.STREAM.UPDATE." + vd, holders: []string{proc}, need: "to update the verdict stream " + vd},
		{verb: pub, pattern: "$JS.API.STREAM.CREATE." + kv, holders: []string{proc}, need: "to create the session bucket " + n.Sessions},
		{verb: pub, pattern: "$JS.API.STREAM.CREATE." + lk, holders: []string{proc}, need: "to create the lease bucket " + n.Leases},
		{verb: pub, pattern: "$JS.API.STREAM.INFO." + lk, holders: []string{proc}, need: "to open the lease bucket " + n.Leases},
		{verb: pub, pattern: "$JS.API.STREAM.UPDATE." + lk, holders: []string{proc}, need: "to update the lease bucket " + n.Leases},
		{verb: pub, pattern: "$JS.API.STREAM.CREATE." + obj, holders: []string{proc}, need: "to create the spill bucket " + n.Spills},
		{verb: pub, pattern: "$JS.API.STREAM.PURGE." + obj, holders: []string{proc}, need: "to remove the chunks of a spill it replaces"},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + lk + ".>", holders: []string{proc}, need: "to read a partition's lease"},
		{verb: pub, pattern: "$JS.API.DIRECT.GET." + ev, holders: []string{proc}, need: "to look up, many sessions at once, where each session's next input is in the events stream " + ev},
		{verb: pub, pattern: "$JS.API.CONSUMER.*." + ev + ".>", holders: []string{proc}, need: "to manage its consumers of the events stream " + ev},
		{verb: pub, pattern: "$JS.API.CONSUMER.CREATE." + vd + ".>", holders: []string{proc, fwd}, need: "to create a consumer of the verdict stream " + vd + " (seamguard forward's durable consumer)"},
		{verb: pub, pattern: "$JS.API.CONSUMER.INFO." + vd + ".*", holders: []string{proc, fwd}, need: "to look up a consumer of the verdict stream " + vd},
		{verb: pub, pattern: "$JS.API.CONSUMER.MSG.NEXT." + vd + ".*", holders: []string{proc, fwd}, need: "to pull verdicts from a consumer of the verdict stream " + vd},
		{verb: pub, pattern: "$JS.API.CONSUMER.*." + vd + ".>", holders: []string{proc}, need: "to manage its consumers of the verdict stream " + vd},
		{verb: pub, pattern: "$JS.API.CONSUMER.*." + obj + ".>", holders: []string{proc}, need: "to manage its consumers of the spill bucket " + n.Spills},
		{verb: pub, pattern: "$JS.ACK." + ev + ".>", holders: []string{proc}, need: "to acknowledge the events it consumed"},
		{verb: pub, pattern: "$JS.ACK.*.*." + ev + ".>", holders: []string{proc}, need: "to acknowledge the events it consumed"},
		{verb: pub, pattern: prefix + ".verdicts.>", holders: []string{proc}, need: "to publish verdicts"},
		{verb: pub, pattern: processor.KVSubjects(n.Sessions), holders: []string{proc}, need: "to write session snapshots"},
		{verb: pub, pattern: processor.KVSubjects(n.Leases), holders: []string{proc}, need: "to take and renew partition leases"},
		{verb: pub, pattern: "$O." + n.Spills + ".>", holders: []string{proc}, need: "to write spills"},
		{verb: sub, pattern: processorInbox + ".>", holders: []string{proc}, need: "to receive replies on the processor's inbox"},
		{verb: sub, pattern: prefix + ".recover.>", holders: []string{resp}, need: "to serve agents' requests for their spills (the recover service, on serve's --responder-* connection)"},
		{verb: sub, pattern: "$SRV.>", holders: []string{resp}, need: "to answer the discovery of its recover service (nats micro ls, info, stats)"},
		{verb: pub, pattern: "_INBOX.>", holders: []string{resp}, need: "to answer agents' requests to the recover service, in their inboxes"},
		{verb: pub, pattern: operatorInbox + ".>", holders: []string{resp}, need: "to answer the operator's discovery of the recover service"},

		// The forwarder's (seamguard forward, forward failed, forward retry).
		{verb: pub, pattern: "$JS.ACK." + vd + ".>", holders: []string{fwd}, need: "to acknowledge the verdicts it forwarded"},
		{verb: pub, pattern: "$JS.ACK.*.*." + vd + ".>", holders: []string{fwd}, need: "to acknowledge the verdicts it forwarded"},
		{verb: pub, pattern: "$JS.API.STREAM.CREATE." + und, holders: []string{fwd}, need: "to create the undeliverable stream " + und},
		{verb: pub, pattern: "$JS.API.STREAM.INFO." + und, holders: []string{fwd}, need: "to look up the undeliverable stream " + und},
		{verb: pub, pattern: "$JS.API.STREAM.MSG.GET." + und, holders: []string{fwd}, need: "to read what forwarders could not deliver (forward failed, retry)"},
		{verb: pub, pattern: "$JS.API.STREAM.MSG.DELETE." + und, holders: []string{fwd}, need: "to remove a kept verdict forward retry delivered"},
		{verb: pub, pattern: prefix + ".undeliverable.>", holders: []string{fwd}, need: "to keep a verdict it could not deliver"},
		{verb: sub, pattern: forwarderInbox + ".>", holders: []string{fwd}, need: "to receive replies on the forwarder's inbox"},

		// The agents'.
		{verb: pub, pattern: prefix + ".events.>", holders: []string{agent}, need: "to publish session events"},
		{verb: pub, pattern: prefix + ".recover.>", holders: []string{agent}, need: "to ask the recover service for a session's spill"},
		{verb: sub, pattern: "_INBOX.>", holders: []string{agent}, need: "to receive replies on NATS's default inbox"},

		// No shipped identity: users of the system account.
		{verb: pub, pattern: "$SYS.REQ.>", need: "to ask the servers whether they sync before acknowledging (a user of the system account may; serve carries on without)"},
	}
}

// grantFor returns the first grant of grants that covers verb on subject.
func grantFor(grants []grant, verb, subject string) (grant, bool) {
	for _, g := range grants {
		if g.verb == verb && subjectMatches(g.pattern, subject) && (g.when == nil || g.when(subject)) {
			return g, true
		}
	}
	return grant{}, false
}

// subjectMatches reports whether subject matches pattern, token by token:
// "*" matches one token, a final ">" one or more.
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range p {
		if t == ">" {
			return i == len(p)-1 && len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// A denial is one publish or subscription the server refused.
type denial struct {
	verb    string // "publish", "subscribe", or "reply": publish with subject as the reply subject
	subject string
}

// action says what was refused: publish to "X", subscribe to "X".
func (v denial) action() string {
	if v.verb == "reply" {
		return fmt.Sprintf("publish with the reply subject %q", v.subject)
	}
	return fmt.Sprintf("%s to %q", v.verb, v.subject)
}

var violationRe = regexp.MustCompile(`Permissions Violation for (Publish to|Subscription to|Publish with Reply of) "([^"]*)"`)

// denialOf reads the denial out of a nats.ErrPermissionViolation error.
func denialOf(err error) (denial, bool) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return denial{}, false
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return denial{verb: "publish", subject: "(" + err.Error() + ")"}, true
	}
	verb := map[string]string{"Publish to": "publish", "Subscription to": "subscribe", "Publish with Reply of": "reply"}[m[1]]
	return denial{verb: verb, subject: m[2]}, true
}

// denials records the permissions violations the server reports on one
// connection. nats.go reports a violation asynchronously (its error
// handler), while the request that caused it waits for an answer that never
// comes; so the recorder can cancel the contexts of the operations under
// way (cancelOn), and explain says what was refused instead of the timeout
// that follows. Its methods may be called concurrently.
type denials struct {
	nc     *nats.Conn
	user   string // --user; "" when the identity is a creds file or an NKey
	inbox  string // the connection's inbox prefix
	grants []grant
	prefer string // the shipped identity to suggest first: operator for the CLI, processor for serve

	mu     sync.Mutex
	seen   []denial // each once, the first maxDenials
	last   denial   // the latest
	hooks  map[int]hook
	nextID int
	other  func(error)  // other asynchronous errors
	report func(denial) // every denial, as it is recorded
	told   map[string]bool

	// quiet, set by silence, stops other and report: a connection's
	// asynchronous errors may come after the command that logs them has
	// returned. callMu is held while they run.
	callMu sync.Mutex
	quiet  bool
}

// silence stops every later call of other and report, and waits for the one
// running, if any. Call it before the writer they log to goes away.
func (d *denials) silence() {
	d.callMu.Lock()
	d.quiet = true
	d.callMu.Unlock()
}

// call runs f unless silenced.
func (d *denials) call(f func()) {
	d.callMu.Lock()
	defer d.callMu.Unlock()
	if !d.quiet {
		f()
	}
}

// first reports whether v is the first denial of its grant (or, when no
// grant covers it, of its subject) that first was asked about.
func (d *denials) first(v denial) bool {
	key := v.verb + " " + v.subject
	if g, ok := grantFor(d.grants, v.verb, v.subject); ok {
		key = g.verb + " " + g.pattern
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.told[key] || len(d.told) >= maxDenials {
		// Told before; or a connection denied ever new subjects (none of
		// them granted to anyone) stops telling past the bound.
		return false
	}
	if d.told == nil {
		d.told = map[string]bool{}
	}
	d.told[key] = true
	return true
}

type hook struct {
	match  func(denial) bool
	cancel context.CancelFunc
}

func (d *denials) handle(_ *nats.Conn, _ *nats.Subscription, err error) {
	v, ok := denialOf(err)
	d.mu.Lock()
	if !ok {
		other := d.other
		d.mu.Unlock()
		if other != nil {
			d.call(func() { other(err) })
		}
		return
	}
	d.last = v
	if !contains(d.seen, v) && len(d.seen) < maxDenials {
		d.seen = append(d.seen, v)
	}
	var cancels []context.CancelFunc
	for _, h := range d.hooks {
		if h.match == nil || h.match(v) {
			cancels = append(cancels, h.cancel)
		}
	}
	report := d.report
	d.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	if report != nil {
		d.call(func() { report(v) })
	}
}

// cancelOn returns a context that ends with ctx, or as soon as the server
// refuses a permission that match accepts (nil: any), so that a command
// stops at once instead of waiting out its timeouts. Call the cancel
// function when done with it.
func (d *denials) cancelOn(ctx context.Context, match func(denial) bool) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	d.mu.Lock()
	id := d.nextID
	d.nextID++
	if d.hooks == nil {
		d.hooks = map[int]hook{}
	}
	d.hooks[id] = hook{match: match, cancel: cancel}
	refused := false
	for _, v := range d.seen {
		refused = refused || match == nil || match(v)
	}
	d.mu.Unlock()
	if refused {
		cancel()
	}
	return ctx, func() {
		d.mu.Lock()
		delete(d.hooks, id)
		d.mu.Unlock()
		cancel()
	}
}

// maxDenials bounds the denials a connection keeps (a long-running serve
// may meet the same refusal again and again, on new subjects).
const maxDenials = 64

// recorded returns the denials seen so far, each once, those that match
// accepts (nil: all).
func (d *denials) recorded(match func(denial) bool) []denial {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []denial
	for _, v := range d.seen {
		if match == nil || match(v) {
			out = append(out, v)
		}
	}
	return out
}

func contains(list []denial, v denial) bool {
	for _, w := range list {
		if w == v {
			return true
		}
	}
	return false
}

// settle waits until the server's answers to everything sent so far have
// been read, and their violations recorded: a flush round trip, then the
// error handler's queue, which runs in order, up to the last error read.
func (d *denials) settle(timeout time.Duration) {
	if d.nc == nil || d.nc.IsClosed() {
		return
	}
	_ = d.nc.FlushTimeout(timeout)
	last, ok := denialOf(d.nc.LastError())
	if !ok {
		return
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		d.mu.Lock()
		done := d.last == last
		d.mu.Unlock()
		if done {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// explain returns the error a command reports: when the server refused it
// a permission (one that match accepts; nil: any), an error (errPermission)
// naming each refusal, what it was needed for and which shipped identity
// may, rather than err, which is then only the timeout or cancellation the
// refusal caused. Otherwise err.
func (d *denials) explain(err error, match func(denial) bool) error {
	if len(d.recorded(match)) == 0 {
		return err
	}
	d.settle(time.Second)
	seen := d.recorded(match)
	// The inbox first: when replies cannot arrive, nothing else can work.
	var lines []string
	for _, v := range seen {
		if d.isInbox(v) {
			lines = append(lines, d.describe(v))
		}
	}
	for _, v := range seen {
		if !d.isInbox(v) {
			lines = append(lines, d.describe(v))
		}
	}
	msg := lines[0]
	if len(lines) > 1 {
		msg = fmt.Sprintf("%d refusals:\n  - %s", len(lines), strings.Join(lines, "\n  - "))
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) {
		msg += fmt.Sprintf("\n(and then: %v)", err)
	}
	return fmt.Errorf("%w: %s", errPermission, msg)
}

// who names the connection's identity.
func (d *denials) who() string {
	if d.user != "" {
		return fmt.Sprintf("user %q", d.user)
	}
	return "this identity"
}

func (d *denials) inboxPrefix() string {
	if d.inbox == "" {
		return "_INBOX"
	}
	return d.inbox
}

func (d *denials) isInbox(v denial) bool {
	return v.verb == "subscribe" && strings.HasPrefix(v.subject, d.inboxPrefix()+".")
}

// describe says what was refused, what for, and who may.
func (d *denials) describe(v denial) string {
	if d.isInbox(v) {
		return d.describeInbox(v)
	}
	g, ok := grantFor(d.grants, v.verb, v.subject)
	if !ok {
		return fmt.Sprintf("%s may not %s, and no shipped identity (%s) may; grant it to %s", d.who(), v.action(), shippedConfig, d.whom())
	}
	s := fmt.Sprintf("%s may not %s, needed %s", d.who(), v.action(), g.need)
	holder := d.holder(g)
	switch {
	case holder == "":
		return s + fmt.Sprintf("; no shipped identity (%s) may: grant %s on %s to %s", shippedConfig, v.verb, g.pattern, d.whom())
	case holder == d.user:
		return s + fmt.Sprintf("; the shipped %s identity (%s) may, so this server's %s is not configured as shipped: grant %s on %s to it", holder, shippedConfig, holder, v.verb, g.pattern)
	}
	return s + fmt.Sprintf("; the shipped %s identity (%s) may: connect as %s (--user %s), or grant %s on %s to %s", holder, shippedConfig, holder, holder, v.verb, g.pattern, d.whom())
}

// whom is who, as the object of "grant ... to".
func (d *denials) whom() string {
	if d.user != "" {
		return fmt.Sprintf("user %q", d.user)
	}
	return "this user"
}

// holder is the shipped identity to suggest for g: the preferred one if it
// holds g, else the first that does ("" if none).
func (d *denials) holder(g grant) string {
	for _, h := range g.holders {
		if h == d.prefer {
			return h
		}
	}
	if len(g.holders) > 0 {
		return g.holders[0]
	}
	return ""
}

// describeInbox explains a refused subscription to the connection's own
// inbox: the replies to its requests cannot arrive.
func (d *denials) describeInbox(v denial) string {
	inbox := d.inboxPrefix()
	whose := ""
	if g, ok := grantFor(d.grants, "subscribe", v.subject); ok && len(g.holders) == 1 {
		whose = fmt.Sprintf(", the shipped %s identity's", g.holders[0])
		if g.holders[0] == d.user {
			return fmt.Sprintf("%s may not subscribe to %q, its inbox, where the replies to this command's requests arrive (--inbox-prefix %s%s): this server's %s is not configured as shipped (%s); grant subscribe on %s.> to it",
				d.who(), v.subject, inbox, whose, d.user, shippedConfig, inbox)
		}
	}
	s := fmt.Sprintf("%s may not subscribe to %q, the inbox where the replies to this command's requests arrive (--inbox-prefix %s%s); pass this identity's own inbox prefix with --inbox-prefix (or SEAMGUARD_INBOX_PREFIX)", d.who(), v.subject, inbox, whose)
	if own, ok := shippedInboxes[d.user]; ok && own != inbox {
		s += fmt.Sprintf(": --inbox-prefix %s for the shipped %s identity", own, d.user)
	} else {
		s += ", e.g. --inbox-prefix _INBOX, NATS's default, which the shipped agent identity uses"
	}
	return s
}
