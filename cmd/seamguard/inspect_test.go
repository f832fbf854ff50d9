package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
)

const inspectGoldenDir = "testdata/inspect"

// deployment is an embedded server with a processor running on it, its
// clock fixed so that verdicts compare byte for byte.
type deployment struct {
	*embedded.Test
	url string
	p   *processor.Processor
	key *attest.Signer // signs its verdicts
}

func startDeployment(t *testing.T) *deployment {
	t.Helper()
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	fixed := func() time.Time { return time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC) }
	key, err := attest.Generate()
	require.NoError(t, err)
	p, err := processor.New(ctx, srv.JS, processor.Config{Source: "urn:seamguard:test", LeaseTTL: 2 * time.Second, SigningKey: string(key.Seed())}, processor.WithClock(fixed))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the processor did not stop")
		}
	})
	require.Eventually(t, func() bool { return p.Ready() == nil }, 30*time.Second, 10*time.Millisecond, "the processor did not start consuming")
	return &deployment{Test: srv, url: srv.Server.ClientURL(), p: p, key: key}
}

// publish publishes lines and waits until the processor has applied and
// acknowledged everything in the events stream.
func (d *deployment) publish(t *testing.T, lines []string) {
	t.Helper()
	publishLines(t, d.JS, lines)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := d.JS.Stream(ctx, "SEAMGUARD_EVENTS")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := s.Info(ctx)
		// Every stored input decided (directly, or ahead of its delivery)...
		if st := d.p.Stats(); err != nil || st.Handled+st.CaughtUp < info.State.Msgs {
			return false
		}
		// ... and acknowledged, its state stored.
		lister := s.ListConsumers(ctx)
		busy := false
		for ci := range lister.Info() {
			if ci.NumPending > 0 || ci.NumAckPending > 0 {
				busy = true
			}
		}
		return lister.Err() == nil && !busy
	}, time.Minute, 20*time.Millisecond, "the processor did not work through the events")
}

// stripANSI removes SGR sequences.
var stripANSI = regexp.MustCompile("\x1b\\[[0-9;]*m")

// TestInspectGolden runs the seed story, the healthy chain and the pinned
// story through a processor and checks `inspect` against golden files: the
// picture as text, as SVG and as JSON. It also checks that --rebuild derives the same
// ledger from the events stream, and that colours change nothing but
// colours. go test ./cmd/seamguard -run TestInspectGolden -update rewrites
// the goldens.
func TestInspectGolden(t *testing.T) {
	d := startDeployment(t)
	stories := []struct{ file, session string }{
		{"seed-story.jsonl", "ops-agent-42"},
		{"healthy-chain.jsonl", "healthy-chain"},
		{"pinned-story.jsonl", "sess-pinned"},
	}
	// One story after the other, so that stream sequences are the same on
	// every run.
	for _, st := range stories {
		d.publish(t, readLines(t, filepath.Join(storiesDir, st.file)))
	}
	for _, st := range stories {
		t.Run(st.session, func(t *testing.T) {
			name := strings.TrimSuffix(st.file, ".jsonl")
			svg := filepath.Join(t.TempDir(), "ledger.svg")
			code, text, stderr := runCLI(t, "", "inspect", st.session, "--nats-url", d.url, "--svg", svg)
			require.Equal(t, 0, code, stderr)
			golden(t, filepath.Join(inspectGoldenDir, name+".txt"), text)
			b, err := os.ReadFile(svg)
			require.NoError(t, err)
			golden(t, filepath.Join(inspectGoldenDir, name+".svg"), string(b))

			code, js, stderr := runCLI(t, "", "inspect", st.session, "--nats-url", d.url, "--json")
			require.Equal(t, 0, code, stderr)
			golden(t, filepath.Join(inspectGoldenDir, name+".json"), js)

			// --rebuild: the same ledger and history, from the events stream.
			code, rjs, stderr := runCLI(t, "", "inspect", st.session, "--nats-url", d.url, "--json", "--rebuild")
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, withoutState(t, js), withoutState(t, rjs), "a rebuilt ledger differs from the bucket's")
			assert.Contains(t, rjs, `"from": "events"`)

			code, colored, stderr := runCLI(t, "", "inspect", st.session, "--nats-url", d.url, "--color", "always")
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, colored, "\x1b[")
			assert.Equal(t, text, stripANSI.ReplaceAllString(colored, ""), "colours must only colour")
			assert.NotContains(t, text, "\x1b[", "plain output when standard output is not a terminal")
		})
	}
}

