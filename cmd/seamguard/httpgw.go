package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/gateway"
	"github.com/seamguard/seamguard/gateway/read"
	"github.com/seamguard/seamguard/processor"
)

// identityFlags are the credentials of one of the HTTP gateway's NATS
// connections (--http-agent-*, --http-operator-*). Server, TLS and
// timeout are the processor connection's.
type identityFlags struct {
	role                        string // agent or operator
	creds, nkey, user, password string
}

func (f *identityFlags) register(fs *flag.FlagSet, what string) {
	p := "http-" + f.role + "-"
	fs.StringVar(&f.creds, p+"creds", "", "credentials file of the NATS identity the HTTP gateway "+what+" as")
	fs.StringVar(&f.nkey, p+"nkey", "", "NKey seed file of the NATS identity the HTTP gateway "+what+" as")
	fs.StringVar(&f.user, p+"user", "", "NATS user the HTTP gateway "+what+" as, e.g. "+f.role+" in deploy/nats")
	fs.StringVar(&f.password, p+"password", "", "password of --"+p+"user; prefer the environment variable "+envName(p+"password"))
}

func (f *identityFlags) set() bool { return f.creds != "" || f.nkey != "" || f.user != "" }

func (f *identityFlags) conn(base connFlags) connFlags {
	c := base
	c.creds, c.nkey, c.user, c.password = f.creds, f.nkey, f.user, f.password
	c.inbox = ""
	if f.role == "operator" {
		c.inbox = operatorInbox
	}
	return c
}

// httpFlags are serve's HTTP gateway flags.
type httpFlags struct {
	listen, tokens  string
	agent, operator identityFlags

	loaded *gateway.Tokens // by validate
}

func (h *httpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.listen, "http-listen", "", "serve CloudEvents over HTTP (POST /v1/events, GET spills and verdicts; see docs/http.md) on HOST:PORT; without --http-tokens only a loopback address is accepted; empty: none")
	fs.StringVar(&h.tokens, "http-tokens", "", "the HTTP gateway's token `FILE`: lines of SHA256-HEX ROLE [SESSIONS...] (seamguard http-token makes one); reloaded on SIGHUP")
	h.agent.role, h.operator.role = "agent", "operator"
	h.agent.register(fs, "publishes events")
	h.operator.register(fs, "publishes control events (session.resumed)")
}

// validate checks the flags, loads the token file and checks the listen
// address against it.
func (h *httpFlags) validate(base connFlags) error {
	var errs []error
	for _, f := range []*identityFlags{&h.agent, &h.operator} {
		if f.password != "" && f.user == "" {
			errs = append(errs, fmt.Errorf("%w: --http-%s-password needs --http-%s-user", errUsage, f.role, f.role))
		}
		if !f.set() {
			continue
		}
		if h.listen == "" {
			errs = append(errs, fmt.Errorf("%w: --http-%s-* flags need --http-listen", errUsage, f.role))
		}
		if base.url == "" {
			errs = append(errs, fmt.Errorf("%w: --http-%s-* flags need --nats-url: the embedded server has no users (the gateway uses serve's own connection there)", errUsage, f.role))
		}
		c := f.conn(base)
		if err := c.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w (the --http-%s-* flags)", err, f.role))
		}
	}
	if h.listen == "" {
		if h.tokens != "" {
			errs = append(errs, fmt.Errorf("%w: --http-tokens needs --http-listen", errUsage))
		}
		return errors.Join(errs...)
	}
	if base.url != "" && !h.agent.set() {
		errs = append(errs, fmt.Errorf("%w: --http-listen with --nats-url needs the NATS identity the gateway publishes events as (--http-agent-user, --http-agent-creds or --http-agent-nkey; agent in deploy/nats): serve's own identity may not publish events, and should not", errUsage))
	}
	if h.tokens != "" {
		t, err := gateway.LoadTokens(h.tokens)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: --http-tokens: %v", errUsage, err))
		}
		h.loaded = t
	}
	if err := gateway.CheckListen(h.listen, h.tokens != ""); err != nil {
		errs = append(errs, fmt.Errorf("%w: --http-listen: %v", errUsage, err))
	}
	return errors.Join(errs...)
}

