package attest

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Header names of a signed output.
const (
	HeaderSigner    = "Seamguard-Signer"
	HeaderSignature = "Seamguard-Signature"
)

// SignatureLen is the length of an encoded signature: 64 bytes in unpadded
// URL-safe base64.
const SignatureLen = 86

var sigEncoding = base64.RawURLEncoding

// Reasons a message fails verification (Error.Reason).
const (
	ReasonUnsigned     = "unsigned"
	ReasonBadSignature = "bad_signature"
	ReasonUntrusted    = "untrusted_signer"
	ReasonMisrouted    = "misrouted"
	ReasonMalformed    = "malformed"
)

// Sentinels, one per reason: errors.Is(err, ErrUnsigned) and so on. Every
// failure also matches ErrUnattributed.
var (
	ErrUnattributed = errors.New("attest: verdict not attributable to a trusted seamguard processor")
	ErrUnsigned     = errors.New("attest: unsigned")
	ErrBadSignature = errors.New("attest: bad signature")
	ErrUntrusted    = errors.New("attest: untrusted signer")
	ErrMisrouted    = errors.New("attest: verdict on the wrong subject")
	ErrMalformed    = errors.New("attest: signed body is not a verdict")
	// ErrKey: a key given to NewSigner, ParseKeys or NewVerifier is not
	// what it must be.
	ErrKey = errors.New("attest: bad key")
)

// Error is a verification failure: Reason says which check failed,
// Message says what was found and what it means, Signer is the key the
// message names (when it names one).
type Error struct {
	Reason  string
	Signer  string
	Message string
}

func (e *Error) Error() string { return "attest: " + e.Reason + ": " + e.Message }

// Is makes errors.Is(err, ErrUnattributed) and the reason's sentinel true.
func (e *Error) Is(target error) bool {
	if target == ErrUnattributed {
		return true
	}
	switch e.Reason {
	case ReasonUnsigned:
		return target == ErrUnsigned
	case ReasonBadSignature:
		return target == ErrBadSignature
	case ReasonUntrusted:
		return target == ErrUntrusted
	case ReasonMisrouted:
		return target == ErrMisrouted
	case ReasonMalformed:
		return target == ErrMalformed
	}
	return false
}

// Reason returns the Reason of err if it is (or wraps) an *Error, else "".
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// Signer signs output bodies with one NKey. Its methods are safe for
// concurrent use.
type Signer struct {
	priv   ed25519.PrivateKey
	public string
	seed   []byte
}

// NewSigner reads an NKey seed ("S…", the text nk and nsc write; white
// space around it is ignored, and a decorated .nk or .creds file's seed
// block is found). Curve (X…) seeds are not signing keys and are refused.
func NewSigner(seed []byte) (*Signer, error) {
	text := strings.TrimSpace(string(seed))
	if strings.Contains(text, "-----BEGIN") {
		kp, err := nkeys.ParseDecoratedNKey([]byte(text))
		if err != nil {
			return nil, fmt.Errorf("%w: no NKey seed found in the decorated key: %v", ErrKey, err)
		}
		s, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("%w: the decorated key holds a public key, not a seed", ErrKey)
		}
		text = string(s)
	}
	if text == "" {
		return nil, fmt.Errorf("%w: the seed is empty", ErrKey)
	}
	if !strings.HasPrefix(text, "S") {
		return nil, fmt.Errorf("%w: %q is no NKey seed (a seed starts with S, such as SN… made by seamguard or nk -gen server); a public key (N…, U…) cannot sign", ErrKey, abbreviateKey(text))
	}
	prefix, raw, err := nkeys.DecodeSeed([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("%w: the seed does not decode (%v): check that it was copied whole", ErrKey, err)
	}
	if prefix == nkeys.PrefixByteCurve {
		return nil, fmt.Errorf("%w: the seed is a curve (X25519) key, which cannot sign; use an ed25519 NKey such as one from nk -gen server", ErrKey)
	}
	priv := ed25519.NewKeyFromSeed(raw)
	pub, err := nkeys.Encode(prefix, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrKey, err)
	}
	return &Signer{priv: priv, public: string(pub), seed: []byte(text)}, nil
}

