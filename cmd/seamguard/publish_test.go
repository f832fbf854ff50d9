package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// live is a real nats-server with `seamguard serve` running against it,
// in-process, both stopped when the test ends.
type live struct {
	url string
	js  jetstream.JetStream
}

// startLive starts an embedded server and serve on it, with the source
// check's test runs use, so that verdicts compare equal, and the serve
// flags given.
func startLive(t *testing.T, flags ...string) *live {
	t.Helper()
	srv := embedded.StartTest(t)
	url := srv.Server.ClientURL()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var out, errs lockedBuffer
	args := append([]string{"serve", "--nats-url", url, "--source", "urn:seamguard:test", "--log-level", "error"}, flags...)
	go func() {
		served <- run(ctx, args, strings.NewReader(""), &out, &errs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-served:
			assert.Equal(t, 0, code, errs.String())
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop after its context was cancelled")
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "seamguard serving on") }, 20*time.Second, 10*time.Millisecond, errs.String())
	return &live{url: url, js: srv.JS}
}

// cli runs one command line against the live server.
func (l *live) cli(t *testing.T, args ...string) (code int, stdout, stderr string, took time.Duration) {
	t.Helper()
	return cliRun(t, append(args, "--nats-url", l.url)...)
}

// streamMsgCount is how many messages stream holds.
func streamMsgCount(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

// writeStory writes lines to a file of t's and returns its path.
func writeStory(t *testing.T, name string, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return path
}

// TestPublishSeedStory plays the seed story into a live serve, in either
// content mode, and holds the verdicts in the verdict stream to the offline
// check's of the same lines, verdict for verdict (spill digests included);
// --wait prints the refusal of coverage_hole [0, 8), then the retry
// allowed. Publishing the file again adds no event: every id is in the
// stream's dedupe window, and the run says so.
func TestPublishSeedStory(t *testing.T) {
	l := startLive(t)
	story := filepath.Join(storiesDir, "seed-story.jsonl")
	seed := readLines(t, story)
	var binary []string // the same story as another session, in binary mode
	for _, line := range seed {
		binary = append(binary, renameLine(line, 1))
	}
	binaryStory := writeStory(t, "seed-binary.jsonl", binary)

	code, out, errs, took := l.cli(t, "publish", story, "--wait")
	require.Equal(t, 0, code, errs)
	assert.Less(t, took, 10*time.Second)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `^\S+seed-story.jsonl:55 ops-agent-42 +spilled +ops-agent-42/1.jsonl: \[0, 52\), 55 events`, lines[0])
	assert.Regexp(t, `^\S+seed-story.jsonl:55 ops-agent-42 +refused +compact-1: coverage_hole \[0, 8\); spill ops-agent-42/1.jsonl; next retry$`, lines[1])
	assert.Regexp(t, `^\S+seed-story.jsonl:56 ops-agent-42 +allowed +compact-1: summary \[8, 40\).*cured \[coverage_hole\] by ops-agent-42/1.jsonl$`, lines[2])
	assert.Contains(t, errs, "published 57 event(s) of 1 session(s)")
	assert.Contains(t, errs, "the processor handled them all: 1 allowed, 1 refused, 1 spilled, 0 halted, 0 rejected, 0 violation(s)")

	code, out, errs, _ = l.cli(t, "publish", "--binary", binaryStory, "--wait")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "seed-binary.jsonl:55 ops-agent-42-c1")
	assert.Contains(t, out, "cured [coverage_hole] by ops-agent-42-c1/1.jsonl")

	got, counts := verdictBodies(t, l.js)
	want := offlineVerdicts(t, append(seed, binary...))
	assert.Equal(t, want, got, "the served verdicts are the offline check's")
	for id, n := range counts {
		assert.Equal(t, 1, n, "verdict %s published once", id)
	}

	// Again: nothing is added, nothing is decided again, and --wait does
	// not wait for verdicts that cannot come.
	before := streamMsgCount(t, l.js, "SEAMGUARD_EVENTS")
	code, out, errs, took = l.cli(t, "publish", story, "--wait")
	require.Equal(t, 0, code, errs)
	assert.Less(t, took, 5*time.Second)
	assert.Equal(t, before, streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"), "no event added")
	assert.Contains(t, errs, "published 0 event(s) of 1 session(s); 57 more were in the events stream already")
	assert.Contains(t, errs, "nothing new for the processor to decide")
	assert.Contains(t, out, "seed-story.jsonl:55 ops-agent-42 duplicate: compact-1 was published before")
	after, _ := verdictBodies(t, l.js)
	assert.Equal(t, got, after, "no verdict added")
}

