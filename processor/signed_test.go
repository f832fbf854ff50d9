package processor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/workload"
	"github.com/seamguard/seamguard/processor"
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

// BenchmarkVerdictPublish puts the cost of signing beside the cost of
// publishing: verdict-sized messages published to the verdict stream (file
// storage, fsync before every ack, as serve's embedded server runs; a
// server for each), in windows of 256 asynchronous publishes, with and
// without the signature headers. Per op: one verdict, its publish and its
// ack.
func BenchmarkVerdictPublish(b *testing.B) {
	key, err := attest.Generate()
	require.NoError(b, err)
	o := events.Output{Type: events.TypeCompactionAllowed, Session: "bench-session", Cause: events.Cause{ID: "e", Source: "urn:bench"},
		Data: &events.CompactionAllowed{RequestID: "r", Head: 120, TailStart: 100, SummaryCoverage: []events.Range{{Start: 0, End: 100}}}}
	_, subject, body, err := events.Encoder{Source: "urn:seamguard:bench"}.Encode(o)
	require.NoError(b, err)
	for _, signed := range []bool{false, true} {
		name := "unsigned"
		if signed {
			name = "signed"
		}
		b.Run(name, func(b *testing.B) {
			// A server of its own, so that neither runs on the other's store.
			srv := embedded.StartTest(b)
			_, err := processor.Provision(b.Context(), srv.JS, processor.Config{Partitions: 1})
			require.NoError(b, err)
			run := nuid.Next() // ids unique across runs: no publish is a duplicate
			var futures []jetstream.PubAckFuture
			wait := func() {
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
				}
				futures = futures[:0]
			}
			i := 0
			for b.Loop() {
				i++
				m := nats.NewMsg(subject)
				m.Data = body
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%s-%d", name, run, i))
				if signed {
					key.SignMsg(m.Header, body)
				}
				f, err := srv.JS.PublishMsgAsync(m)
				if err != nil {
					b.Fatal(err)
				}
				futures = append(futures, f)
				if len(futures) == 256 {
					wait()
				}
			}
			wait()
		})
	}
}