// Generate makes a new server-type NKey ("SN…" seed, "N…" public key).
func Generate() (*Signer, error) {
	kp, err := nkeys.CreateServer()
	if err != nil {
		return nil, fmt.Errorf("attest: making a key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("attest: making a key: %w", err)
	}
	return NewSigner(seed)
}

// PublicKey is the signer's public NKey, what verifiers trust.
func (s *Signer) PublicKey() string { return s.public }

// Seed returns a copy of the signer's seed (a secret).
func (s *Signer) Seed() []byte { return slices.Clone(s.seed) }

// Sign returns the encoded signature of body.
func (s *Signer) Sign(body []byte) string {
	return sigEncoding.EncodeToString(ed25519.Sign(s.priv, body))
}

// SignMsg sets h's signer and signature headers for body, replacing any.
func (s *Signer) SignMsg(h nats.Header, body []byte) {
	h[HeaderSigner] = []string{s.public}
	h[HeaderSignature] = []string{s.Sign(body)}
}

// KeyFileName is the file in a data directory that holds the signing key
// seamguard made there.
const KeyFileName = "signing.nk"

// LoadOrCreate reads the seed in path, or, when there is no such file,
// makes a key and writes its seed there (mode 0600, the directory made
// 0700 if missing), whole or not at all. created says which happened.
func LoadOrCreate(path string) (s *Signer, created bool, err error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s, err := NewSigner(b)
		if err != nil {
			return nil, false, fmt.Errorf("signing key %s: %w", path, err)
		}
		return s, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("attest: reading signing key: %w", err)
	}
	s, err = Generate()
	if err != nil {
		return nil, false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("attest: cannot create %s for the signing key: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".signing-*")
	if err != nil {
		return nil, false, fmt.Errorf("attest: writing signing key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, false, fmt.Errorf("attest: writing signing key: %w", err)
	}
	if _, err := tmp.Write(append(s.Seed(), '\n')); err != nil {
		tmp.Close()
		return nil, false, fmt.Errorf("attest: writing signing key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, false, fmt.Errorf("attest: writing signing key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, false, fmt.Errorf("attest: writing signing key: %w", err)
	}
	// A link, not a rename: two processes starting at once on one data
	// directory do not both make a key; the second reads the first's.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return LoadOrCreate(path)
		}
		return nil, false, fmt.Errorf("attest: writing signing key: %w", err)
	}
	return s, true, nil
}

// Trust is a set of trusted public keys. The zero value trusts no key in
// particular (see Verifier). A Trust is read-only once made.
type Trust struct {
	keys []string
}

// ParseKeys reads public NKeys: each element may hold several, separated by
// commas or white space (as SEAMGUARD_TRUSTED_KEYS does). A seed given by
// mistake is refused without echoing it.
func ParseKeys(list ...string) (Trust, error) {
	var t Trust
	var errs []error
	for _, item := range list {
		for _, k := range strings.FieldsFunc(item, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
			if strings.HasPrefix(k, "S") {
				errs = append(errs, fmt.Errorf("%w: a trusted key starting %q is a seed (a secret): give its public key (serve logs it, as signing_key)", ErrKey, k[:min(2, len(k))]))
				continue
			}
			if _, err := publicKey(k); err != nil {
				errs = append(errs, fmt.Errorf("%w: trusted key %q: %v", ErrKey, abbreviateKey(k), err))
				continue
			}
			if !slices.Contains(t.keys, k) {
				t.keys = append(t.keys, k)
			}
		}
	}
	return t, errors.Join(errs...)
}

// Keys returns the trusted keys, in the order given.
func (t Trust) Keys() []string { return slices.Clone(t.keys) }

// Empty reports whether no key is trusted.
func (t Trust) Empty() bool { return len(t.keys) == 0 }

// Contains reports whether key is trusted.
func (t Trust) Contains(key string) bool { return slices.Contains(t.keys, key) }

// publicKey decodes an ed25519 public NKey.
func publicKey(k string) (ed25519.PublicKey, error) {
	if len(k) != 56 {
		return nil, fmt.Errorf("a public NKey has 56 characters, this has %d", len(k))
	}
	prefix := nkeys.Prefix(k)
	switch prefix {
	case nkeys.PrefixByteServer, nkeys.PrefixByteUser, nkeys.PrefixByteAccount, nkeys.PrefixByteOperator, nkeys.PrefixByteCluster:
	default:
		return nil, errors.New("not an ed25519 public NKey (N…, U…, A…, O… or C…)")
	}
	raw, err := nkeys.Decode(prefix, []byte(k))
	if err != nil {
		return nil, err
	}
	if len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("the key holds %d bytes, not %d", len(raw), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}

// abbreviateKey quotes at most the first 60 bytes of a key given by hand.
func abbreviateKey(k string) string {
	if len(k) > 60 {
		return k[:60] + "…"
	}
	return k
}