// TestPublishGapThenResume plays the gap story: its session.resumed (line
// 8) goes to the control subject, where it lifts the halt: the compaction
// after it is allowed, the gap cured by the waiver.
func TestPublishGapThenResume(t *testing.T) {
	l := startLive(t)
	code, out, errs, _ := l.cli(t, "publish", filepath.Join(storiesDir, "gap-then-resume.jsonl"), "--wait")
	require.Equal(t, 0, code, errs)
	for _, want := range []string{
		`gap-then-resume.jsonl:5 gap-then-resume      halted    k1: unrecoverable [1200, 1500)`,
		`gap-then-resume.jsonl:6 gap-then-resume      refused   k2: session_halted [1200, 1500); next none`,
		`gap-then-resume.jsonl:7 gap-then-resume      violation k1:`,
		`gap-then-resume.jsonl:9 gap-then-resume      allowed   k3: summary [0, 4500), tail from 4500, head 7000; cured [sequence_gap]`,
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "rejected")
	s, err := l.js.Stream(context.Background(), "SEAMGUARD_EVENTS")
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(context.Background(), processor.Config{}.Subjects().StoredControl("gap-then-resume"))
	require.NoError(t, err, "the resume is on the control subject")
	assert.Contains(t, string(m.Data), `"id":"gap-then-resume-0008"`)
	ev, err := events.DecodeJSON(m.Data, events.Meta{})
	require.NoError(t, err)
	assert.Equal(t, events.MsgID(ev.Source, "gap-then-resume-0008"), m.Header.Get(jetstream.MsgIDHeader))
}

// TestPublishBadLines: a line that is not an event stops the run at once,
// naming FILE:LINE, the field and the fix, with nothing of it or after it
// published; --keep-going skips it, publishes the rest, and still exits 1.
// An event the processor rejects (its session never opened) is printed
// with --wait, and the exit status says so.
func TestPublishBadLines(t *testing.T) {
	l := startLive(t)
	seed := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	bad := strings.Replace(seed[2], `"offset":1,`, `"offset":"one",`, 1)
	require.NotEqual(t, seed[2], bad)
	story := writeStory(t, "bad.jsonl", []string{seed[0], seed[1], bad, seed[3], "", "{not json"})

	code, out, errs, _ := l.cli(t, "publish", story)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errs, "seamguard publish: 2 bad lines; nothing was published (--keep-going publishes the other lines):\n")
	assert.Regexp(t, `\n  \S+bad.jsonl:3: data.offset: .*\(bad_data\)\n  \S+bad.jsonl:6: the line: .*\(malformed\)\n$`, errs)
	assert.NotContains(t, errs, "goroutine")
	assert.Equal(t, uint64(0), streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"), "a file is published whole or not at all")

	// Standard input is checked as it is read: the run stops at the bad
	// line, the lines before it published.
	var in strings.Builder
	for _, line := range []string{seed[0], seed[1], bad, seed[3]} {
		in.WriteString(line + "\n")
	}
	var stdout, stderr strings.Builder
	code = run(context.Background(), []string{"publish", "-", "--nats-url", l.url}, strings.NewReader(in.String()), &stdout, &stderr)
	assert.Equal(t, 1, code)
	assert.Regexp(t, `seamguard publish: stdin:3: data.offset: .*\(bad_data\); nothing from this line on was published \(--keep-going skips bad lines\)\nbefore that, 2 event\(s\) of this run are in the events stream, up to and including stdin:2 \(published 2 event\(s\) of 1 session\(s\)\)\.`, stderr.String())
	assert.Equal(t, uint64(2), streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"))

	code, _, errs, _ = l.cli(t, "publish", story, "--keep-going")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "bad.jsonl:3: data.offset:")
	assert.Regexp(t, `bad.jsonl:6: the line: .*\(malformed\)`, errs)
	assert.Regexp(t, `2 bad line\(s\) skipped, not published: \S+bad.jsonl:3, \S+bad.jsonl:6`, errs)
	assert.Contains(t, errs, "published 1 event(s) of 1 session(s); 2 more were in the events stream already")
	assert.Equal(t, uint64(3), streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"))

	// Well-formed, but for a session never opened: the processor rejects it.
	orphan := writeStory(t, "orphan.jsonl", []string{renameLine(seed[1], 7)})
	code, out, errs, _ = l.cli(t, "publish", orphan, "--wait")
	assert.Equal(t, exitRejected, code, errs)
	assert.Regexp(t, `orphan.jsonl:1 ops-agent-42-c7 +rejected  unknown_session subject \(seq 4\): session "ops-agent-42-c7" has not been opened`, out)
	assert.Contains(t, errs, "the processor rejected 1 of the events published (printed above)")

	code, _, errs, _ = l.cli(t, "publish")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "publish takes one or more files")
	code, _, errs, _ = l.cli(t, "publish", "/nonexistent/story.jsonl")
	assert.Equal(t, 1, code)
	assert.Contains(t, errs, "cannot read /nonexistent/story.jsonl")
}

