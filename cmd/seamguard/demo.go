package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// The closing hint's commands: serve, then publish the story the demo
// plays (testdata/stories/seed-story.jsonl is session demoSession).
const (
	demoHintServe   = "  seamguard serve"
	demoHintPublish = "  seamguard publish testdata/stories/seed-story.jsonl --wait"
)

// demoSession is the session the demo plays; pinnedSession plays it again
// with the user's rule pinned.
const (
	demoSession   = "ops-agent-42"
	pinnedSession = "ops-agent-43"
)

func runDemo(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keep := fs.Bool("keep", false, "keep the embedded server's data directory and name it at the end")
	var timeout time.Duration
	fs.Var(durations(&timeout, 30*time.Second, time.Second, time.Hour), "timeout", "how long to wait for each verdict")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard demo [--keep]")
		fmt.Fprintln(stderr, "\nStarts an embedded NATS server and the processor, plays the seed story as an")
		fmt.Fprintln(stderr, "agent would, then again with the user's rule pinned, and prints what seamguard")
		fmt.Fprintln(stderr, "decided. Needs nothing else running.")
		fs.PrintDefaults()
	}
	if pos, err := parseInterleaved(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: demo takes no arguments, got %q", errUsage, pos)
	}
	dir, err := os.MkdirTemp("", "seamguard-demo-")
	if err != nil {
		return fmt.Errorf("cannot create a data directory: %w", err)
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	srv, err := embedded.Start(embedded.Config{StoreDir: dir})
	if err != nil {
		return err
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("seamguard demo"))
	if err != nil {
		return fmt.Errorf("cannot connect to the embedded server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := processor.Config{Source: "urn:seamguard:demo", SpillVerify: true}
	p, err := processor.New(ctx, js, cfg, processor.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() { stop(); <-done }()

	subj := p.Config().Subjects()
	verdicts, err := nc.SubscribeSync(subj.Verdict(demoSession, "*"))
	if err != nil {
		return err
	}
	w := &timeline{out: stdout}
	w.printf("seamguard demo: embedded NATS JetStream at %s\n", srv.ClientURL())
	w.printf("an agent publishes its session as CloudEvents (binary mode, ce-* headers) on %s\n\n", subj.Events(demoSession))

	a := &agent{js: js, subj: subj, session: demoSession}
	next := func() (*events.Verdict, error) {
		m, err := verdicts.NextMsg(timeout)
		if err != nil {
			return nil, fmt.Errorf("no verdict within %s: %w", timeout, err)
		}
		return events.DecodeVerdict(m.Data)
	}

	w.printf("session %s opens: offsets count turns, recovery floor = the last 12 turns\n", demoSession)
	if err := a.opening(ctx, w, false); err != nil {
		return err
	}
	req := map[string]any{"request_id": "compact-1", "summarizer_input": rng(8, 52), "summary_range": rng(8, 40), "tail_start": 40, "occupancy": 163000, "threshold": 160000}
	w.printf("\nthe agent asks to compact: summarize [8, 40) from input [8, 52), keep the tail from 40 verbatim\n")
	w.printf("(the seed's own check passes this: the floor [40, 52) is in the tail and in the input)\n")
	if err := a.send(ctx, "compaction.requested", req); err != nil {
		return err
	}
	var handle *events.SpillHandle
	for range 2 {
		v, err := next()
		if err != nil {
			return err
		}
		switch d := v.Data.(type) {
		case *events.SpillHandle:
			handle = d
			w.printf("  -> transcript.spilled  %s/%s: %d events, %d bytes, %s\n", d.Bucket, d.Name, d.Events, d.Size, d.Digest)
		case *events.CompactionRefused:
			for _, r := range d.Reasons {
				w.printf("  -> compaction.refused  %s at %s\n", r.Code, fmtRanges(r.AtRisk))
				w.printf("                         %s\n", r.Message)
			}
			w.printf("                         next: %s\n", d.Next)
		default:
			return fmt.Errorf("unexpected verdict %s", v.Type)
		}
	}
	if handle == nil {
		return errors.New("the refusal came without a spill")
	}
	w.printf("\nthe agent retries the same compaction\n")
	if err := a.send(ctx, "compaction.requested", req); err != nil {
		return err
	}
	if err := a.allowedThenCommit(ctx, w, next, "  the agent commits it\n"); err != nil {
		return err
	}

	// Read the spill back the way an operator or the agent would.
	var buf bytes.Buffer
	store := &spill.Store{JS: js, Stream: p.Config().Names().Events, Subjects: subj, Bucket: handle.Bucket}
	if _, err := store.Get(ctx, handle.Name, &buf); err != nil {
		return fmt.Errorf("reading the spill back: %w", err)
	}
	first := strings.SplitN(buf.String(), "\n", 3)
	var turn0 struct {
		Data struct {
			Content string `json:"content"`
		} `json:"data"`
	}
	if len(first) > 1 {
		_ = json.Unmarshal([]byte(first[1]), &turn0)
	}
	w.printf("\nthe spill reads back whole (digest verified); its turn 0 still says:\n  %q\n", turn0.Data.Content)
	if err := demoPinned(ctx, nc, js, subj, w, timeout); err != nil {
		return err
	}
	// The way on to a live server: the commands, as they work (TestDemoHint
	// runs them). The story file holds the session played first here.
	w.printf("\nthe same against a live server, from the root of a clone of the repository:\n")
	w.printf("%s\n    (in one terminal; it serves on %s until interrupted, its data in ./seamguard-data)\n", demoHintServe, defaultURL)
	w.printf("%s\n    (in another: plays the story's events in and prints each verdict)\n", demoHintPublish)
	w.printf("  seamguard spill get %s -o transcript.jsonl\n    (reads the spill back, digest verified)\n", handle.Name)
	if *keep {
		w.printf("\ndata kept in %s\n", dir)
	}
	return w.err
}

// opening publishes the session's opening, its 52 turns and the budget
// truncation of [0, 8), and tells them; pin marks the user's rule, turn 0,
// as pinned.
func (a *agent) opening(ctx context.Context, w *timeline, pin bool) error {
	if err := a.send(ctx, "session.opened", map[string]any{"unit": "turns", "recovery_floor": map[string]any{"span": 12, "unit": "turns"}, "window": 200000, "trigger": 160000}); err != nil {
		return err
	}
	for _, t := range demoTurns() {
		off := t["offset"].(int)
		if pin && off == 0 {
			t["pinned"] = true
		}
		if err := a.send(ctx, "turn.appended", t); err != nil {
			return err
		}
		switch {
		case off == 0 && pin:
			w.printf("  turn %-6d %-9s %q  (pinned)\n", off, t["role"], t["content"])
		case off <= 1:
			w.printf("  turn %-6d %-9s %q\n", off, t["role"], t["content"])
		case off == 2:
			w.printf("  turns 2-7    six turns exploring the deployment\n")
		case off == 8:
			w.printf("  turns 8-47   forty large tool results (3,700 tokens each)\n")
		case off == 48:
			w.printf("  turns 48-51  four short turns\n")
		}
		if off == 47 {
			w.printf("  budget enforcement truncates turns [0, 8): the /etc constraint and the plan leave the context\n")
			if err := a.send(ctx, "context.truncated", map[string]any{"range": rng(0, 8), "stage": "budget"}); err != nil {
				return err
			}
		}
	}
	return nil
}

// demoPinned plays the story again with the user's rule pinned: the spill
// cures the hole but not the pin, so the compaction is refused until the
// agent carries the rule into its new context.
func demoPinned(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, subj events.Subjects, w *timeline, timeout time.Duration) error {
	verdicts, err := nc.SubscribeSync(subj.Verdict(pinnedSession, "*"))
	if err != nil {
		return err
	}
	defer func() { _ = verdicts.Unsubscribe() }()
	next := func() (*events.Verdict, error) {
		m, err := verdicts.NextMsg(timeout)
		if err != nil {
			return nil, fmt.Errorf("no verdict within %s: %w", timeout, err)
		}
		return events.DecodeVerdict(m.Data)
	}
	// refusal reads a refusal (and the spill before it, if one comes).
	explained := false
	refusal := func(spills bool) error {
		for range 2 {
			v, err := next()
			if err != nil {
				return err
			}
			switch d := v.Data.(type) {
			case *events.SpillHandle:
				if !spills {
					return errors.New("a spill came where none was due")
				}
				w.printf("  -> transcript.spilled  %s/%s\n", d.Bucket, d.Name)
				continue
			case *events.CompactionRefused:
				for _, r := range d.Reasons {
					w.printf("  -> compaction.refused  %s at %s\n", r.Code, fmtRanges(r.AtRisk))
					if r.Code == events.ReasonPinDropped && !explained {
						w.printf("                         %s\n", r.Message)
						explained = true
					}
				}
				if len(d.Cured) > 0 {
					w.printf("                         cured %v: the spill holds those offsets; only the pin stands in the way\n", d.Cured)
				}
				spill := "none"
				if d.Spill != nil {
					spill = d.Spill.Name
				}
				w.printf("                         spill: %s, next: %s\n", spill, d.Next)
				if d.Next != events.NextCarryPins {
					return fmt.Errorf("expected next %s, got %s", events.NextCarryPins, d.Next)
				}
				return nil
			default:
				return fmt.Errorf("unexpected verdict %s", v.Type)
			}
		}
		return errors.New("no refusal came")
	}

	w.printf("\nthe evidence is safe, but the agent's new context still lacks the /etc rule:\n")
	w.printf("recoverable is not remembered. The same story as session %s, with the rule pinned\n", pinnedSession)
	a := &agent{js: js, subj: subj, session: pinnedSession}
	if err := a.opening(ctx, w, true); err != nil {
		return err
	}
	req := map[string]any{"request_id": "compact-1", "summarizer_input": rng(8, 52), "summary_range": rng(8, 40), "tail_start": 40}
	w.printf("\nthe agent asks for the same compaction\n")
	if err := a.send(ctx, "compaction.requested", req); err != nil {
		return err
	}
	if err := refusal(true); err != nil {
		return err
	}
	w.printf("\nthe agent retries it as it stands: the spill cures the hole, not the pin\n")
	if err := a.send(ctx, "compaction.requested", req); err != nil {
		return err
	}
	if err := refusal(false); err != nil {
		return err
	}
	req["carried_pins"] = []any{rng(0, 1)}
	w.printf("\nthe agent carries the rule into its new context verbatim: \"carried_pins\": [{\"start\": 0, \"end\": 1}]\n")
	if err := a.send(ctx, "compaction.requested", req); err != nil {
		return err
	}
	return a.allowedThenCommit(ctx, w, next, "  the agent commits it: its new context opens with turn 0, the /etc rule, then the summary and the tail\n")
}

// allowedThenCommit takes the next verdict, which must allow compact-1
// (cured by a spill), prints it, and commits the compaction, saying so
// with committed.
func (a *agent) allowedThenCommit(ctx context.Context, w *timeline, next func() (*events.Verdict, error), committed string) error {
	v, err := next()
	if err != nil {
		return err
	}
	al, ok := v.Data.(*events.CompactionAllowed)
	if !ok {
		return fmt.Errorf("expected compaction.allowed, got %s", v.Type)
	}
	if len(al.RecoveredBy) == 0 {
		return fmt.Errorf("compaction.allowed names no spill it was cured by")
	}
	w.printf("  -> compaction.allowed  summary covers %s; cured %v by %s\n", fmtRanges(al.SummaryCoverage), al.Cured, al.RecoveredBy[0].Name)
	if err := a.send(ctx, "compaction.committed", map[string]any{"request_id": "compact-1"}); err != nil {
		return err
	}
	w.printf("%s", committed)
	return nil
}

// agent publishes one session's events in binary content mode.
type agent struct {
	js      jetstream.JetStream
	subj    events.Subjects
	session string
	n       int
}

func (a *agent) send(ctx context.Context, typ string, data map[string]any) error {
	a.n++
	body, err := json.Marshal(data)
	if err != nil {
		return err
	}
	m := nats.NewMsg(a.subj.Events(a.session))
	id := fmt.Sprintf("%s-%04d", a.session, a.n)
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-id", id)
	m.Header.Set("ce-source", demoSource)
	m.Header.Set("ce-type", events.TypePrefix+typ)
	m.Header.Set("ce-subject", a.session)
	m.Header.Set("ce-time", time.Now().UTC().Format(time.RFC3339Nano))
	m.Header.Set("Content-Type", "application/json")
	m.Data = body
	if _, err := a.js.PublishMsg(ctx, m, jetstream.WithMsgID(events.MsgID(demoSource, id))); err != nil {
		return fmt.Errorf("publishing %s: %w", typ, err)
	}
	return nil
}

// demoSource is the CloudEvents source of the demo agent's events.
const demoSource = "urn:agent:demo/worker-1"

func demoTurns() []map[string]any {
	var ts []map[string]any
	add := func(off int, role string, tokens int, content any) {
		ts = append(ts, map[string]any{"offset": off, "size": 1, "role": role, "tokens": tokens, "content": content})
	}
	add(0, "user", 35, "Rotate the TLS certificate of the billing API. Do not touch anything under /etc.")
	add(1, "assistant", 90, "Plan: read /srv/billing/tls, issue a new certificate there, reload the service.")
	for i := 2; i < 8; i++ {
		add(i, "assistant", 800, fmt.Sprintf("exploring the deployment, step %d", i))
	}
	for i := 8; i < 48; i++ {
		add(i, "tool", 3700, map[string]any{"tool": "read_file", "path": fmt.Sprintf("/srv/billing/logs/chunk-%03d.json", i), "result": strings.Repeat("request served; ", 40)})
	}
	for i := 48; i < 52; i++ {
		add(i, "assistant", 450, fmt.Sprintf("log chunk %d checked", i-48))
	}
	return ts
}

func rng(a, b int) map[string]any { return map[string]any{"start": a, "end": b} }

func fmtRanges(rs []events.Range) string {
	if len(rs) == 0 {
		return "nothing"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("[%d, %d)", r.Start, r.End)
	}
	return strings.Join(parts, ", ")
}

// timeline writes lines and keeps the first write error.
type timeline struct {
	out io.Writer
	err error
}

func (t *timeline) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.out, format, args...)
	}
}
