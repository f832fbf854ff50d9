package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/inspect"
	"github.com/seamguard/seamguard/processor"
)

// envName is the environment variable that sets a flag: SEAMGUARD_ and the
// flag's name in upper case with '-' as '_' (--nats-url: SEAMGUARD_NATS_URL).
func envName(flagName string) string {
	return "SEAMGUARD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag of fs that was not given on the command line from
// its environment variable, if that is set. It reports every bad value.
// A password given on the command line, which every user of the machine
// can read in ps, gets a warning on fs's output (standard error) that names
// the variable to use instead.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["password"] {
		fmt.Fprintf(fs.Output(), "seamguard %s: warning: --password on the command line shows in ps and in the shell's history; set %s instead\n", fs.Name(), envName("password"))
	}
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s=%q: %v", errUsage, envName(f.Name), v, err))
		}
	})
	return errors.Join(errs...)
}

// connFlags are the NATS connection options, named as the NATS tools name them.
type connFlags struct {
	url      string
	creds    string
	nkey     string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	timeout  time.Duration
	// inbox is the prefix of this connection's reply subjects (JetStream
	// acks, API answers, fetched messages): each identity of the shipped
	// config may subscribe only to its own (see deploy/nats/accounts.conf).
	inbox string
}

// Inbox prefixes of the shipped identities (deploy/nats/accounts.conf):
// replies to the processor and to the operator's CLI go where no agent may
// subscribe. Agents keep NATS's default, _INBOX.
const (
	processorInbox = "_INBOX_processor"
	operatorInbox  = "_INBOX_operator"
)

func (c *connFlags) register(fs *flag.FlagSet, urlHelp string) {
	fs.StringVar(&c.url, "nats-url", c.url, urlHelp)
	fs.StringVar(&c.creds, "creds", "", "NATS user credentials file (JWT and NKey seed)")
	fs.StringVar(&c.nkey, "nkey", "", "NATS NKey seed file")
	fs.StringVar(&c.user, "user", "", "NATS user name")
	fs.StringVar(&c.password, "password", "", "NATS password; prefer the environment variable "+envName("password")+": a command line shows in ps")
	fs.StringVar(&c.tlsCA, "tlsca", "", "CA certificate file to verify the NATS server")
	fs.StringVar(&c.tlsCert, "tlscert", "", "client certificate file for TLS")
	fs.StringVar(&c.tlsKey, "tlskey", "", "client private key file for TLS")
	fs.Var(durations(&c.timeout, 5*time.Second, 100*time.Millisecond, 10*time.Minute), "connect-timeout", "how long to try to reach the NATS server")
	fs.StringVar(&c.inbox, "inbox-prefix", c.inbox, "prefix of this connection's reply subjects; the identity must be allowed to subscribe to <prefix>.>")
}

func (c *connFlags) validate() error {
	var errs []error
	if (c.tlsCert == "") != (c.tlsKey == "") {
		errs = append(errs, fmt.Errorf("%w: --tlscert and --tlskey go together; give both or neither", errUsage))
	}
	if err := (events.Subjects{Prefix: c.inbox}).Validate(); c.inbox != "" && err != nil {
		errs = append(errs, fmt.Errorf("%w: --inbox-prefix %q: use dot-separated tokens without wildcards or spaces", errUsage, c.inbox))
	}
	if c.password != "" && c.user == "" {
		errs = append(errs, fmt.Errorf("%w: --password needs --user", errUsage))
	}
	n := 0
	for _, s := range []string{c.creds, c.nkey, c.user} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		errs = append(errs, fmt.Errorf("%w: give one of --creds, --nkey and --user, not several", errUsage))
	}
	for _, f := range []struct{ flag, path string }{{"--creds", c.creds}, {"--nkey", c.nkey}, {"--tlsca", c.tlsCA}, {"--tlscert", c.tlsCert}, {"--tlskey", c.tlsKey}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s %s: %v", errUsage, f.flag, f.path, err))
		}
	}
	return errors.Join(errs...)
}

// connect dials url (c.url when empty) with the options of c, and extra.
// The server's asynchronous errors go to d: it records the permissions
// violations (see denials) and passes the others on.
func (c *connFlags) connect(name, url string, d *denials, extra ...nats.Option) (*nats.Conn, error) {
	if url == "" {
		url = c.url
	}
	opts := []nats.Option{nats.Name(name), nats.Timeout(c.timeout), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if c.inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.inbox))
	}
	opts = append(opts, extra...)
	d.user, d.inbox = c.user, c.inbox
	opts = append(opts, nats.ErrorHandler(d.handle))
	switch {
	case c.creds != "":
		opts = append(opts, nats.UserCredentials(c.creds))
	case c.nkey != "":
		o, err := nats.NkeyOptionFromSeed(c.nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey %s: %w", c.nkey, err)
		}
		opts = append(opts, o)
	case c.user != "":
		opts = append(opts, nats.UserInfo(c.user, c.password))
	}
	if c.tlsCA != "" {
		opts = append(opts, nats.RootCAs(c.tlsCA))
	}
	if c.tlsCert != "" {
		opts = append(opts, nats.ClientCert(c.tlsCert, c.tlsKey))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to NATS at %s: %w; check --nats-url (or SEAMGUARD_NATS_URL) and that the server runs", url, err)
	}
	d.nc = nc
	return nc, nil
}