// TestPublishBinaryEncoding: a binary-mode message percent-encodes what
// the binding asks (space, '"', '%', control and non-ASCII bytes), and the
// processor's decoder reads back the event the line holds.
func TestPublishBinaryEncoding(t *testing.T) {
	line := []byte(`{"specversion":"1.0","id":"e 1%\"x","source":"urn:agent:dé mo/\u0007w","type":"io.seamguard.session.opened","subject":"s1","time":"2026-11-02T09:00:01Z","tenant":"a b","datacontenttype":"application/json","data":{"unit":"turns","recovery_floor":{"span":4,"unit":"turns"}}}`)
	want, err := events.DecodeJSON(line, events.Meta{})
	require.NoError(t, err)
	p := &publisher{subj: events.Subjects{}, binary: true}
	m, err := p.message(want, line)
	require.NoError(t, err)
	assert.Equal(t, "seamguard.events.s1", m.Subject)
	assert.Equal(t, "e%201%25%22x", m.Header.Get("ce-id"))
	assert.Equal(t, "urn:agent:d%C3%A9%20mo/%07w", m.Header.Get("ce-source"))
	assert.Equal(t, "a%20b", m.Header.Get("ce-tenant"))
	assert.Equal(t, "application/json", m.Header.Get("Content-Type"))
	got, err := events.DecodeMsg(m.Subject, m.Header, m.Data, events.Subjects{})
	require.NoError(t, err)
	assert.Equal(t, want.ID, got.ID)
	assert.Equal(t, want.Source, got.Source)
	assert.Equal(t, want.Type, got.Type)
	assert.Equal(t, want.Time, got.Time)
	assert.Equal(t, want.Body, got.Body)
	assert.Equal(t, want.Extensions, got.Extensions)

	resumed := []byte(`{"specversion":"1.0","id":"r1","source":"urn:op","type":"io.seamguard.session.resumed","subject":"s1","data":{"note":"ok"}}`)
	ev, err := events.DecodeJSON(resumed, events.Meta{})
	require.NoError(t, err)
	for _, binary := range []bool{false, true} {
		m, err := (&publisher{binary: binary}).message(ev, resumed)
		require.NoError(t, err)
		assert.Equal(t, "seamguard.control.s1", m.Subject, "a resume goes to the control subject")
	}

	assert.Equal(t, `a\x1b[2Jb\x07\u202e\x0a`, termtext.Escape("a\x1b[2Jb\a\u202e\n"))
	assert.Equal(t, "plain: [0, 8) é", termtext.Escape("plain: [0, 8) é"))
}