// connect returns the gateway's agent and operator connections: their own
// identities when given, else (the embedded default) serve's connection
// for both. closeAll closes what it opened.
func (h *httpFlags) connect(base connFlags, url string, own *nats.Conn, grants []grant, log *slog.Logger) (agent, operator *nats.Conn, closeAll func(), err error) {
	var opened []*nats.Conn
	var silence []*denials
	closeAll = func() {
		for _, nc := range opened {
			nc.Close()
		}
		for _, d := range silence {
			d.silence()
		}
	}
	dial := func(f *identityFlags) (*nats.Conn, error) {
		c := f.conn(base)
		d := &denials{grants: grants, prefer: f.role, other: func(err error) {
			log.Warn("NATS reported an error on the HTTP gateway's "+f.role+" connection", "err", err)
		}}
		d.report = func(v denial) {
			if d.first(v) {
				log.Error("NATS refused a permission to the HTTP gateway's "+f.role+" connection", "refusal", d.describe(v))
			}
		}
		silence = append(silence, d)
		nc, err := c.connect("seamguard serve http "+f.role, url, d, nats.ReconnectBufSize(-1))
		if err != nil {
			return nil, fmt.Errorf("the HTTP gateway's %s connection (--http-%s-*): %w", f.role, f.role, err)
		}
		opened = append(opened, nc)
		return nc, nil
	}
	switch {
	case h.agent.set():
		if agent, err = dial(&h.agent); err != nil {
			return nil, nil, closeAll, err
		}
	default:
		agent = own // embedded: no users
	}
	switch {
	case h.operator.set():
		if operator, err = dial(&h.operator); err != nil {
			return nil, nil, closeAll, err
		}
	case base.url == "":
		operator = own
	}
	return agent, operator, closeAll, nil
}

// serveGateway serves the HTTP gateway on ln until ctx ends, then shuts
// it down (requests in flight get 5s); done is closed once it has.
func serveGateway(ctx context.Context, ln net.Listener, gw http.Handler, tokens *gateway.Tokens, readers *read.Handler, log *slog.Logger) (done <-chan struct{}) {
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	if readers != nil {
		// Open verdict streams end at shutdown rather than hold it up.
		srv.RegisterOnShutdown(readers.Close)
	}
	ch := make(chan struct{})
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("HTTP gateway stopped", "err", err)
		}
	}()
	stopHUP := func() {}
	if tokens != nil {
		stopHUP = reloadOnHUP(ctx, tokens, log)
	}
	go func() {
		defer close(ch)
		<-ctx.Done()
		stopHUP()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	return ch
}

// reloadOnHUP reloads tokens on every SIGHUP until ctx ends or stop is
// called. A file that does not load leaves the tokens in use as they were,
// and is logged.
func reloadOnHUP(ctx context.Context, tokens *gateway.Tokens, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := tokens.Reload(); err != nil {
					log.Error("SIGHUP: the HTTP token file did not load; the tokens in use stay as they were", "err", err)
					continue
				}
				log.Info("SIGHUP: HTTP token file reloaded", "tokens", tokens.Len())
			}
		}
	}()
	return func() { signal.Stop(hup); <-done }
}

// startGateway builds the gateway on p's streams and serves it on ln
// until ctx ends or stop is called; stop shuts it down (requests in
// flight get 5s), waits, and closes its connections. Call it before
// serve's own connection is drained.
func startGateway(ctx context.Context, h *httpFlags, ln net.Listener, base connFlags, url string, nc *nats.Conn, js jetstream.JetStream, pc processor.Config, signingKey string, grants []grant, log *slog.Logger) (stop func(), err error) {
	agent, operator, closeAll, err := h.connect(base, url, nc, grants, log)
	if err != nil {
		closeAll()
		return nil, err
	}
	n := pc.Names()
	maxEvent := agent.MaxPayload()
	if str, err := js.Stream(ctx, n.Events); err == nil {
		// The events stream may bound its messages below max_payload.
		if m := int64(str.CachedInfo().Config.MaxMsgSize); m > 0 && m < maxEvent {
			maxEvent = m
		}
	}
	var verdicts jetstream.JetStream // the operator's: the processor may not read verdicts
	if operator != nil {
		if verdicts, err = jetstream.New(operator); err != nil {
			closeAll()
			return nil, err
		}
	}
	gw, err := gateway.New(gateway.Config{
		Subjects: pc.Subjects(), EventsStream: n.Events, VerdictsStream: n.Verdicts,
		Agent: agent, Operator: operator, Reader: js, Verdicts: verdicts,
		Auth: &gateway.Auth{Tokens: h.loaded}, Logger: log, MaxEventBytes: maxEvent,
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	readers, err := mountReads(gw, verdicts, pc, signingKey, log)
	if err != nil {
		closeAll()
		return nil, err
	}
	gctx, cancel := context.WithCancel(ctx)
	done := serveGateway(gctx, ln, gw, h.loaded, readers, log)
	auth := "none: every caller is the operator (loopback only)"
	if h.loaded != nil {
		auth = fmt.Sprintf("bearer tokens from %s (%d)", h.tokens, h.loaded.Len())
	}
	control := "no (give --http-operator-*)"
	if operator != nil {
		control = "yes"
	}
	log.Info("HTTP gateway", "url", "http://"+ln.Addr().String()+"/v1/events", "auth", auth, "control_events", control, "reads", readers != nil)
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done; closeAll() }) }, nil
}