// bounded is a numeric flag that takes only min to max, and 0 (or any
// negative value) too where the flag gives it a meaning. It checks at Set,
// so that a value from the environment (applyEnv) is held to the same
// bounds as one on the command line. parseInterleaved adds the bounds to
// the flag's usage text.
type bounded[T int | int64 | time.Duration] struct {
	p        *T
	min, max T
	zero     string // what 0 means; "" when 0 is out of range like any other value
	negative string // what a negative value means; "" when it is out of range
	unit     string // what the help calls a value: number, duration or size
	kind     string // what a value must look like, for an error
	parse    func(string) (T, error)
	format   func(T) string
}

// ints is an int flag for *p, set to def, that takes min to max.
func ints(p *int, def, min, max int) *bounded[int] {
	*p = def
	return &bounded[int]{p: p, min: min, max: max, unit: "number", kind: "a whole number",
		parse: func(s string) (int, error) {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 0, strconv.IntSize)
			return int(n), err
		},
		format: strconv.Itoa}
}

// durations is a duration flag for *p, set to def, that takes min to max.
// Besides Go's durations (90s, 15m, 48h) it reads a number of days: 7d.
func durations(p *time.Duration, def, min, max time.Duration) *bounded[time.Duration] {
	*p = def
	return &bounded[time.Duration]{p: p, min: min, max: max, unit: "duration", kind: "a duration such as 90s, 15m, 48h or 7d", parse: parseDuration, format: formatDuration}
}

// sizes is a byte count flag for *p, set to def, that takes min to max:
// a number of bytes, or one with a unit such as KiB or GiB (see parseSize).
func sizes(p *int64, def, min, max int64) *bounded[int64] {
	*p = def
	return &bounded[int64]{p: p, min: min, max: max, unit: "size", kind: "a size such as 4096, 512KiB or 1GiB", parse: parseSize, format: formatSize}
}

// What 0, or a negative value, means for the bounded flags that take it.
// A registration names them, and never writes a string literal before the
// flag's name: deploy's tests find serve's flags in this source as the
// first string literal of fs.Var(...).
const (
	meansDefault      = "the default"
	meansForever      = "forever"
	meansNever        = "never"
	meansNoLimit      = "no limit (until interrupted)"
	meansNoBucketMax  = "no limit but the server's storage"
	meansAutoReplicas = "3 on a cluster of 3 or more servers, else 1"
)

var (
	meansDefaultWidth      = fmt.Sprintf("the default, %d", inspect.DefaultWidth)
	meansDefaultPartitions = fmt.Sprintf("the existing stream's, or %d for a new one", processor.DefaultPartitions)
	meansShardsTimesQueue  = fmt.Sprintf("--shards times %d", processor.DefaultQueueDepth)
)

// orZero makes 0 a value of f too, meaning what.
func (f *bounded[T]) orZero(what string) *bounded[T] {
	f.zero = what
	return f
}

// orNegative makes every negative value a value of f too, meaning what.
func (f *bounded[T]) orNegative(what string) *bounded[T] {
	f.negative = what
	return f
}

func (f *bounded[T]) String() string {
	if f == nil || f.p == nil {
		return "0"
	}
	return f.format(*f.p)
}

func (f *bounded[T]) Set(s string) error {
	v, err := f.parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("not %s; use %s", f.kind, f.want())
	case v == 0 && f.zero != "", v < 0 && f.negative != "", v >= f.min && v <= f.max:
		*f.p = v
		return nil
	}
	return fmt.Errorf("out of range; use %s", f.want())
}

// bounds returns what -h calls a value of f, and which values f takes.
func (f *bounded[T]) bounds() (unit, want string) { return f.unit, f.want() }

// want says which values f takes.
func (f *bounded[T]) want() string {
	s := f.format(f.min) + " to " + f.format(f.max)
	if f.zero != "" {
		s += ", or 0 for " + f.zero
	}
	if f.negative != "" {
		s += ", or a negative value for " + f.negative
	}
	return s
}

// describeBounds adds to the usage text of each bounded flag of fs the
// values it takes, once, and the name -h shows for its value (number,
// duration or size) unless the text names it already (in backquotes).
func describeBounds(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		b, ok := f.Value.(interface{ bounds() (string, string) })
		if !ok {
			return
		}
		unit, bounds := b.bounds()
		if strings.Contains(f.Usage, bounds) {
			return
		}
		if !strings.Contains(f.Usage, "`") {
			unit = "`" + unit + "`"
		}
		f.Usage += " (" + unit + ": " + bounds + ")"
	})
}

