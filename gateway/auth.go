package gateway

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/seamguard/seamguard/events"
)

// Role is what a bearer token may do; the roles are those of the NATS
// identities of deploy/nats (permissions.conf).
type Role string

// Roles of a token file.
const (
	// RoleAgent publishes events of its sessions (and reads their spills
	// and verdicts); never control events.
	RoleAgent Role = "agent"
	// RoleOperator publishes control events (session.resumed) and events,
	// and reads, on every session.
	RoleOperator Role = "operator"
)

// Errors of authentication and authorisation; errors of Auth's methods
// wrap one of them, and StatusOf maps them to 401 and 403.
var (
	// ErrUnauthenticated: no bearer token, or one the token file does not
	// hold.
	ErrUnauthenticated = errors.New("gateway: no valid bearer token")
	// ErrForbidden: the token is valid but its role may not do this.
	ErrForbidden = errors.New("gateway: forbidden")
	// ErrTokenFile: a token file that cannot be read or parsed.
	ErrTokenFile = errors.New("gateway: bad token file")
)

// Principal is who made a request: the role of its token and, for an
// agent, the sessions it may reach.
type Principal struct {
	Role Role
	// Name is the token's label in the file (its line number when it has
	// none), for logs; never the token.
	Name string
	// Sessions are session ids, and prefixes ending in '*', that an agent
	// may reach; "*" alone is every session.
	Sessions []string
}

// MaySession reports whether p may reach session.
func (p Principal) MaySession(session string) bool {
	if p.Role == RoleOperator {
		return true
	}
	for _, s := range p.Sessions {
		if pre, ok := strings.CutSuffix(s, "*"); ok {
			if strings.HasPrefix(session, pre) {
				return true
			}
		} else if s == session {
			return true
		}
	}
	return false
}

// tokenEntry is one line of a token file.
type tokenEntry struct {
	hash [sha256.Size]byte
	p    Principal
}

// Tokens is a token file loaded in memory: SHA-256 hashes of bearer tokens,
// each mapped to a Principal. The file holds no secret, only hashes. Any
// goroutine may call its methods at any time; Reload swaps the whole set at
// once. A nil *Tokens means no token file (see Auth).
type Tokens struct {
	path    string
	mu      sync.RWMutex
	entries []tokenEntry
}

// LoadTokens reads the token file at path.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the token file again and, if it parses, replaces the tokens
// in use: a token removed from the file is refused from then on. On an
// error the tokens in use stay as they were.
func (t *Tokens) Reload() error {
	b, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrTokenFile, err)
	}
	entries, err := ParseTokens(b)
	if err != nil {
		return fmt.Errorf("%s: %w", t.path, err)
	}
	t.mu.Lock()
	t.entries = entries
	t.mu.Unlock()
	return nil
}

// Len is the number of tokens in use.
func (t *Tokens) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.entries)
}

// ParseTokens parses a token file: one token a line,
//
//	SHA256-HEX ROLE [SESSION|PREFIX*]... [#LABEL]
//
// where ROLE is agent or operator, an agent lists the sessions (ids, or
// prefixes ending in '*'; '*' alone is every session) it may reach, and an
// operator lists none. Blank lines and lines starting with '#' are
// ignored. Every problem is reported at once, with its line.
func ParseTokens(b []byte) ([]tokenEntry, error) {
	var out []tokenEntry
	var errs []error
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		label := fmt.Sprintf("line %d", n)
		if i := strings.Index(line, "#"); i >= 0 {
			if l := strings.TrimSpace(line[i+1:]); l != "" {
				label = l
			}
			line = strings.TrimSpace(line[:i])
		}
		f := strings.Fields(line)
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: line %d: %s", ErrTokenFile, n, fmt.Sprintf(format, args...)))
		}
		if len(f) < 2 {
			bad("want SHA256-HEX ROLE [SESSIONS...], got %d fields", len(f))
			continue
		}
		var e tokenEntry
		h, err := hex.DecodeString(f[0])
		if err != nil || len(h) != sha256.Size {
			bad("the first field must be the token's SHA-256 in 64 hex digits (seamguard http-token hashes one; or sha256sum), not the token itself")
			continue
		}
		copy(e.hash[:], h)
		if prev, dup := seen[e.hash]; dup {
			bad("the same token hash as line %d", prev)
			continue
		}
		seen[e.hash] = n
		e.p = Principal{Role: Role(f[1]), Name: label}
		switch e.p.Role {
		case RoleOperator:
			if len(f) > 2 {
				bad("an operator token reaches every session; list no sessions")
				continue
			}
		case RoleAgent:
			if len(f) == 2 {
				bad("an agent token needs the sessions it may reach: ids, prefixes ending in '*', or '*' for every session")
				continue
			}
			ok := true
			for _, s := range f[2:] {
				pre, _ := strings.CutSuffix(s, "*")
				if strings.Contains(pre, "*") || (pre != "" && !validPrefix(pre)) {
					bad("%q is not a session id or a prefix of one followed by '*'", s)
					ok = false
				}
			}
			if !ok {
				continue
			}
			e.p.Sessions = f[2:]
		default:
			bad("role %q: use agent or operator", f[1])
			continue
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %v", ErrTokenFile, err))
	}
	return out, errors.Join(errs...)
}