// TestResume runs resume against a live serve in each case the processor
// can answer, and checks the report and the exit status of each.
func TestResume(t *testing.T) {
	l := startLive(t)
	gap := readLines(t, filepath.Join(storiesDir, "gap-then-resume.jsonl"))
	seed := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	closed := []string{
		renameLine(seed[0], 3),
		`{"specversion":"1.0","id":"closing-c3","source":"urn:agent:demo/worker-1","type":"io.seamguard.session.closed","subject":"ops-agent-42-c3","data":{}}`,
	}
	code, _, errs, _ := l.cli(t, "publish", "--wait", writeStory(t, "setup.jsonl", append(append(gap[:6:6], seed[:3]...), closed...)))
	require.Equal(t, 0, code, errs)

	t.Run("halted", func(t *testing.T) {
		code, out, errs, took := l.cli(t, "resume", "gap-then-resume", "--note", "chunk lost upstream (OPS-311)")
		require.Equal(t, 0, code, errs)
		assert.Less(t, took, 5*time.Second)
		assert.Regexp(t, `published session.resumed resume-\S+ for session gap-then-resume \(stream SEAMGUARD_EVENTS, sequence \d+\)`, out)
		assert.Contains(t, out, `session gap-then-resume resumed: its halt (since compaction "k1") is lifted; offsets [1200, 1500) are waived: recorded as lost, and counted as recoverable from now on`)
		// The next compaction is decided again, and allowed.
		code, out, errs, _ = l.cli(t, "publish", "--wait", writeStory(t, "k9.jsonl", []string{strings.Replace(strings.Replace(gap[8], `"k3"`, `"k9"`, 1), "-0009", "-0099", 1)}))
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "allowed   k9: summary [0, 4500), tail from 4500, head 7000; cured [sequence_gap]")
	})
	// A resume with no halt to lift is refused before anything is
	// published: the session's control subject stays empty, and so does
	// the verdict stream of the session (no rejection to read).
	refused := func(t *testing.T, session string, code int, want ...string) {
		t.Helper()
		lastControl := func() uint64 {
			s, err := l.js.Stream(context.Background(), "SEAMGUARD_EVENTS")
			require.NoError(t, err)
			m, err := s.GetLastMsgForSubject(context.Background(), processor.Config{}.Subjects().StoredControl(session))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return 0
			}
			require.NoError(t, err)
			return m.Sequence
		}
		control := lastControl()
		nEvents, nVerdicts := streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"), streamMsgCount(t, l.js, "SEAMGUARD_VERDICTS")
		got, out, errs, took := l.cli(t, "resume", session, "--note", "just in case")
		assert.Equal(t, code, got, errs)
		assert.Less(t, took, 5*time.Second)
		assert.NotContains(t, out, "published")
		for _, w := range want {
			assert.Contains(t, errs, w)
		}
		assert.Contains(t, errs, "nothing was published")
		assert.Equal(t, control, lastControl(), "nothing new on the control subject of %s", session)
		assert.Equal(t, nEvents, streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"), "no message added to the events stream")
		assert.Equal(t, nVerdicts, streamMsgCount(t, l.js, "SEAMGUARD_VERDICTS"), "no verdict added")
	}
	t.Run("not halted", func(t *testing.T) {
		refused(t, "ops-agent-42", exitNotHalted, "session ops-agent-42 is not halted (it is open, applied up to events sequence", "nothing to waive")
	})
	t.Run("unknown", func(t *testing.T) {
		refused(t, "no-such-session", exitRejected, "session no-such-session is unknown: the processor has applied no session.opened of it", "Check the id")
	})
	t.Run("closed", func(t *testing.T) {
		refused(t, "ops-agent-42-c3", exitRejected, "session ops-agent-42-c3 is closed: a closed session has no halt to lift")
	})
	t.Run("lifted already", func(t *testing.T) {
		// The halt lifted by the first subtest: a second resume has
		// nothing to waive.
		refused(t, "gap-then-resume", exitNotHalted, "session gap-then-resume is not halted (it is open")
	})
	t.Run("unknown, with a rejected input", func(t *testing.T) {
		// A session of which the stream holds an input the processor
		// rejected: resume waits for the processor to have applied it,
		// then finds the session unknown.
		code, _, errs, _ := l.cli(t, "publish", "--wait", writeStory(t, "orphan.jsonl", []string{renameLine(seed[1], 8)}))
		require.Equal(t, exitRejected, code, errs)
		code, out, errs, took := l.cli(t, "resume", "ops-agent-42-c8", "--note", "x")
		assert.Equal(t, exitRejected, code, errs)
		assert.Less(t, took, 5*time.Second)
		assert.NotContains(t, out, "published")
		assert.Contains(t, errs, "session ops-agent-42-c8 is unknown")
	})
	t.Run("usage", func(t *testing.T) {
		code, _, errs, _ := l.cli(t, "resume", "gap-then-resume")
		assert.Equal(t, 2, code)
		assert.Contains(t, errs, "--note is required")
		code, _, errs, _ = l.cli(t, "resume", "bad id", "--note", "x")
		assert.Equal(t, 2, code, errs)
	})
}

