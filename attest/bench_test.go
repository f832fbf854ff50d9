package attest

import (
	"crypto/ed25519"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/events"
)

func ed25519Verify(pub ed25519.PublicKey, body, sig []byte) bool {
	return ed25519.Verify(pub, body, sig)
}

// BenchmarkSign is the processor's cost per output: one signature of a
// typical verdict body, and the two headers.
func BenchmarkSign(b *testing.B) {
	s := mustGenerate(b)
	_, body := verdict(b, "bench-session")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		s.SignMsg(nats.Header{}, body)
	}
}

// BenchmarkVerify is a subscriber's cost per verdict, decoding included.
func BenchmarkVerify(b *testing.B) {
	s := mustGenerate(b)
	subject, body := verdict(b, "bench-session")
	h := signed(s, body)
	v, err := NewVerifier(events0(), s.PublicKey())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(subject, h, body); err != nil {
			b.Fatal(err)
		}
	}
}

func events0() events.Subjects { return events.Subjects{} }
