package attest

import (
	"crypto/ed25519"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/events"
)

// Attribution is what a verification found out about a message that
// passed it.
type Attribution struct {
	// Signer is the public key that signed the body.
	Signer string
	// Trusted is true when Signer is one of the verifier's trusted keys;
	// false when the verifier has none (only the signature was checked).
	Trusted bool
	// Verdict is the body, decoded.
	Verdict *events.Verdict
}

// Verifier checks messages read from verdict subjects. Its zero value
// trusts no key in particular and uses the default subject prefix. A
// Verifier is safe for concurrent use.
type Verifier struct {
	// Trust is the set of trusted signers; empty means that any signer's
	// good signature passes, with Attribution.Trusted false.
	Trust Trust
	// Subjects names the deployment's verdict subjects (its prefix).
	Subjects events.Subjects

	keys sync.Map // public NKey -> ed25519.PublicKey
}

// NewVerifier returns a Verifier for the deployment subj that trusts keys
// (each element may hold several; see ParseKeys).
func NewVerifier(subj events.Subjects, keys ...string) (*Verifier, error) {
	t, err := ParseKeys(keys...)
	if err != nil {
		return nil, err
	}
	return &Verifier{Trust: t, Subjects: subj}, nil
}

// Trusting reports whether the verifier checks signers against trusted
// keys.
func (v *Verifier) Trusting() bool { return v != nil && !v.Trust.Empty() }

// Verify checks a message that arrived on natsSubject ("" when the subject
// is not known: then the routing check is skipped) with headers h and body
// body, in the order doc.go gives. It returns the attribution, or an *Error
// saying why the message is not attributable.
func (v *Verifier) Verify(natsSubject string, h nats.Header, body []byte) (Attribution, error) {
	signer, sig, err := signatureHeaders(h)
	if err != nil {
		return Attribution{}, err
	}
	pub, err := v.publicKey(signer)
	if err != nil {
		return Attribution{}, &Error{Reason: ReasonBadSignature, Signer: signer,
			Message: fmt.Sprintf("the signer %q is not an ed25519 public NKey: %v", abbreviateKey(signer), err)}
	}
	raw, err := sigEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return Attribution{}, &Error{Reason: ReasonBadSignature, Signer: signer,
			Message: fmt.Sprintf("the signature is not %d characters of unpadded URL-safe base64 (an ed25519 signature)", SignatureLen)}
	}
	if !ed25519.Verify(pub, body, raw) {
		return Attribution{}, &Error{Reason: ReasonBadSignature, Signer: signer,
			Message: fmt.Sprintf("the signature does not match the body for signer %s: the body was changed after signing, or the signature comes from another message", signer)}
	}
	a := Attribution{Signer: signer}
	if v != nil && !v.Trust.Empty() {
		if !v.Trust.Contains(signer) {
			return Attribution{}, &Error{Reason: ReasonUntrusted, Signer: signer,
				Message: fmt.Sprintf("signed by %s, which is none of the %d trusted key(s): not this deployment's processor (or a key not yet trusted after a rotation)", signer, len(v.Trust.keys))}
		}
		a.Trusted = true
	}
	verdict, err := events.DecodeVerdict(body)
	if err != nil {
		return Attribution{}, &Error{Reason: ReasonMalformed, Signer: signer,
			Message: fmt.Sprintf("the signed body is not a seamguard verdict: %v", err)}
	}
	a.Verdict = verdict
	if natsSubject != "" {
		if err := v.route(natsSubject, verdict); err != nil {
			err.Signer = signer
			return Attribution{}, err
		}
	}
	return a, nil
}

// route checks that verdict belongs on natsSubject.
func (v *Verifier) route(natsSubject string, verdict *events.Verdict) *Error {
	var subj events.Subjects
	if v != nil {
		subj = v.Subjects
	}
	prefix := subj.Prefix
	if prefix == "" {
		prefix = events.DefaultPrefix
	}
	rest, ok := strings.CutPrefix(natsSubject, prefix+".verdicts.")
	session, kind, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || strings.Contains(kind, ".") {
		return &Error{Reason: ReasonMisrouted,
			Message: fmt.Sprintf("it arrived on %q, which is not a verdict subject %s.verdicts.<session>.<kind>", events.Excerpt(natsSubject), prefix)}
	}
	want := verdict.Session
	if want == "" {
		want = events.InvalidSession
	}
	if session != want {
		return &Error{Reason: ReasonMisrouted,
			Message: fmt.Sprintf("the verdict is about session %q but arrived on %q, the subject of session %q: a genuine verdict copied onto another session's subject", verdict.Session, events.Excerpt(natsSubject), events.Excerpt(session))}
	}
	if kind != verdict.Kind() {
		return &Error{Reason: ReasonMisrouted,
			Message: fmt.Sprintf("the verdict is of type %s (kind %s) but arrived on %q, a subject of kind %q", verdict.Type, verdict.Kind(), events.Excerpt(natsSubject), events.Excerpt(kind))}
	}
	return nil
}

// publicKey decodes signer, once per signer seen (a verifier sees few).
func (v *Verifier) publicKey(signer string) (ed25519.PublicKey, error) {
	if v == nil {
		return publicKey(signer)
	}
	if k, ok := v.keys.Load(signer); ok {
		return k.(ed25519.PublicKey), nil
	}
	k, err := publicKey(signer)
	if err != nil {
		return nil, err
	}
	// Only keys that decode are kept, and only trusted ones when there
	// are any, so a stream of made-up signers cannot grow the cache.
	if v.Trust.Empty() || v.Trust.Contains(signer) {
		v.keys.Store(signer, k)
	}
	return k, nil
}

// signatureHeaders returns the signer and signature headers of h, read
// case-insensitively; each must be there exactly once.
func signatureHeaders(h nats.Header) (signer, sig string, err error) {
	var signers, sigs []string
	for name, vals := range h {
		switch {
		case strings.EqualFold(name, HeaderSigner):
			signers = append(signers, vals...)
		case strings.EqualFold(name, HeaderSignature):
			sigs = append(sigs, vals...)
		}
	}
	switch {
	case len(signers) == 0 && len(sigs) == 0:
		return "", "", &Error{Reason: ReasonUnsigned,
			Message: fmt.Sprintf("the message has no %s and no %s header: no seamguard processor published it", HeaderSigner, HeaderSignature)}
	case len(signers) == 0:
		return "", "", &Error{Reason: ReasonUnsigned, Message: fmt.Sprintf("the message has a %s but no %s header", HeaderSignature, HeaderSigner)}
	case len(sigs) == 0:
		return "", "", &Error{Reason: ReasonUnsigned, Signer: signers[0], Message: fmt.Sprintf("the message names signer %s but has no %s header", abbreviateKey(signers[0]), HeaderSignature)}
	case len(signers) > 1 || len(sigs) > 1:
		return "", "", &Error{Reason: ReasonBadSignature,
			Message: fmt.Sprintf("the message has %d %s and %d %s values; a signed verdict has one of each", len(signers), HeaderSigner, len(sigs), HeaderSignature)}
	}
	return signers[0], sigs[0], nil
}
