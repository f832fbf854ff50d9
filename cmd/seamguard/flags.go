package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/seamguard/seamguard/events"
)

// envName is the environment variable that sets a flag: SEAMGUARD_ and the
// flag's name in upper case with '-' as '_' (--nats-url: SEAMGUARD_NATS_URL).
func envName(flagName string) string {
	return "SEAMGUARD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag of fs that was not given on the command line from
// its environment variable, if that is set. It reports every bad value.
func applyEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
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
	fs.StringVar(&c.password, "password", "", "NATS password")
	fs.StringVar(&c.tlsCA, "tlsca", "", "CA certificate file to verify the NATS server")
	fs.StringVar(&c.tlsCert, "tlscert", "", "client certificate file for TLS")
	fs.StringVar(&c.tlsKey, "tlskey", "", "client private key file for TLS")
	fs.DurationVar(&c.timeout, "connect-timeout", 5*time.Second, "how long to try to reach the NATS server")
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

// durationValue parses "7d" as well as Go durations, for retention flags.
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a number of days", s)
		}
		*v.d = time.Duration(n) * 24 * time.Hour
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration such as 90m, 48h or 7d", s)
	}
	*v.d = d
	return nil
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

// sizeValue is a flag of a byte count: a plain number of bytes, or one
// with a suffix KiB, MiB, GiB or TiB (KB, MB, GB, TB and K, M, G, T are
// read as the same powers of 1024).
type sizeValue struct{ n *int64 }

func (v sizeValue) String() string {
	if v.n == nil {
		return "0"
	}
	return strconv.FormatInt(*v.n, 10)
}

func (v sizeValue) Set(s string) error {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("%q is not a size: use a number of bytes, or one with KiB, MiB, GiB or TiB, e.g. 512MiB", s)
	}
	*v.n = n * mult
	return nil
}