func validPrefix(s string) bool {
	return len(s) <= events.MaxSessionIDLen && events.ValidSessionID(s)
}

// HashToken returns what a token file holds for token: its SHA-256 in
// lower-case hex (the same as `printf %s TOKEN | sha256sum`).
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// lookup returns the principal of token. It compares the token's hash with
// every entry in constant time, so the time taken says nothing of which
// hashes the file holds.
func (t *Tokens) lookup(token string) (Principal, bool) {
	h := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	var found Principal
	ok := 0
	for i := range t.entries {
		if subtle.ConstantTimeCompare(h[:], t.entries[i].hash[:]) == 1 {
			found, ok = t.entries[i].p, 1
		}
	}
	return found, ok == 1
}

// Auth decides who a request is and what it may reach. With Tokens nil
// (no token file; the gateway then listens on loopback only, see
// CheckListen) every request is the operator. Other packages serving
// under the gateway (the read endpoints) call Session and Operator before
// they answer. Any goroutine may use an Auth.
type Auth struct {
	Tokens *Tokens
}

// Principal returns who made r: the principal of its bearer token, or an
// error wrapping ErrUnauthenticated.
func (a *Auth) Principal(r *http.Request) (Principal, error) {
	if a == nil || a.Tokens == nil {
		return Principal{Role: RoleOperator, Name: "loopback (no token file)"}, nil
	}
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if h == "" {
		return Principal{}, fmt.Errorf("%w: send Authorization: Bearer <token>", ErrUnauthenticated)
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return Principal{}, fmt.Errorf("%w: the Authorization header must be \"Bearer <token>\"", ErrUnauthenticated)
	}
	p, found := a.Tokens.lookup(strings.TrimSpace(tok))
	if !found {
		return Principal{}, fmt.Errorf("%w: the token is not in the gateway's token file (revoked, or mistyped)", ErrUnauthenticated)
	}
	return p, nil
}

// Session returns nil if the caller of r may reach session (publish its
// events, read its spills and verdicts); else an error wrapping
// ErrUnauthenticated or ErrForbidden.
func (a *Auth) Session(r *http.Request, session string) error {
	p, err := a.Principal(r)
	if err != nil {
		return err
	}
	if !p.MaySession(session) {
		return fmt.Errorf("%w: token %s (role %s) may not reach session %q; its sessions are %s", ErrForbidden, p.Name, p.Role, session, strings.Join(p.Sessions, " "))
	}
	return nil
}

// Operator returns nil if the caller of r has the operator role (control
// events, every session); else an error wrapping ErrUnauthenticated or
// ErrForbidden.
func (a *Auth) Operator(r *http.Request) error {
	p, err := a.Principal(r)
	if err != nil {
		return err
	}
	if p.Role != RoleOperator {
		return fmt.Errorf("%w: token %s has role %s; this needs an operator token", ErrForbidden, p.Name, p.Role)
	}
	return nil
}