// TestResumeAndPublishWithoutProcessor: the streams exist but no processor
// runs. publish --wait publishes, waits its --timeout, and says that
// nothing answered and what to check, with its own exit status. resume
// publishes nothing while the processor has not applied the session's
// inputs, and says so; once it has (a serve ran, and stopped), resume
// publishes, waits, and says the resume is not taken yet.
func TestResumeAndPublishWithoutProcessor(t *testing.T) {
	srv := embedded.StartTest(t)
	_, err := processor.New(context.Background(), srv.JS, processor.Config{})
	require.NoError(t, err) // provisions the streams and buckets, never runs
	url := srv.Server.ClientURL()
	controlMsgs := func() uint64 {
		t.Helper()
		s, err := srv.JS.Stream(context.Background(), "SEAMGUARD_EVENTS")
		require.NoError(t, err)
		info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(processor.Config{}.Subjects().StoredControlFilter()))
		require.NoError(t, err)
		return uint64(len(info.State.Subjects))
	}

	code, out, errs, _ := cliRun(t, "resume", "gap-then-resume", "--note", "x", "--timeout", "700ms", "--nats-url", url)
	assert.Equal(t, exitRejected, code, errs)
	assert.NotContains(t, out, "published")
	assert.Contains(t, errs, "session gap-then-resume is unknown")

	code, _, errs, took := cliRun(t, "publish", filepath.Join(storiesDir, "seed-story.jsonl"), "--wait", "--timeout", "700ms", "--nats-url", url)
	assert.Equal(t, exitNoAnswer, code, errs)
	assert.Less(t, took, 4*time.Second)
	assert.Contains(t, errs, "published 57 event(s) of 1 session(s)")
	assert.Contains(t, errs, "everything is published, but the processor answered nothing for 700ms; still unanswered:")
	assert.Contains(t, errs, "seed-story.jsonl:55 (compaction.requested compact-1)")
	assert.Contains(t, errs, "seed-story.jsonl:57 (compaction.committed, session ops-agent-42 at stream sequence 57")

	// The gap story up to its halt, not applied: whether the session is
	// halted is not known, and nothing is published.
	gap := readLines(t, filepath.Join(storiesDir, "gap-then-resume.jsonl"))
	code, _, errs, _ = cliRun(t, "publish", writeStory(t, "gap.jsonl", gap[:6]), "--nats-url", url)
	require.Equal(t, 0, code, errs)
	code, out, errs, took = cliRun(t, "resume", "gap-then-resume", "--note", "x", "--timeout", "700ms", "--nats-url", url)
	assert.Equal(t, exitNoAnswer, code, errs)
	assert.Less(t, took, 3*time.Second)
	assert.NotContains(t, out, "published")
	assert.Contains(t, errs, "nothing was published: the events stream holds inputs of session gap-then-resume up to sequence 63, but the processor has applied them only up to 0 and did not catch up within --timeout 700ms")
	assert.Contains(t, errs, "Is seamguard serve running, with --prefix seamguard?")
	assert.Zero(t, controlMsgs(), "nothing on a control subject")

	// A serve applies them (the session halts), and stops.
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveErr lockedBuffer
	go func() {
		served <- run(ctx, []string{"serve", "--nats-url", url, "--log-level", "error"}, strings.NewReader(""), io.Discard, &serveErr)
	}()
	kv, err := srv.JS.KeyValue(context.Background(), "seamguard-sessions")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		e, err := kv.Get(context.Background(), "gap-then-resume")
		if err != nil {
			return false
		}
		st, err := processor.UnmarshalState(e.Value())
		return err == nil && st.Seq == 63 && st.Ledger.View().Status == "halted"
	}, 30*time.Second, 20*time.Millisecond, "the gap story's session halted")
	cancel()
	select {
	case code := <-served:
		require.Equal(t, 0, code, serveErr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context was cancelled")
	}

	code, out, errs, took = cliRun(t, "resume", "gap-then-resume", "--note", "x", "--timeout", "700ms", "--nats-url", url)
	assert.Equal(t, exitNoAnswer, code, errs)
	assert.Less(t, took, 3*time.Second)
	assert.Contains(t, out, "published session.resumed")
	assert.Regexp(t, `the resume is published \(stream SEAMGUARD_EVENTS, sequence 64\), but the processor did not take it within 700ms: is seamguard serve running, with --prefix seamguard\?`, errs)
	assert.Equal(t, uint64(1), controlMsgs())

	// No deployment at all: nothing is published, and the message says why.
	bare := embedded.StartTest(t)
	code, out, errs, _ = cliRun(t, "resume", "s1", "--note", "x", "--nats-url", bare.Server.ClientURL())
	assert.Equal(t, 1, code)
	assert.NotContains(t, out, "published")
	assert.Contains(t, errs, "there is no session bucket seamguard-sessions")
}