// mountReads mounts the read endpoints (a spill's chain, verdicts as
// Server-Sent Events) on gw, reading with js: the operator identity's,
// since the processor's may not read verdicts. Without one (--nats-url and
// no --http-operator-*) they answer 503 saying so, and readers is nil.
// Verdicts are genuine when signed by this processor's key or one of
// SEAMGUARD_TRUSTED_KEYS (the other instances' keys, where each has its own).
func mountReads(gw *gateway.Server, js jetstream.JetStream, pc processor.Config, signingKey string, log *slog.Logger) (readers *read.Handler, err error) {
	if js == nil {
		off := func(w http.ResponseWriter, r *http.Request) {
			gateway.WriteError(w, http.StatusServiceUnavailable, errors.New("gateway: reading spills and verdicts needs a NATS identity that may read them: start serve with --http-operator-* (operator in deploy/nats)"))
		}
		gw.Mount(read.PatternSpill, http.HandlerFunc(off))
		gw.Mount(read.PatternVerdicts, http.HandlerFunc(off))
		return nil, nil
	}
	trust, err := attest.ParseKeys(signingKey, os.Getenv(trustedKeysEnv))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", trustedKeysEnv, err)
	}
	h, err := read.New(js, readAccess{gw.Auth()}, read.Config{Prefix: pc.Prefix, Trust: trust}, read.WithLogger(log))
	if err != nil {
		return nil, err
	}
	gw.Mount(read.PatternSpill, http.HandlerFunc(h.Spill))
	gw.Mount(read.PatternVerdicts, http.HandlerFunc(h.Verdicts))
	return h, nil
}

// readAccess is the gateway's bearer-token Auth as the read endpoints ask
// it: an unknown caller is a 401, a known one reaching too far a 403.
type readAccess struct{ auth *gateway.Auth }

func (a readAccess) Session(r *http.Request, session string) error {
	return asDenial(a.auth.Session(r, session))
}

func (a readAccess) Operator(r *http.Request) error { return asDenial(a.auth.Operator(r)) }

func asDenial(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gateway.ErrUnauthenticated):
		return read.Deny(http.StatusUnauthorized, "%v", err)
	default:
		return read.Deny(http.StatusForbidden, "%v", err)
	}
}

const httpTokenUsage = `usage: seamguard http-token [flags]

Makes a bearer token for the HTTP gateway (serve --http-listen --http-tokens
FILE): prints the token, then the line to add to the token file, which holds
only the token's SHA-256, never the token. With --stdin it hashes the token read
from standard input instead of making one (the same as sha256sum of the token
without a newline). Send SIGHUP to serve to load the file again.

flags:`

func runHTTPToken(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("http-token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String("role", "agent", "agent or operator")
	sessions := fs.String("sessions", "", "with --role agent: the sessions the token may reach, comma-separated ids or prefixes ending in '*' ('*': every session)")
	label := fs.String("label", "", "a name for the token, written after '#' on its line (logs name the token by it)")
	fromStdin := fs.Bool("stdin", false, "hash the token read from standard input (one line) instead of making one")
	fs.Usage = func() {
		fmt.Fprintln(stderr, httpTokenUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: http-token takes no arguments (a token on the command line would show in ps; use --stdin)", errUsage)
	}
	var list []string
	for _, s := range strings.Split(*sessions, ",") {
		if s = strings.TrimSpace(s); s != "" {
			list = append(list, s)
		}
	}
	token := ""
	if *fromStdin {
		b, err := io.ReadAll(io.LimitReader(stdin, 4096))
		if err != nil {
			return err
		}
		token = strings.TrimRight(string(b), "\r\n")
		if token == "" {
			return fmt.Errorf("%w: --stdin read no token", errUsage)
		}
	} else {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		token = "sgt_" + base64.RawURLEncoding.EncodeToString(b)
	}
	line := gateway.HashToken(token) + " " + *role
	if len(list) > 0 {
		line += " " + strings.Join(list, " ")
	}
	if *label != "" {
		line += " # " + *label
	}
	if _, err := gateway.ParseTokens([]byte(line)); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if !*fromStdin {
		fmt.Fprintf(stdout, "token: %s\n", token)
	}
	fmt.Fprintln(stdout, line)
	return nil
}
