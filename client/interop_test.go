package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nats_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/internal/longtest"
)

// Interop: events written by other CloudEvents producers than this package
// are decided like its own. The seed story (testdata/stories/seed-story.jsonl)
// is published by the nats CLI with ce-* headers, and by the CloudEvents
// SDK's nats_jetstream sender in binary and structured mode; each time the
// processor must answer with the verdicts of the offline check's golden
// file: the refusal with a spill, then the allowed retry.

const (
	seedStory  = "../testdata/stories/seed-story.jsonl"
	seedGolden = "../testdata/stories/golden/seed-story.out.jsonl"
)

// natsCLIModule is the nats CLI the interop test runs.
const natsCLIModule = "github.com/nats-io/natscli/nats@v0.5.0"

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(l)) > 0 {
			out = append(out, l)
		}
	}
	return out
}

// golden returns the verdicts the offline check decided for the seed story.
func golden(t *testing.T) []*events.Verdict {
	t.Helper()
	var out []*events.Verdict
	for _, l := range readLines(t, seedGolden) {
		v, err := events.DecodeVerdict(l)
		require.NoError(t, err)
		out = append(out, v)
	}
	require.Len(t, out, 3, "spilled, refused, allowed")
	return out
}

// decision is what a verdict decided, without what depends on the bytes
// the input was stored as (the spill's digest and size).
func decision(t *testing.T, v *events.Verdict) string {
	t.Helper()
	blank := func(h *events.SpillHandle) *events.SpillHandle {
		c := *h
		c.Digest, c.Size = "", 0
		return &c
	}
	var data any
	switch d := v.Data.(type) {
	case *events.SpillHandle:
		data = blank(d)
	case *events.CompactionRefused:
		c := *d
		if c.Spill != nil {
			c.Spill = blank(c.Spill)
		}
		data = c
	case *events.CompactionAllowed:
		c := *d
		c.RecoveredBy = nil
		for _, h := range d.RecoveredBy {
			c.RecoveredBy = append(c.RecoveredBy, *blank(&h))
		}
		data = c
	default:
		data = d
	}
	b, err := json.Marshal(struct {
		ID, Type, Session, Cause string
		Data                     any
	}{v.ID, v.Type, v.Session, v.Cause.ID, data})
	require.NoError(t, err)
	return string(b)
}

// requireSeedVerdicts waits for the seed story's three verdicts and holds
// them to the golden file: same ids (derived from the inputs' source and
// id), same causes, same decisions, and a spill that exists.
func requireSeedVerdicts(t *testing.T, sg *seamguard) []*events.Verdict {
	t.Helper()
	want := golden(t)
	got, err := sg.verdicts(testContext(t), len(want), 30*time.Second)
	require.NoError(t, err)
	for i := range want {
		assert.Equal(t, decision(t, want[i]), decision(t, got[i]), "verdict %d", i)
	}
	h := got[0].Data.(*events.SpillHandle)
	obs, err := sg.js.ObjectStore(testContext(t), h.Bucket)
	require.NoError(t, err)
	info, err := obs.GetInfo(testContext(t), h.Name)
	require.NoError(t, err)
	assert.Equal(t, h.Digest, info.Digest)
	return got
}

// TestInteropNATSCLI publishes the seed story with the nats CLI, one
// `nats pub --jetstream` per event, in binary content mode: every attribute
// a --header ce-<name>:<value>, the data as the body.
//
// The CLI is taken from SEAMGUARD_NATS_CLI (a path; "skip" skips the test),
// else from the user cache directory, else built there once with go install
// (about 40s with an empty module cache, 3s with a warm build cache). The
// test is skipped, saying why, when it cannot be built (no module proxy).
func TestInteropNATSCLI(t *testing.T) {
	cli := natsCLI(t)
	sg := newSeamguard(t, true)
	lines := readLines(t, seedStory)
	start := time.Now()
	for i, l := range lines {
		args := append([]string{"pub", "--server", sg.srv.ClientURL(), "--jetstream", "--no-templates"}, cliHeaders(t, l)...)
		var ev struct {
			Subject string
			Data    json.RawMessage
		}
		require.NoError(t, json.Unmarshal(l, &ev))
		args = append(args, sg.cfg.Subjects().Events(ev.Subject), string(ev.Data))
		ctx, cancel := context.WithTimeout(testContext(t), 30*time.Second)
		out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
		cancel()
		require.NoError(t, err, "event %d: nats %s\n%s", i+1, strings.Join(args, " "), out)
	}
	t.Logf("published %d events with the nats CLI in %s", len(lines), time.Since(start).Round(time.Millisecond))

	// What the CLI stored is binary mode.
	s, err := sg.js.Stream(testContext(t), sg.cfg.Names().Events)
	require.NoError(t, err)
	first, err := s.GetMsg(testContext(t), 1)
	require.NoError(t, err)
	assert.Equal(t, "1.0", first.Header.Get("ce-specversion"))
	assert.Equal(t, events.MsgID(first.Header.Get("ce-source"), "ops-agent-42-0001"), first.Header.Get("Nats-Msg-Id"))

	got := requireSeedVerdicts(t, sg)
	// Stored byte for byte as the offline check read them, the spill is the
	// golden one, digest included.
	assert.Equal(t, golden(t)[0].Data, got[0].Data)

	// The processor's recover service is a NATS micro service: the CLI
	// lists it, describes its endpoint and counts its requests.
	for _, args := range [][]string{{"micro", "ls"}, {"micro", "info", "seamguard"}, {"micro", "stats", "seamguard"}} {
		ctx, cancel := context.WithTimeout(testContext(t), 30*time.Second)
		out, err := exec.CommandContext(ctx, cli, append(args, "--server", sg.srv.ClientURL())...).CombinedOutput()
		cancel()
		require.NoError(t, err, "nats %s\n%s", strings.Join(args, " "), out)
		assert.Contains(t, string(out), "seamguard", "nats %s", strings.Join(args, " "))
		if args[1] == "info" {
			assert.Contains(t, string(out), "seamguard.recover.*", "nats micro info names the endpoint's subject")
		}
	}
}

