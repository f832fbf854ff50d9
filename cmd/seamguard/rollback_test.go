package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/longtest"
	"github.com/seamguard/seamguard/processor"
)

// TestStateRolledBack damages the seed story's stored session state between
// two runs of serve on one data directory, as a restored backup, a deleted
// key or an older instance's write would, under both fsync settings: the
// state put back to a copy taken mid-story, and the state deleted. serve
// must catch the session up from the events stream before it decides
// anything, so the story's verdicts are exactly those `seamguard check`
// gives; in particular the compaction never halts on offsets the stream
// still holds, and no later event is rejected as of an unknown session.
// The same damage done while serve runs (its copy in memory is then behind
// the bucket's revision) must be caught up alike.
func TestStateRolledBack(t *testing.T) {
	for _, story := range []struct {
		file, session    string
		copyAt, damageAt int // lines published before the copy, before the damage
		live             bool
	}{
		// The copy mid-story, the damage after the truncation and the four
		// turns after it, before the compaction.
		{"seed-story.jsonl", "ops-agent-42", 30, 54, true},
		// The copy before the operator's resume (on the control subject),
		// the damage after it: the catch-up must apply the resume, or the
		// retry after it would be refused as halted.
		{"gap-then-resume.jsonl", "gap-then-resume", 7, 8, false},
	} {
		lines := readLines(t, filepath.Join(storiesDir, story.file))
		want := offlineVerdicts(t, lines)
		for _, sync := range []string{"always", "2m"} {
			for _, damage := range []string{"rolled back", "deleted"} {
				for _, live := range []bool{false, true} {
					if live && !story.live {
						continue
					}
					// The fast suite runs the syncing server's cases, where
					// a trusted state was the danger, and the long suite all.
					if !longtest.Enabled() && (sync != "always" || live) {
						continue
					}
					name := fmt.Sprintf("%s/sync %s/%s/%s", story.file, sync, damage, map[bool]string{false: "between runs", true: "while serving"}[live])
					t.Run(name, func(t *testing.T) {
						dir := t.TempDir()
						sv := startServeIn(t, dir, sync)
						js := sv.js
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
						defer cancel()
						kv, err := js.KeyValue(ctx, "seamguard-sessions")
						require.NoError(t, err)

						publishLines(t, js, lines[:story.copyAt])
						waitStateSeq(t, kv, story.session, uint64(story.copyAt))
						copied, err := kv.Get(ctx, story.session)
						require.NoError(t, err)
						publishLines(t, js, lines[story.copyAt:story.damageAt])
						waitStateSeq(t, kv, story.session, uint64(story.damageAt))

						if !live {
							// A new run holds nothing in memory; the damage is
							// done before any input reaches it.
							sv.stop(t)
							sv = startServeIn(t, dir, sync)
							js = sv.js
							kv, err = js.KeyValue(ctx, "seamguard-sessions")
							require.NoError(t, err)
						}
						switch damage {
						case "rolled back":
							_, err = kv.Put(ctx, story.session, copied.Value())
						case "deleted":
							err = kv.Delete(ctx, story.session)
						}
						require.NoError(t, err)

						publishLines(t, js, lines[story.damageAt:])
						require.Eventually(t, func() bool {
							got, _ := verdictBodies(t, js)
							return len(got) >= len(want)
						}, time.Minute, 50*time.Millisecond)
						time.Sleep(300 * time.Millisecond) // let anything extra surface
						got, counts := verdictBodies(t, js)
						for id, n := range counts {
							assert.Equal(t, 1, n, "verdict %s stored %d times", id, n)
						}
						assert.Equal(t, want, got, "served verdicts differ from check's")
						sv.stop(t)
					})
				}
			}
		}
	}
}

// servedIn is a serve run in-process on its embedded server, with a
// JetStream context on that server.
type servedIn struct {
	cancel context.CancelFunc
	done   chan int
	errs   *lockedBuffer
	nc     *nats.Conn
	js     jetstream.JetStream
	ended  bool
}

// startServeIn runs serve on its embedded server with data in dir and the
// given --sync-interval, and connects to it.
func startServeIn(t *testing.T, dir, sync string) *servedIn {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &servedIn{cancel: cancel, done: make(chan int, 1), errs: &lockedBuffer{}}
	var out lockedBuffer
	go func() {
		s.done <- run(ctx, []string{"serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--sync-interval", sync,
			"--source", "urn:seamguard:test", "--log-level", "error"}, strings.NewReader(""), &out, s.errs)
	}()
	t.Cleanup(func() { s.stop(t) })
	re := regexp.MustCompile(`seamguard serving on (nats://127\.0\.0\.1:\d+)`)
	require.Eventually(t, func() bool { return re.MatchString(out.String()) }, 30*time.Second, 10*time.Millisecond, s.errs.String())
	nc, err := nats.Connect(re.FindStringSubmatch(out.String())[1])
	require.NoError(t, err)
	s.nc = nc
	s.js, err = jetstream.New(nc)
	require.NoError(t, err)
	return s
}

func (s *servedIn) stop(t *testing.T) {
	t.Helper()
	if s.ended {
		return
	}
	s.ended = true
	if s.nc != nil {
		s.nc.Close()
	}
	s.cancel()
	select {
	case code := <-s.done:
		assert.Equal(t, 0, code, s.errs.String())
	case <-time.After(30 * time.Second):
		t.Error("serve did not stop")
	}
}

// waitStateSeq waits until session's stored state has applied the input
// at stream sequence seq.
func waitStateSeq(t *testing.T, kv jetstream.KeyValue, session string, seq uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		e, err := kv.Get(context.Background(), session)
		if err != nil {
			return false
		}
		st, err := processor.UnmarshalState(e.Value())
		return err == nil && st.Seq >= seq
	}, time.Minute, 20*time.Millisecond)
}