// parseDuration reads a Go duration, or a number of days such as 7d.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n > math.MaxInt64/int64(24*time.Hour) || n < math.MinInt64/int64(24*time.Hour) {
			return 0, fmt.Errorf("%q is not a number of days", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

// formatDuration writes d as parseDuration reads it, short: 7d, 1h, 90s.
func formatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d == 0:
		return "0"
	case d%day == 0 && (d >= 2*day || d <= -2*day):
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// checkSession is the usage error for a session id given on the command
// line (as the flag named, or as an argument when flag is empty) that is
// not one; an empty flag value means "every session" and passes.
func checkSession(flag, id string) error {
	switch {
	case flag != "" && id == "", events.ValidSessionID(id):
		return nil
	case flag != "":
		return fmt.Errorf("%w: %s %q is not a session id (1 to 128 of A-Z a-z 0-9 _ -)", errUsage, flag, id)
	}
	return fmt.Errorf("%w: %q is not a session id (1 to 128 of A-Z a-z 0-9 _ -)", errUsage, id)
}

// parseSize reads a byte count: a plain number of bytes, or one with a
// suffix KiB, MiB, GiB, TiB, PiB or EiB (KB, MB, GB, TB, PB, EB and K, M,
// G, T, P, E are read as the same powers of 1024).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"EIB", 1 << 60}, {"PIB", 1 << 50}, {"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"EB", 1 << 60}, {"PB", 1 << 50}, {"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"E", 1 << 60}, {"P", 1 << 50}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size: use a number of bytes, or one with KiB, MiB, GiB or TiB, e.g. 512MiB", s)
	}
	return n * mult, nil
}

// formatSize writes n bytes as parseSize reads it, with the largest unit
// that divides it: 512KiB, 1GiB, 1000.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"EiB", 1 << 60}, {"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// responderFlags are the credentials of serve's second connection, the one
// the recover service answers on (processor.WithResponder): an identity
// that may publish to reply inboxes and nothing else (the shipped
// configuration's responder), so that no request can make the processor
// publish where its requester could not. Server, TLS and timeout are the
// processor connection's.
type responderFlags struct {
	creds, nkey, user, password string
}

func (r *responderFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.creds, "responder-creds", "", "credentials file of the identity the recover service answers as (it may publish only to reply inboxes); without any --responder-* flag, the processor's own connection answers")
	fs.StringVar(&r.nkey, "responder-nkey", "", "NKey seed file of the identity the recover service answers as")
	fs.StringVar(&r.user, "responder-user", "", "NATS user the recover service answers as, e.g. responder in deploy/nats")
	fs.StringVar(&r.password, "responder-password", "", "password of --responder-user; prefer the environment variable "+envName("responder-password"))
}

// set reports whether any responder credential is given.
func (r *responderFlags) set() bool {
	return r.creds != "" || r.nkey != "" || r.user != ""
}

// validate checks the responder flags as connFlags.validate checks the
// processor's own.
func (r *responderFlags) validate(base connFlags) error {
	if r.password != "" && r.user == "" {
		return fmt.Errorf("%w: --responder-password needs --responder-user", errUsage)
	}
	if !r.set() {
		return nil
	}
	c := r.conn(base)
	if err := c.validate(); err != nil {
		return fmt.Errorf("%w (the --responder-* flags)", err)
	}
	if base.url == "" {
		return fmt.Errorf("%w: --responder-* flags need --nats-url: the embedded server has no users", errUsage)
	}
	return nil
}

// conn is base with the responder's credentials in place of its own.
func (r *responderFlags) conn(base connFlags) connFlags {
	c := base
	c.creds, c.nkey, c.user, c.password = r.creds, r.nkey, r.user, r.password
	c.inbox = ""
	return c
}

// connect opens the responder's connection to url. Its refusals and
// errors are logged; call the returned denials' silence before log's
// writer goes away.
func (r *responderFlags) connect(base connFlags, url string, grants []grant, log *slog.Logger) (*nats.Conn, *denials, error) {
	c := r.conn(base)
	rd := &denials{grants: grants, prefer: "responder", other: func(err error) { log.Warn("NATS reported an error on the recover service's connection", "err", err) }}
	rd.report = func(v denial) {
		if rd.first(v) {
			log.Error("NATS refused a permission to the recover service's connection", "refusal", rd.describe(v))
		}
	}
	nc, err := c.connect("seamguard serve responder", url, rd, nats.ReconnectBufSize(-1),
		nats.PingInterval(5*time.Second), nats.MaxPingsOutstanding(2))
	if err != nil {
		return nil, rd, fmt.Errorf("the recover service's connection (--responder-*): %w", err)
	}
	return nc, rd, nil
}