// cliHeaders turns one structured event into the CLI's --header flags:
// ce-<attribute> for every attribute but data and datacontenttype, which
// becomes Content-Type, and Nats-Msg-Id = events.MsgID(source, id).
func cliHeaders(t *testing.T, line []byte) []string {
	t.Helper()
	var attrs map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(line, &attrs))
	var out []string
	var source, id string
	for _, name := range []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype"} {
		raw, ok := attrs[name]
		if !ok {
			continue
		}
		var val string
		require.NoError(t, json.Unmarshal(raw, &val), "attribute %s", name)
		key := "ce-" + name
		if name == "datacontenttype" {
			key = "Content-Type"
		}
		out = append(out, "--header", key+":"+val)
		switch name {
		case "id":
			id = val
		case "source":
			source = val
		}
	}
	return append(out, "--header", "Nats-Msg-Id:"+events.MsgID(source, id))
}

// natsCLI returns the path of a nats CLI v0.5.0, building it into the user
// cache directory if needed, or skips the test.
func natsCLI(t *testing.T) string {
	t.Helper()
	switch env := os.Getenv("SEAMGUARD_NATS_CLI"); env {
	case "skip":
		t.Skip("SEAMGUARD_NATS_CLI=skip")
	case "":
	default:
		requireCLIVersion(t, env)
		return env
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no user cache directory to build the nats CLI in (%v); set SEAMGUARD_NATS_CLI to a nats binary built with go install %s", err, natsCLIModule)
	}
	dir := filepath.Join(cache, "seamguard", "natscli-v0.5.0")
	bin := filepath.Join(dir, "nats")
	if _, err := os.Stat(bin); err == nil {
		requireCLIVersion(t, bin)
		return bin
	}
	if !longtest.Enabled() {
		// Building it downloads about 310 MB of modules on a cold cache:
		// the long suite does it once, the fast one uses it once built.
		t.Skipf("the nats CLI is not built yet (%s): the long suite (%s=1) builds it once; or set SEAMGUARD_NATS_CLI to a nats v0.5.0 binary", bin, longtest.Env)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the nats CLI is not in %s and there is no go tool to build it; run: GOBIN=%s go install %s", dir, dir, natsCLIModule)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	// Build into a directory of its own, then rename, so that concurrent
	// test runs never see half a binary.
	tmp, err := os.MkdirTemp(dir, "build-")
	require.NoError(t, err)
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	// Said on the terminal at once, not only in the test's log: on a cold
	// module cache this is the longest wait of go test ./...
	fmt.Fprintf(os.Stderr, "seamguard interop test: building the nats CLI (go install %s) into %s, once; on a cold module cache it downloads about 310 MB of modules and takes minutes. SEAMGUARD_NATS_CLI=skip skips it.\n", natsCLIModule, dir)
	cmd := exec.CommandContext(ctx, goTool, "install", natsCLIModule)
	cmd.Dir = tmp // outside this module
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-buildvcs=false")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Skipf("cannot build the nats CLI (go install %s: %v), so the CLI interop test is skipped:\n%s\nBuild it by hand with GOBIN=%s go install %s, or point SEAMGUARD_NATS_CLI at a nats v0.5.0 binary",
			natsCLIModule, err, tail(out), dir, natsCLIModule)
	}
	t.Logf("built the nats CLI in %s into %s", time.Since(start).Round(100*time.Millisecond), dir)
	if err := os.Rename(filepath.Join(tmp, "nats"), bin); err != nil && !errors.Is(err, os.ErrExist) {
		require.NoError(t, err)
	}
	requireCLIVersion(t, bin)
	return bin
}

func requireCLIVersion(t *testing.T, bin string) {
	t.Helper()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err, "%s --version: %s", bin, out)
	require.Equal(t, "v0.5.0", strings.TrimSpace(string(out)), "%s is not the nats CLI v0.5.0", bin)
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

// TestInteropCloudEventsSDK publishes the seed story with the CloudEvents
// SDK's nats_jetstream sender, as an agent written against the SDK would,
// in binary mode (its default) and in structured mode (no headers at all).
func TestInteropCloudEventsSDK(t *testing.T) {
	for _, structured := range []bool{false, true} {
		name := "binary"
		if structured {
			name = "structured"
		}
		t.Run(name, func(t *testing.T) {
			sg := newSeamguard(t, true)
			ctx := testContext(t)
			sender, err := nats_jetstream.NewSenderFromConn(sg.nc, sg.cfg.Names().Events, sg.cfg.Subjects().Events("ops-agent-42"), nil)
			require.NoError(t, err)
			defer sender.Close(ctx)
			sendCtx := ctx
			if structured {
				sendCtx = binding.WithForceStructured(ctx)
			}
			for i, l := range readLines(t, seedStory) {
				var e event.Event
				require.NoError(t, json.Unmarshal(l, &e))
				require.NoError(t, sender.Send(sendCtx, binding.ToMessage(&e)), "event %d", i+1)
			}
			first, err := jsread.LeaderGet(ctx, sg.nc, sg.cfg.Names().Events, 1, "")
			require.NoError(t, err)
			require.NotNil(t, first)
			if structured {
				assert.Empty(t, first.Header, "the SDK writes structured mode without headers")
			} else {
				assert.Equal(t, "1.0", first.Header.Get("ce-specversion"))
			}
			requireSeedVerdicts(t, sg)
		})
	}
}
