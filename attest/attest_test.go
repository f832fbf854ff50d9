package attest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/seamguard/seamguard/events"
)

// verdict encodes an allowed verdict of session (a rejection of input
// with no session when session is "").
func verdict(t testing.TB, session string) (subject string, body []byte) {
	t.Helper()
	o := events.Output{Type: events.TypeCompactionAllowed, Session: session,
		Cause: events.Cause{ID: "e1", Source: "urn:agent"},
		Data:  &events.CompactionAllowed{RequestID: "r1", Head: 10, TailStart: 4}}
	if session == "" {
		o = events.Output{Type: events.TypeEventRejected, Cause: events.Cause{ReadID: "x"},
			Data: &events.EventRejected{Code: events.CodeBadSessionID, Field: "subject", Message: "m"}}
	}
	_, subject, body, err := events.Encoder{}.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	return subject, body
}

func signed(s *Signer, body []byte) nats.Header {
	h := nats.Header{}
	s.SignMsg(h, body)
	return h
}

func mustGenerate(t testing.TB) *Signer {
	t.Helper()
	s, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerify(t *testing.T) {
	proc, other := mustGenerate(t), mustGenerate(t)
	trusting, err := NewVerifier(events.Subjects{}, proc.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	open := &Verifier{}
	subjA, bodyA := verdict(t, "sess-a")
	subjB, _ := verdict(t, "sess-b")
	subjInvalid, bodyInvalid := verdict(t, "")
	altered := bytes.Replace(bodyA, []byte(`"head":10`), []byte(`"head":11`), 1)
	if bytes.Equal(altered, bodyA) {
		t.Fatal("the body was not altered")
	}
	twice := signed(proc, bodyA)
	twice.Add(HeaderSignature, proc.Sign(bodyA))
	for _, c := range []struct {
		name    string
		v       *Verifier
		subject string
		h       nats.Header
		body    []byte
		reason  string // "" = passes
		trusted bool
	}{
		{"genuine", trusting, subjA, signed(proc, bodyA), bodyA, "", true},
		{"genuine, no trusted keys", open, subjA, signed(proc, bodyA), bodyA, "", false},
		{"genuine rejection on _invalid", trusting, subjInvalid, signed(proc, bodyInvalid), bodyInvalid, "", true},
		{"genuine, subject unknown", trusting, "", signed(proc, bodyA), bodyA, "", true},
		{"unsigned", trusting, subjA, nats.Header{}, bodyA, ReasonUnsigned, false},
		{"unsigned, no trusted keys", open, subjA, nil, bodyA, ReasonUnsigned, false},
		{"signature without signer", trusting, subjA, nats.Header{HeaderSignature: {proc.Sign(bodyA)}}, bodyA, ReasonUnsigned, false},
		{"signer without signature", trusting, subjA, nats.Header{HeaderSigner: {proc.PublicKey()}}, bodyA, ReasonUnsigned, false},
		{"another key", trusting, subjA, signed(other, bodyA), bodyA, ReasonUntrusted, false},
		{"body altered", trusting, subjA, signed(proc, bodyA), altered, ReasonBadSignature, false},
		{"body altered, no trusted keys", open, subjA, signed(proc, bodyA), altered, ReasonBadSignature, false},
		{"signature of another body", trusting, subjA, nats.Header{HeaderSigner: {proc.PublicKey()}, HeaderSignature: {proc.Sign(bodyInvalid)}}, bodyA, ReasonBadSignature, false},
		{"signature claimed for another signer", trusting, subjA, nats.Header{HeaderSigner: {proc.PublicKey()}, HeaderSignature: {other.Sign(bodyA)}}, bodyA, ReasonBadSignature, false},
		{"signer not a key", trusting, subjA, nats.Header{HeaderSigner: {"Nnotakey"}, HeaderSignature: {proc.Sign(bodyA)}}, bodyA, ReasonBadSignature, false},
		{"signature not base64", trusting, subjA, nats.Header{HeaderSigner: {proc.PublicKey()}, HeaderSignature: {"!!"}}, bodyA, ReasonBadSignature, false},
		{"signature given twice", trusting, subjA, twice, bodyA, ReasonBadSignature, false},
		{"moved to another session", trusting, subjB, signed(proc, bodyA), bodyA, ReasonMisrouted, false},
		{"moved to another session, no trusted keys", open, subjB, signed(proc, bodyA), bodyA, ReasonMisrouted, false},
		{"moved to another kind", trusting, strings.TrimSuffix(subjA, ".allowed") + ".refused", signed(proc, bodyA), bodyA, ReasonMisrouted, false},
		{"moved to _invalid", trusting, "seamguard.verdicts._invalid.allowed", signed(proc, bodyA), bodyA, ReasonMisrouted, false},
		{"rejection moved to a session", trusting, "seamguard.verdicts.sess-a.rejected", signed(proc, bodyInvalid), bodyInvalid, ReasonMisrouted, false},
		{"not a verdict subject", trusting, "elsewhere.sess-a.allowed", signed(proc, bodyA), bodyA, ReasonMisrouted, false},
		{"signed non-verdict", trusting, subjA, signed(proc, []byte(`{"x":1}`)), []byte(`{"x":1}`), ReasonMalformed, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := c.v.Verify(c.subject, c.h, c.body)
			if c.reason == "" {
				if err != nil {
					t.Fatalf("verification failed: %v", err)
				}
				if a.Signer != proc.PublicKey() || a.Trusted != c.trusted || a.Verdict == nil {
					t.Fatalf("attribution %+v; want signer %s, trusted %v and the verdict", a, proc.PublicKey(), c.trusted)
				}
				return
			}
			if err == nil {
				t.Fatalf("verified; want %s", c.reason)
			}
			if Reason(err) != c.reason || !errors.Is(err, ErrUnattributed) {
				t.Fatalf("error %v (reason %q); want reason %s", err, Reason(err), c.reason)
			}
		})
	}
}

// TestSignatureIsNKeys checks the signature against nkeys' own verifier
// and the documented encoding, and that signing is deterministic.
func TestSignatureIsNKeys(t *testing.T) {
	s := mustGenerate(t)
	if !strings.HasPrefix(s.PublicKey(), "N") || !strings.HasPrefix(string(s.Seed()), "SN") {
		t.Fatalf("keys %s / %.2s…: want a server NKey", s.PublicKey(), s.Seed())
	}
	_, body := verdict(t, "s")
	sig := s.Sign(body)
	if len(sig) != SignatureLen || strings.ContainsAny(sig, "+/=") {
		t.Fatalf("signature %q: want %d characters of unpadded URL-safe base64", sig, SignatureLen)
	}
	if s.Sign(body) != sig {
		t.Fatal("signing the same body twice gave two signatures")
	}
	raw, err := sigEncoding.DecodeString(sig)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromPublicKey(s.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := kp.Verify(body, raw); err != nil {
		t.Fatalf("nkeys does not verify the signature: %v", err)
	}
	again, err := NewSigner(append([]byte("\n  "), append(s.Seed(), '\n')...))
	if err != nil {
		t.Fatal(err)
	}
	if again.PublicKey() != s.PublicKey() || again.Sign(body) != sig {
		t.Fatal("the same seed read again signs differently")
	}
}

func TestKeysRefused(t *testing.T) {
	s := mustGenerate(t)
	curve, _ := nkeys.CreateCurveKeys()
	cseed, _ := curve.Seed()
	for name, seed := range map[string]string{
		"empty":      "  ",
		"public key": s.PublicKey(),
		"truncated":  string(s.Seed()[:40]),
		"curve":      string(cseed),
	} {
		if _, err := NewSigner([]byte(seed)); !errors.Is(err, ErrKey) {
			t.Errorf("NewSigner(%s) = %v; want ErrKey", name, err)
		}
	}
	for name, key := range map[string]string{
		"seed":      string(s.Seed()),
		"truncated": s.PublicKey()[:50],
		"bad crc":   s.PublicKey()[:55] + map[bool]string{true: "A", false: "B"}[s.PublicKey()[55] != 'A'],
		"curve":     func() string { p, _ := curve.PublicKey(); return p }(),
	} {
		_, err := ParseKeys(key)
		if !errors.Is(err, ErrKey) {
			t.Errorf("ParseKeys(%s) = %v; want ErrKey", name, err)
		}
		if name == "seed" && strings.Contains(err.Error(), string(s.Seed()[2:])) {
			t.Error("the error about a seed repeats the seed")
		}
	}
	other := mustGenerate(t)
	tr, err := ParseKeys(s.PublicKey()+", "+other.PublicKey(), s.PublicKey())
	if err != nil || len(tr.Keys()) != 2 || !tr.Contains(other.PublicKey()) {
		t.Fatalf("ParseKeys of a list = %v, %v; want both keys once", tr.Keys(), err)
	}
}

func TestLoadOrCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", KeyFileName)
	s, created, err := LoadOrCreate(path)
	if err != nil || !created {
		t.Fatalf("first LoadOrCreate: created %v, %v", created, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v; want 0600", st.Mode().Perm())
	}
	again, created, err := LoadOrCreate(path)
	if err != nil || created || again.PublicKey() != s.PublicKey() {
		t.Fatalf("second LoadOrCreate: created %v, key %s (first %s), %v", created, again.PublicKey(), s.PublicKey(), err)
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreate(path); !errors.Is(err, ErrKey) || !strings.Contains(err.Error(), path) {
		t.Fatalf("LoadOrCreate of a bad file = %v; want ErrKey naming the file", err)
	}
}

// FuzzSignVerify: any body signed verifies, with the verdict's routing
// left out; any change to a byte of it, or to a byte of the signature,
// fails.
func FuzzSignVerify(f *testing.F) {
	_, body := verdict(f, "s")
	f.Add(body, 3, byte(1))
	f.Add([]byte{}, 0, byte(0x80))
	s := mustGenerate(f)
	v := &Verifier{}
	f.Fuzz(func(t *testing.T, body []byte, at int, flip byte) {
		h := signed(s, body)
		signer, sig, err := signatureHeaders(h)
		if err != nil || signer != s.PublicKey() {
			t.Fatalf("headers: %v", err)
		}
		pub, _ := v.publicKey(signer)
		raw, _ := sigEncoding.DecodeString(sig)
		if !ed25519Verify(pub, body, raw) {
			t.Fatal("a signed body does not verify")
		}
		_, err = v.Verify("", h, body)
		if err != nil && Reason(err) != ReasonMalformed {
			t.Fatalf("a signed body fails with %v", err)
		}
		if flip == 0 {
			return
		}
		if len(body) > 0 {
			changed := bytes.Clone(body)
			changed[abs(at)%len(changed)] ^= flip
			if _, err := v.Verify("", h, changed); Reason(err) != ReasonBadSignature {
				t.Fatalf("a changed body gives %v; want bad_signature", err)
			}
		}
		badSig := []byte(sig)
		i := abs(at) % len(badSig)
		badSig[i] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[(strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", badSig[i])+int(flip))%64]
		if string(badSig) == sig {
			return
		}
		h2 := nats.Header{HeaderSigner: {signer}, HeaderSignature: {string(badSig)}}
		if _, err := v.Verify("", h2, body); Reason(err) != ReasonBadSignature {
			t.Fatalf("a changed signature gives %v; want bad_signature", err)
		}
	})
}

func abs(i int) int {
	if i < 0 {
		if i == -i {
			return 0
		}
		return -i
	}
	return i
}
