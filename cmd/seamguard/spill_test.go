package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/inspect"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// chainStory is session s: opened, three turns, an unsafe compaction (seq
// 5), two turns and another (seq 8).
func chainStory() []string {
	ev := func(n int, typ, data string) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"c-%d","source":"urn:test","type":"io.seamguard.%s","subject":"s","data":%s}`, n, typ, data)
	}
	turn := func(n, off int) string {
		return ev(n, "turn.appended", fmt.Sprintf(`{"offset":%d,"size":1,"content":"turn %d"}`, off, off))
	}
	req := func(n, head int) string {
		return ev(n, "compaction.requested", fmt.Sprintf(`{"request_id":"r%d","summarizer_input":{"start":0,"end":%d},"summary_range":{"start":0,"end":0},"tail_start":%d}`, n, head, head))
	}
	return []string{
		ev(1, "session.opened", `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`),
		turn(2, 0), turn(3, 1), turn(4, 2), req(5, 3), turn(6, 3), turn(7, 4), req(8, 5),
	}
}

// spillChain starts a server, publishes chainStory into a provisioned
// deployment, and spills it as a chain of two: s/1.jsonl (events 1 to 5)
// and s/2.jsonl after it (6 to 8). It returns the lines published.
func spillChain(t *testing.T) (*embedded.Test, context.Context, processor.Config, []string) {
	t.Helper()
	srv := embedded.StartTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cfg := processor.Config{}
	_, err := processor.Provision(ctx, srv.JS, cfg)
	require.NoError(t, err)
	lines := chainStory()
	publishLines(t, srv.JS, lines)
	store := &spill.Store{JS: srv.JS, Stream: cfg.Names().Events, Subjects: cfg.Subjects(), Bucket: cfg.Names().Spills}
	for _, req := range []ledger.SpillRequest{
		{Session: "s", Name: "s/1.jsonl", FirstSeq: 1, LastSeq: 5, Events: 5, Range: events.Range{End: 3}},
		{Session: "s", Name: "s/2.jsonl", Previous: "s/1.jsonl", FirstSeq: 6, LastSeq: 8, Events: 3, Range: events.Range{End: 5}},
	} {
		_, err := store.Write(ctx, req)
		require.NoError(t, err)
	}
	return srv, ctx, cfg, lines
}

// TestSpillGetChain: `spill get` reads a spill's whole chain by default,
// and the spill alone with --only.
func TestSpillGetChain(t *testing.T) {
	srv, _, _, lines := spillChain(t)
	url := srv.Server.ClientURL()

	file := filepath.Join(t.TempDir(), "t.jsonl")
	code, _, stderr := runCLI(t, "", "spill", "get", "s/2.jsonl", "--nats-url", url, "-o", file)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "verified s/2.jsonl and its chain: 2 spill(s), 8 events")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	require.Len(t, got, 8)
	assert.Equal(t, canonical(t, lines), canonical(t, got), "the chain is the session's events, oldest first")

	code, out, stderr := runCLI(t, "", "spill", "get", "--only", "s/2.jsonl", "--nats-url", url)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "verified s/2.jsonl:")
	got = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	assert.Equal(t, canonical(t, lines[5:]), canonical(t, got), "--only: the events after the previous spill")

	code, out, stderr = runCLI(t, "", "spill", "get", "-h")
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "whole chain is read, oldest spill first")
	assert.Contains(t, out, "-only")
}

// TestVerifySpillChain: inspect reads a spill's whole chain and checks it
// against the session's accepted events, derived again from the stream.
func TestVerifySpillChain(t *testing.T) {
	srv, ctx, cfg, _ := spillChain(t)
	url := srv.Server.ClientURL()
	src := inspect.Source{JS: srv.JS, Config: cfg}
	chk, err := src.VerifySpill(ctx, "s/2.jsonl", ledger.Config{})
	require.NoError(t, err)
	assert.Empty(t, chk.Problems)
	assert.Len(t, chk.Chain, 2)
	assert.Equal(t, uint64(8), chk.Lines)
	assert.Equal(t, uint64(8), chk.Accepted)

	code, _, stderr := runCLI(t, "", "inspect", "s", "--rebuild", "--verify-spills", "--nats-url", url)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "the chain holds exactly the session's accepted events")

	// A turn of the first stretch deleted from the stream: the chain holds
	// an event the session no longer shows.
	str, err := srv.JS.Stream(ctx, cfg.Names().Events)
	require.NoError(t, err)
	require.NoError(t, str.DeleteMsg(ctx, 3))
	chk, err = src.VerifySpill(ctx, "s/2.jsonl", ledger.Config{})
	require.NoError(t, err)
	t.Log(strings.Join(chk.Problems, "\n"))
	require.NotEmpty(t, chk.Problems)
	assert.Contains(t, chk.Problems[0], "the chain holds 8 events, but session s accepted 7")
	assert.Contains(t, strings.Join(chk.Problems, "\n"), "s/1.jsonl holds 5 events")
}