// TestResumeParked: a parked session is resumed whatever its state (its
// state grew past what the bucket takes, so the bucket holds an older one,
// or none): resume publishes, the processor takes the session out of its
// park and applies its waiting inputs, and resume says so.
func TestResumeParked(t *testing.T) {
	l := startLive(t, "--ack-wait", "2s", "--retry-for", "1s", "--park-after", "1s")
	ctx := context.Background()
	kvs, err := l.js.Stream(ctx, "KV_seamguard-sessions")
	require.NoError(t, err)
	small := kvs.CachedInfo().Config
	small.MaxMsgSize = 1024
	_, err = l.js.UpdateStream(ctx, small)
	require.NoError(t, err)

	line := func(n int, typ, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"b-%d","source":"urn:agent:test","type":"io.seamguard.%s","subject":"bloated","data":%s}`, n, typ, data)
	}
	lines := []string{line(0, "session.opened", `{"unit":"turns","recovery_floor":{"span":2,"unit":"turns"}}`)}
	for i := range 1800 {
		lines = append(lines, line(len(lines), "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1}`, i)))
	}
	for i := range 600 { // 600 ranges truncated: a state of some KiB
		lines = append(lines, line(len(lines), "context.truncated", fmt.Sprintf(`{"range":{"start":%d,"end":%d}}`, 3*i, 3*i+1)))
	}
	publishLines(t, l.js, lines)
	kv, err := l.js.KeyValue(ctx, "seamguard-sessions")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, processor.ParkedKey("bloated"))
		return err == nil
	}, time.Minute, 50*time.Millisecond, "the session parked")
	if e, err := kv.Get(ctx, "bloated"); err == nil {
		st, err := processor.UnmarshalState(e.Value())
		require.NoError(t, err)
		require.Less(t, st.Seq, uint64(len(lines)), "the stored state is behind")
		require.NotEqual(t, "halted", st.Ledger.View().Status)
	}

	// The limit lifted, the operator resumes it.
	small.MaxMsgSize = -1
	_, err = l.js.UpdateStream(ctx, small)
	require.NoError(t, err)
	code, out, errs, _ := l.cli(t, "resume", "bloated", "--note", "value limit lifted (OPS-1)")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "published session.resumed")
	assert.Regexp(t, `session bloated out of its park \(parked \S+: .*maximum.*\): its inputs after events sequence \d+ are applied; its state now stands at sequence \d+`, out)
	_, err = kv.Get(ctx, processor.ParkedKey("bloated"))
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the park record is gone")
	e, err := kv.Get(ctx, "bloated")
	require.NoError(t, err)
	st, err := processor.UnmarshalState(e.Value())
	require.NoError(t, err)
	assert.Equal(t, uint64(len(lines)+1), st.Seq, "every waiting input applied, and the resume")
	assert.Equal(t, "open", st.Ledger.View().Status)

	// Out of its park, and open: another resume has nothing to do.
	code, out, errs, _ = l.cli(t, "resume", "bloated", "--note", "again")
	assert.Equal(t, exitNotHalted, code, errs)
	assert.NotContains(t, out, "published")
}

// TestPublishStopsPartway: a run stopped by a line the events stream does
// not store (another event is stored under its message id) says how many
// of its events the stream holds by then, up to which FILE:LINE, and how to
// go on; the same command again finds those events published before.
func TestPublishStopsPartway(t *testing.T) {
	srv := embedded.StartTest(t)
	_, err := processor.New(context.Background(), srv.JS, processor.Config{})
	require.NoError(t, err) // provisions the streams; publish needs no processor
	url := srv.Server.ClientURL()
	seed := readLines(t, filepath.Join(storiesDir, "seed-story.jsonl"))
	clash := strings.Replace(seed[0], `"span":12`, `"span":13`, 1) // seed[0]'s source and id, other data
	require.NotEqual(t, seed[0], clash)
	a := writeStory(t, "a.jsonl", seed[:2])
	b := writeStory(t, "b.jsonl", []string{seed[2], clash, seed[3]})

	code, _, errs, _ := cliRun(t, "publish", a, b, "--nats-url", url)
	assert.Equal(t, 1, code, errs)
	assert.Contains(t, errs, b+":2: session.opened ops-agent-42-0001 of source urn:agent:demo/worker-1 (session ops-agent-42) was not stored: stream SEAMGUARD_EVENTS holds another event under its message id")
	assert.Contains(t, errs, "\nbefore that, 3 event(s) of this run are in the events stream, up to and including "+b+":1 (published 3 event(s) of 1 session(s)).")
	assert.Contains(t, errs, "Run the same command again within the events stream's dedupe window: what is stored already is reported as published before, not added again (or go on from the line after "+b+":1)")
	assert.NotContains(t, errs, "is not known")
	assert.Equal(t, uint64(3), streamMsgCount(t, srv.JS, "SEAMGUARD_EVENTS"))

	code, _, errs, _ = cliRun(t, "publish", a, b, "--nats-url", url)
	assert.Equal(t, 1, code, errs)
	assert.Contains(t, errs, "before that, 3 event(s) of this run are in the events stream, up to and including "+b+":1 (published 0 event(s) of 1 session(s); 3 more were in the events stream already")
	assert.Equal(t, uint64(3), streamMsgCount(t, srv.JS, "SEAMGUARD_EVENTS"))

	// The second file alone: its first line is stored (before).
	code, _, errs, _ = cliRun(t, "publish", b, "--nats-url", url)
	assert.Equal(t, 1, code, errs)
	assert.Contains(t, errs, "before that, 1 event(s) of this run are in the events stream, up to and including "+b+":1 (published 0 event(s)")

	// Stopped at its first line: nothing of the run is stored, and the
	// message says no more than what failed.
	code, _, errs, _ = cliRun(t, "publish", writeStory(t, "c.jsonl", []string{clash}), "--nats-url", url)
	assert.Equal(t, 1, code, errs)
	assert.Contains(t, errs, "was not stored")
	assert.NotContains(t, errs, "before that")
}