// withoutState drops the state member (where the ledger was read from).
func withoutState(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m))
	delete(m, "state")
	return m
}

func TestInspectErrors(t *testing.T) {
	d := startDeployment(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect"}, 2, "one session id"},
		{[]string{"inspect", "a.b"}, 2, "not a session id"},
		{[]string{"inspect", "s", "--color", "pink"}, 2, "--color"},
		{[]string{"inspect", "s", "--policy", "maybe"}, 2, "--policy"},
		{[]string{"inspect", "nobody", "--nats-url", d.url}, 1, "holds no state for session \"nobody\""},
		{[]string{"inspect", "nobody", "--nats-url", d.url, "--rebuild"}, 1, "holds no events of session \"nobody\""},
		{[]string{"replay", "extra"}, 2, "no arguments"},
		{[]string{"replay", "--since", "yesterday"}, 2, "--since \"yesterday\""},
		{[]string{"replay", "--since", "0"}, 2, "start at 1"},
		{[]string{"replay", "--session", "a.b"}, 2, "not a session id"},
		{[]string{"replay", "--nats-url", d.url, "--verdicts", "NOPE"}, 1, "NOPE"},
	} {
		code, _, stderr := runCLI(t, "", tc.args...)
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

// TestReplay runs every shipped story through a processor, then replays:
// an honest verdict stream gives no difference; a copy with one verdict
// removed, one altered, one forged, one recorded twice and four messages
// that fail verification gives exactly those eight.
func TestReplay(t *testing.T) {
	d := startDeployment(t)
	stories, err := filepath.Glob(filepath.Join(storiesDir, "*.jsonl"))
	require.NoError(t, err)
	for _, st := range stories {
		d.publish(t, readLines(t, st))
	}

	code, out, stderr := runCLI(t, "", "replay", "--nats-url", d.url, "--trust-key", d.key.PublicKey())
	require.Equal(t, 0, code, "an honest run must replay without a difference:\n%s%s", out, stderr)
	assert.Contains(t, out, "; no difference")
	var rep struct {
		Events, Sessions, Derived, Recorded, Matched int
		States                                       int `json:"states_compared"`
	}
	code, js, stderr := runCLI(t, "", "replay", "--nats-url", d.url, "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(js), &rep))
	assert.Equal(t, rep.Derived, rep.Recorded)
	assert.Equal(t, rep.Derived, rep.Matched)
	assert.Greater(t, rep.Derived, 20, "every story's verdicts, rejections included")
	assert.Equal(t, len(stories), rep.Sessions-1, "the stories' sessions, and \"unnamed\", where publishLines puts lines that name no valid session")
	assert.Equal(t, rep.Sessions, rep.States, "every session's stored ledger compared with the derived one (unnamed's holds only rejections)")
	assert.Contains(t, out, fmt.Sprintf("; %d session ledger(s) compared with bucket seamguard-sessions", rep.Sessions))

	// A copy of the verdict stream with plants: one verdict removed, one
	// altered (and signed again with the processor's key: a verdict the
	// processor decided otherwise), one recorded twice, one signed verdict
	// no input explains, and four messages the processor did not publish
	// as they are: unsigned, signed by another key, a genuine one changed
	// after signing, a genuine one copied onto another session's subject.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = d.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "PLANTED", Subjects: []string{"planted.>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	src, err := d.JS.Stream(ctx, "SEAMGUARD_VERDICTS")
	require.NoError(t, err)
	info, err := src.Info(ctx)
	require.NoError(t, err)
	cons, err := src.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	plant := func(subject, body string, signer *attest.Signer, header nats.Header) {
		t.Helper()
		m := nats.NewMsg("planted." + subject)
		m.Data = []byte(body)
		for _, k := range []string{attest.HeaderSigner, attest.HeaderSignature} {
			if v := header.Get(k); v != "" {
				m.Header.Set(k, v)
			}
		}
		if signer != nil {
			signer.SignMsg(m.Header, m.Data)
		}
		_, err := d.JS.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	other, err := attest.Generate()
	require.NoError(t, err)
	var removed, altered, doubled, tampered, moved string
	for range info.State.Msgs {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		body := string(m.Data())
		switch {
		case removed == "" && strings.Contains(body, `"type":"io.seamguard.transcript.spilled"`) && strings.Contains(body, `"subject":"ops-agent-42"`):
			removed = idOf(t, body)
			continue
		case altered == "" && strings.Contains(body, `"request_id":"c2"`) && strings.Contains(body, `"subject":"healthy-chain"`):
			altered = idOf(t, body)
			body = strings.Replace(body, `"summary_coverage":[{"start":0,"end":40}]`, `"summary_coverage":[{"start":0,"end":30}]`, 1)
			plant(m.Subject(), body, d.key, nil)
			continue
		}
		plant(m.Subject(), body, nil, m.Headers())
		switch {
		case doubled == "" && strings.Contains(body, `"request_id":"c1"`) && strings.Contains(body, `"subject":"healthy-chain"`):
			doubled = idOf(t, body)
			plant(m.Subject(), body, nil, m.Headers())
		case tampered == "" && strings.Contains(body, `"subject":"committed-anyway"`) && strings.Contains(body, `"request_id":"`):
			tampered = idOf(t, body)
			plant(m.Subject(), strings.Replace(body, `"request_id":"`, `"request_id":"x`, 1), nil, m.Headers())
		case moved == "" && strings.Contains(body, `"subject":"sess-pinned"`) && strings.HasSuffix(m.Subject(), ".allowed"):
			moved = idOf(t, body)
			plant("seamguard.verdicts.ops-agent-42.allowed", body, nil, m.Headers())
		}
	}
	require.NotEmpty(t, removed)
	require.NotEmpty(t, altered)
	require.NotEmpty(t, doubled)
	require.NotEmpty(t, tampered)
	require.NotEmpty(t, moved)
	forged := func(id string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"urn:elsewhere","type":"io.seamguard.compaction.allowed","subject":"healthy-chain","datacontenttype":"application/json","causationid":"nobody-0001","data":{"request_id":"c9","head":50,"summary_coverage":[],"tail_start":0,"recovered_by":[],"cured":[]}}`
	}
	plant("seamguard.verdicts.healthy-chain.allowed", forged("sg-forged"), d.key, nil)
	plant("seamguard.verdicts.healthy-chain.allowed", forged("sg-unsigned"), nil, nil)
	plant("seamguard.verdicts.healthy-chain.allowed", forged("sg-other-key"), other, nil)

	trust := "--trust-key=" + d.key.PublicKey()
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED", trust)
	assert.Equal(t, 1, code, "differences exit non-zero:\n%s%s", out, stderr)
	assert.Contains(t, stderr, "8 difference(s) with PLANTED")
	assert.NotContains(t, stderr, "no trusted key")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	seedSeq := seqOfEvent(t, d, "ops-agent-42-0055")
	assert.Contains(t, out, fmt.Sprintf("missing   ops-agent-42  transcript.spilled  %s  input seq %d  (answers ops-agent-42-0055)", removed, seedSeq))
	assert.Contains(t, out, "different healthy-chain  compaction.allowed  "+altered)
	assert.Contains(t, out, `data.summary_coverage: derived [{"end":40,"start":0}], recorded [{"end":30,"start":0}]`)
	assert.Contains(t, out, "extra     healthy-chain  compaction.allowed  sg-forged")
	assert.Contains(t, out, "duplicate healthy-chain  compaction.allowed  "+doubled)
	assert.Regexp(t, `unattributed healthy-chain  compaction.allowed  sg-unsigned .*\n.*on planted.seamguard.verdicts.healthy-chain.allowed, not published by a trusted seamguard processor as it is: unsigned: `, out)
	assert.Regexp(t, `unattributed healthy-chain  compaction.allowed  sg-other-key .*\n.*untrusted_signer: signed by `+other.PublicKey(), out)
	assert.Regexp(t, `unattributed committed-anyway  \S+  `+tampered+` .*\n.*bad_signature: `, out)
	assert.Regexp(t, `unattributed sess-pinned  compaction.allowed  `+moved+` .*\n.*on planted.seamguard.verdicts.ops-agent-42.allowed, .*misrouted: the verdict is about session "sess-pinned"`, out)
	assert.Contains(t, lines[len(lines)-1], "8 difference(s): 1 missing, 1 extra, 1 different, 1 duplicate, 4 unattributed")
	// The refusal that carries the removed spill's handle still matches:
	// the spill's outcome was read from the object store.
	assert.Contains(t, stderr, "note: no verdict records the outcome of spill ops-agent-42/1.jsonl")

	// Without a trusted key, the one signed by another key passes for a
	// verdict (an extra one here), and replay says what it did not check.
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "no trusted key")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	assert.Contains(t, lines[len(lines)-1], "8 difference(s): 1 missing, 2 extra, 1 different, 1 duplicate, 3 unattributed")
	// The trusted keys from the environment.
	t.Setenv("SEAMGUARD_TRUSTED_KEYS", other.PublicKey()+","+d.key.PublicKey())
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED")
	assert.Equal(t, 1, code, stderr)
	lines = strings.Split(strings.TrimSpace(out), "\n")
	assert.Contains(t, lines[len(lines)-1], "8 difference(s): 1 missing, 2 extra, 1 different, 1 duplicate, 3 unattributed", "both keys trusted")
	t.Setenv("SEAMGUARD_TRUSTED_KEYS", d.key.PublicKey())

	// One session only: what is on its subjects, whatever it claims, is
	// checked.
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED", "--session", "ops-agent-42")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, out, "2 difference(s): 1 missing, 1 unattributed")
	assert.Contains(t, out, removed)
	assert.Contains(t, out, moved)

	// --since: decisions about earlier inputs are not compared; the
	// forged verdicts name no input in the stream, so they are always shown.
	// (The stories are published in the order of their file names: the
	// healthy chain before the seed story.)
	seq := seqOfEvent(t, d, "healthy-chain-0055")
	require.Less(t, seq, seedSeq)
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED", "--since", fmt.Sprint(seq))
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, out, removed)
	assert.Contains(t, out, altered)
	assert.Contains(t, out, fmt.Sprintf("compared from input seq %d", seq))
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED", "--since", fmt.Sprint(seq+1))
	assert.Equal(t, 1, code, stderr)
	assert.NotContains(t, out, altered)
	assert.Contains(t, out, removed)
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--verdicts", "PLANTED", "--since", fmt.Sprint(seedSeq+1))
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, out, "5 difference(s): 1 extra, 4 unattributed")
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--since", time.Now().Add(time.Hour).Format(time.RFC3339))
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "0 verdicts derived")

	// A stored ledger whose pinned set differs from the derived one: the
	// pinned story ends with its rule unpinned; the bucket is made to say
	// it is still pinned, at the same input.
	kv, err := d.JS.KeyValue(ctx, "seamguard-sessions")
	require.NoError(t, err)
	e, err := kv.Get(ctx, "sess-pinned")
	require.NoError(t, err)
	st, err := processor.UnmarshalState(e.Value())
	require.NoError(t, err)
	require.Empty(t, st.Ledger.View().Pinned.Ranges(), "the pinned story ends unpinned")
	pin := &events.Event{ID: "tamper-1", Source: "urn:test", Type: events.TypeContextPinned, Subject: "sess-pinned",
		Body: &events.ContextPinned{Range: events.Range{Start: 0, End: 1}}, Meta: events.Meta{Seq: st.Seq}}
	_, err = ledger.Step(&st.Ledger, ledger.Input{Event: pin}, ledger.Config{})
	require.NoError(t, err)
	b, err := processor.MarshalState(st.Seq, &st.Ledger)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "sess-pinned", b)
	require.NoError(t, err)
	code, out, stderr = runCLI(t, "", "replay", "--nats-url", d.url)
	assert.Equal(t, 1, code, "a stored pinned set that differs is a difference:\n%s%s", out, stderr)
	assert.Contains(t, out, "state     sess-pinned  session.state  seamguard-sessions/sess-pinned")
	assert.Contains(t, out, "          pinned N: derived none, stored [0, 1)\n")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	assert.Contains(t, lines[len(lines)-1], "1 difference(s): 1 state")
	code, js, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--json", "--session", "sess-pinned")
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, js, `"pinned N: derived none, stored [0, 1)"`)
	// Put it back as it was.
	_, err = kv.Put(ctx, "sess-pinned", e.Value())
	require.NoError(t, err)

	// The progress bar, forced on.
	code, _, stderr = runCLI(t, "", "replay", "--nats-url", d.url, "--progress", "always")
	assert.Equal(t, 0, code, stderr)
	assert.Regexp(t, `replaying \[#+\] \d+/\d+ events`, stderr)
}

func idOf(t *testing.T, body string) string {
	t.Helper()
	var m struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(body), &m))
	return m.ID
}

// seqOfEvent finds the events stream sequence of the input with a given id.
func seqOfEvent(t *testing.T, d *deployment, id string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := d.JS.Stream(ctx, "SEAMGUARD_EVENTS")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		if strings.Contains(string(m.Data), `"id":"`+id+`"`) {
			return seq
		}
	}
	t.Fatalf("no event %s in the stream", id)
	return 0
}
