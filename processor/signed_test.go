package processor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/workload"
)

// TestVerdictsSigned: every output of a workload that yields every kind
// carries the configured key's signature over its exact body, and passes
// verification against that key alone, on the subject it was stored under.
func TestVerdictsSigned(t *testing.T) {
	key, err := attest.Generate()
	require.NoError(t, err)
	cfg := baseConfig()
	cfg.SigningKey = string(key.Seed())
	e := newEnv(t)
	r := e.start(t, cfg)
	require.Equal(t, key.PublicKey(), r.p.SigningPublicKey())
	w := genWorkload(10)
	s := &sessionScript{ID: "sign-violation"}
	s.Open("turns", 4, "turns")
	s.Turns(6, 1)
	s.Commit("never-requested")
	w.Items = append(w.Items, s.Items...)
	e.publishAll(t, msgsOf(t, w, cfg.Subjects()))
	e.waitIdle(t, cfg, 2*time.Minute)
	require.NoError(t, r.stop(t))

	v, err := attest.NewVerifier(cfg.Subjects(), key.PublicKey())
	require.NoError(t, err)
	kinds := map[string]int{}
	vs := e.verdicts(t, cfg)
	require.NotEmpty(t, vs)
	for _, m := range vs {
		a, err := v.Verify(m.subject, m.header, m.body)
		require.NoError(t, err, "verdict %d on %s", m.seq, m.subject)
		require.True(t, a.Trusted)
		require.Equal(t, m.v.ID, m.header.Get("Nats-Msg-Id"), "the signature leaves the dedupe id alone")
		kinds[m.v.Kind()]++
	}
	for _, k := range []string{events.KindAllowed, events.KindRefused, events.KindSpilled, events.KindHalted, events.KindRejected, events.KindViolation} {
		require.Positive(t, kinds[k], "no %s verdict to check; kinds seen: %v", k, kinds)
	}

	// Another key is not trusted, and a processor with none configured
	// signs with a key of its own.
	other, err := attest.NewVerifier(cfg.Subjects(), r2key(t))
	require.NoError(t, err)
	_, err = other.Verify(vs[0].subject, vs[0].header, vs[0].body)
	require.ErrorIs(t, err, attest.ErrUntrusted)
}

// TestVerdictsSignedWithoutKey: a Processor with no SigningKey still
// signs every output, with a key of its own that SigningPublicKey names.
func TestVerdictsSignedWithoutKey(t *testing.T) {
	cfg := baseConfig()
	e := newEnv(t)
	r := e.start(t, cfg)
	s := &sessionScript{ID: "sign-nokey"}
	s.Open("turns", 4, "turns")
	s.Turns(6, 1)
	s.Compact("c1", rng(0, 2), rng(0, 2), 2, false)
	e.publishAll(t, msgsOf(t, &workload.Workload{Items: s.Items, Sessions: 1}, cfg.Subjects()))
	e.waitIdle(t, cfg, time.Minute)
	require.NoError(t, r.stop(t))
	pub := r.p.SigningPublicKey()
	v, err := attest.NewVerifier(cfg.Subjects(), pub)
	require.NoError(t, err)
	vs := e.verdicts(t, cfg)
	require.NotEmpty(t, vs)
	for _, m := range vs {
		_, err := v.Verify(m.subject, m.header, m.body)
		require.NoError(t, err)
	}
}

func r2key(t *testing.T) string {
	k, err := attest.Generate()
	require.NoError(t, err)
	return k.PublicKey()
}