// TestPublishShippedIdentities publishes as the shipped agent identity: its
// events go in, and the gap story's session.resumed, which only the
// operator may publish, stops the run at its line, saying which line, what
// was refused and who may.
func TestPublishShippedIdentities(t *testing.T) {
	url := startShipped(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveOut, serveErr lockedBuffer
	go func() {
		served <- run(ctx, []string{"serve", "--nats-url", url, "--user", "processor", "--password", shippedPasswords["processor"], "--log-level", "error"},
			strings.NewReader(""), &serveOut, &serveErr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served:
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop after its context was cancelled")
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(serveOut.String(), "seamguard serving on") }, 20*time.Second, 10*time.Millisecond, serveErr.String())

	asAgent := []string{"--nats-url", url, "--user", "agent", "--password", shippedPasswords["agent"], "--inbox-prefix", "_INBOX"}
	code, _, errs, took := cliRun(t, append([]string{"publish", filepath.Join(storiesDir, "gap-then-resume.jsonl")}, asAgent...)...)
	assert.Equal(t, 1, code)
	assert.Less(t, took, 3*time.Second, errs)
	assert.Regexp(t, regexp.QuoteMeta(`gap-then-resume.jsonl:8: publishing session.resumed gap-then-resume-0008 on seamguard.control.gap-then-resume was refused: permission denied: user "agent" may not publish to "seamguard.control.gap-then-resume"`), errs)
	assert.Contains(t, errs, "the shipped operator identity (deploy/nats/permissions.conf) may")
	assert.Equal(t, 1, strings.Count(errs, "permission denied"), errs)

	nc, err := nats.Connect(url, nats.UserInfo("operator", shippedPasswords["operator"]), nats.CustomInboxPrefix(operatorInbox))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	assert.Equal(t, uint64(7), streamMsgCount(t, js, "SEAMGUARD_EVENTS"), "the 7 lines before the resume")
}

// TestDemoHint runs the commands the demo's closing hint prints, as
// printed, one after the other, in a folder laid out as a clone of the
// repository: serve (on a free port: the only flag added), publish the
// story, read the spill back.
func TestDemoHint(t *testing.T) {
	code, out, stderr := runCLI(t, "", "demo")
	require.Equal(t, 0, code, stderr)
	demoOut := out
	_, hint, ok := strings.Cut(out, "the same against a live server, from the root of a clone of the repository:\n")
	require.True(t, ok, out)
	var cmds [][]string
	for _, line := range strings.Split(hint, "\n") {
		if rest, ok := strings.CutPrefix(line, "  seamguard "); ok {
			cmds = append(cmds, strings.Fields(rest))
		}
	}
	require.Len(t, cmds, 3, hint)
	require.Equal(t, []string{"serve"}, cmds[0])
	require.Equal(t, "publish", cmds[1][0])
	require.Equal(t, []string{"spill", "get", "ops-agent-42/1.jsonl", "-o", "transcript.jsonl"}, cmds[2])

	root := t.TempDir()
	story, err := os.ReadFile(filepath.Join(storiesDir, "seed-story.jsonl"))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(root, "testdata", "stories"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "testdata", "stories", "seed-story.jsonl"), story, 0o644))
	t.Chdir(root)
	for _, k := range []string{"SEAMGUARD_NATS_URL", "SEAMGUARD_PREFIX", "SEAMGUARD_DATA_DIR", "SEAMGUARD_LISTEN"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}

	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan int, 1)
	var serveOut, serveErr lockedBuffer
	go func() {
		served <- run(ctx, append(cmds[0], "--listen", "127.0.0.1:0", "--log-level", "error"), strings.NewReader(""), &serveOut, &serveErr)
	}()
	defer func() {
		cancel()
		select {
		case code := <-served:
			assert.Equal(t, 0, code, serveErr.String())
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	re := regexp.MustCompile(`seamguard serving on (nats://127\.0\.0\.1:\d+)`)
	require.Eventually(t, func() bool { return re.MatchString(serveOut.String()) }, 20*time.Second, 10*time.Millisecond, serveErr.String())
	// The hint's clients use the default URL; this test's serve is on a
	// free port, which the environment variable names.
	t.Setenv("SEAMGUARD_NATS_URL", re.FindStringSubmatch(serveOut.String())[1])

	code, out, errs, _ := cliRun(t, cmds[1]...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, out, "testdata/stories/seed-story.jsonl:55 ops-agent-42         refused   compact-1: coverage_hole [0, 8); spill ops-agent-42/1.jsonl; next retry")
	code, _, errs, _ = cliRun(t, cmds[2]...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "verified ops-agent-42/1.jsonl")
	b, err := os.ReadFile(filepath.Join(root, "transcript.jsonl"))
	require.NoError(t, err)
	assert.Contains(t, string(b), "Do not touch anything under /etc.")
	// The demo's spill is this one, byte for byte.
	digest, size, err := spill.Digest(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Contains(t, demoOut, fmt.Sprintf("-> transcript.spilled  seamguard-spills/ops-agent-42/1.jsonl: 55 events, %d bytes, %s\n", size, digest),
		"the demo's spill is the one publishing the story makes")
	_, err = os.Stat(filepath.Join(root, "seamguard-data"))
	assert.NoError(t, err, "serve keeps its data where the hint says")
}

// agentStory is a short session of one agent whose event ids are 1, 2, 3
// and 4, as an agent numbering its events would send them: opened, two
// turns, and a compaction request the processor allows.
func agentStory(source, session, content string) []string {
	ev := func(id, typ, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":%q,"type":"io.seamguard.%s","subject":%q,"time":"2026-11-02T09:00:0%sZ","datacontenttype":"application/json","data":%s}`,
			id, source, typ, session, id, data)
	}
	return []string{
		ev("1", "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`),
		ev("2", "turn.appended", fmt.Sprintf(`{"offset":0,"size":1,"content":%q}`, content)),
		ev("3", "turn.appended", `{"offset":1,"size":1}`),
		ev("4", "compaction.requested", `{"request_id":"r","summarizer_input":{"start":0,"end":2},"summary_range":{"start":0,"end":1},"tail_start":1}`),
	}
}

// TestPublishSameIDsTwoSources: two agents use the same event ids (1 to 4)
// for two sessions; publish stores both and the processor decides both.
// Publishing one again is reported as published before; an event of the
// same source and id but other content is an error naming both, exit 1,
// and nothing of it is stored.
func TestPublishSameIDsTwoSources(t *testing.T) {
	l := startLive(t)
	a := writeStory(t, "a.jsonl", agentStory("urn:agent:a", "session-a", "from a"))
	b := writeStory(t, "b.jsonl", agentStory("urn:agent:b", "session-b", "from b"))

	code, out, errs, _ := l.cli(t, "publish", a, b, "--wait")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "published 8 event(s) of 2 session(s)")
	assert.NotContains(t, errs, "more were in the events stream already")
	assert.Regexp(t, `a\.jsonl:4 session-a +allowed +r:`, out)
	assert.Regexp(t, `b\.jsonl:4 session-b +allowed +r:`, out)
	assert.Contains(t, errs, "the processor handled them all: 2 allowed")
	assert.Equal(t, uint64(8), streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"))

	code, _, errs, _ = l.cli(t, "publish", b)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "published 0 event(s) of 1 session(s); 4 more were in the events stream already")

	other := agentStory("urn:agent:b", "session-b", "something else")
	changed := writeStory(t, "changed.jsonl", other[1:2])
	code, _, errs, _ = l.cli(t, "publish", changed)
	assert.Equal(t, 1, code, errs)
	assert.Contains(t, errs, "changed.jsonl:1: turn.appended 2 of source urn:agent:b (session session-b) was not stored")
	assert.Contains(t, errs, "holds another event under its message id "+events.MsgID("urn:agent:b", "2"))
	assert.Contains(t, errs, "turn.appended 2 of source urn:agent:b (session session-b, sequence 6), which differs in data")
	assert.NotContains(t, errs, "more were in the events stream already")
	assert.Equal(t, uint64(8), streamMsgCount(t, l.js, "SEAMGUARD_EVENTS"))
}
