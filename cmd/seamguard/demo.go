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
// plays (demoStoryFile is session demoSession).
const (
	demoHintServe   = "  seamguard serve"
	demoHintPublish = "  seamguard publish " + demoStoryFile + " --wait"
)

// demoStoryFile is the story the demo plays first, event for event (ids,
// times and data): its spill is, byte for byte, the one `seamguard
// publish` of the file makes.
const demoStoryFile = "testdata/stories/seed-story.jsonl"

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
		fmt.Fprintln(stderr, "\nStarts an embedded NATS server and the processor, plays the story of")
		fmt.Fprintln(stderr, demoStoryFile+" as an agent would, then again with the user's rule")
		fmt.Fprintln(stderr, "pinned, and prints what seamguard decided, explaining each term as it comes.")
		fmt.Fprintln(stderr, "Needs nothing else running.")
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
	w.printf("an agent publishes its session as CloudEvents (binary mode, ce-* headers) on %s:\n", subj.Events(demoSession))
	w.printf("the events of %s, one by one\n\n", demoStoryFile)

	a := &agent{js: js, subj: subj, session: demoSession}
	next := func() (*events.Verdict, error) {
		m, err := verdicts.NextMsg(timeout)
		if err != nil {
			return nil, fmt.Errorf("no verdict within %s: %w", timeout, err)
		}
		return events.DecodeVerdict(m.Data)
	}

	w.printf("session %s opens: offsets count turns, recovery floor = the last 12 turns\n", demoSession)
	w.term(noteIndent, "offset", "a position in the session's transcript, from 0, counted in its unit; here turn n is offset n")
	w.term(noteIndent, "recovery floor", "the latest turns, which every compaction must keep verbatim and show its summarizer")
	if err := a.opening(ctx, w, false); err != nil {
		return err
	}
	req := demoRequest(nil)
	w.printf("\nthe agent asks to compact: summarize [8, 40) from input [8, 52), keep the tail from 40 verbatim\n")
	w.term(noteIndent, "summary, input, tail", "turns [8, 40) become a summary written from turns [8, 52); the turns from 40 on stay word for word")
	w.printf("the classic check passes this: the floor [40, 52) is in the tail and in the input\n")
	w.term(noteIndent, "classic check", "the usual guard of a compaction, that the recovery floor is in the verbatim tail and in the summarizer's input")
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
			w.term(glossIndent, "spill", "the session's events so far, written losslessly into the JetStream object store")
			w.printf("%sthe same bytes, so the same digest, as the spill that publishing %s makes\n", glossIndent, demoStoryFile)
		case *events.CompactionRefused:
			w.refused(d, true)
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
	w.term(noteIndent, "commit", "the agent's compaction.committed, which says it replaced those turns with the summary")

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
	w.term(noteIndent, "digest", "the SHA-256 of the spill's bytes, which every read of it checks")
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
	if err := a.send(ctx, "session.opened", demoOpened); err != nil {
		return err
	}
	for _, t := range demoTurns() {
		off := t.Offset
		if pin && off == 0 {
			t.Pinned = true
		}
		if err := a.send(ctx, "turn.appended", t); err != nil {
			return err
		}
		switch {
		case off == 0 && pin:
			w.printf("  turn %-6d %-9s %q  (pinned)\n", off, t.Role, t.Content)
			w.term(noteIndent, "pinned", "a rule the agent must keep in its working context, not only somewhere it can be read back")
		case off <= 1:
			w.printf("  turn %-6d %-9s %q\n", off, t.Role, t.Content)
		case off == 2:
			w.printf("  turns 2-7    six turns exploring the deployment\n")
		case off == 8:
			w.printf("  turns 8-47   forty tool results, 3,700 tokens each by the agent's count (abridged here)\n")
		case off == 48:
			w.printf("  turns 48-51  four short turns\n")
		}
		if off == 47 {
			w.printf("  budget enforcement truncates turns [0, 8): the /etc constraint and the plan leave the context\n")
			w.term(noteIndent, "[0, 8)", "a range of offsets, from 0 up to but not including 8: turns 0 to 7")
			w.term(noteIndent, "truncated", "evicted from the agent's working context to fit its token budget, before any summary read them")
			if err := a.send(ctx, "context.truncated", demoTruncation); err != nil {
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
				w.refused(d, false)
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
	req := demoRequest(nil)
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
	req = demoRequest([]events.Range{{Start: 0, End: 1}})
	w.printf("\nthe agent carries the rule into its new context verbatim: \"carried_pins\": [{\"start\": 0, \"end\": 1}]\n")
	if err := a.send(ctx, "compaction.requested", req); err != nil {
		return err
	}
	return a.allowedThenCommit(ctx, w, next, "  the agent commits it: its new context opens with turn 0, the /etc rule, then the summary and the tail\n")
}

// demoReasons are the demo's own one-line explanations of the reasons its
// story meets, in place of the processor's messages, which say more at
// more length.
var demoReasons = map[events.ReasonCode]string{
	events.ReasonCoverageHole: "turns in neither the summary nor the tail, truncated before any summary read them",
	events.ReasonPinDropped:   "a pinned turn in neither the tail nor the request's carried_pins would leave the context",
}

// refused prints a refusal: each reason's code and ranges, the demo's
// explanation of the reason the first time it comes, and what the agent is
// to do next. withNext prints next alone; otherwise the spill the refusal
// names (or none) comes first.
func (w *timeline) refused(d *events.CompactionRefused, withNext bool) {
	for _, r := range d.Reasons {
		w.printf("  -> compaction.refused  %s at %s\n", r.Code, fmtRanges(r.AtRisk))
		w.term(glossIndent, string(r.Code), demoReasonText(r))
	}
	if len(d.Cured) > 0 {
		w.printf("%scured %v: a spill holds those offsets; only the pin stands in the way\n", glossIndent, d.Cured)
	}
	if withNext {
		w.printf("%snext: %s\n", glossIndent, d.Next)
	} else {
		name := "none"
		if d.Spill != nil {
			name = d.Spill.Name
		}
		w.printf("%sspill: %s, next: %s\n", glossIndent, name, d.Next)
	}
	switch d.Next {
	case events.NextRetry:
		w.term(glossIndent, "retry", "send the same request again; the spill now answers for what it would lose")
	case events.NextCarryPins:
		w.term(glossIndent, "carry_pins", "send it again with the pinned turns in carried_pins, put back verbatim into the new context")
	}
}

// demoReasonText is the demo's explanation of r: its own line for the
// reasons of its story, else the processor's message, cut short.
func demoReasonText(r events.Reason) string {
	if s, ok := demoReasons[r.Code]; ok {
		return s
	}
	if len(r.Message) > 100 {
		return r.Message[:100] + "..."
	}
	return r.Message
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
	w.term(glossIndent, "cured", "the failed checks the spill answers for, since what they would lose can be read back from it")
	if err := a.send(ctx, "compaction.committed", demoCommit); err != nil {
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

// message is the agent's next event as a NATS message in binary content
// mode: its id is the session and the event's number, its time the story
// file's for that number, its data data as JSON.
func (a *agent) message(typ string, data any) (*nats.Msg, error) {
	body, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	a.n++
	m := nats.NewMsg(a.subj.Events(a.session))
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-id", a.id())
	m.Header.Set("ce-source", demoSource)
	m.Header.Set("ce-type", events.TypePrefix+typ)
	m.Header.Set("ce-subject", a.session)
	m.Header.Set("ce-time", demoEpoch.Add(time.Duration(a.n)*time.Second).Format(time.RFC3339))
	m.Header.Set("Content-Type", "application/json")
	m.Data = body
	return m, nil
}

// id is the id of the agent's last event.
func (a *agent) id() string { return fmt.Sprintf("%s-%04d", a.session, a.n) }

func (a *agent) send(ctx context.Context, typ string, data any) error {
	m, err := a.message(typ, data)
	if err != nil {
		return err
	}
	if _, err := a.js.PublishMsg(ctx, m, jetstream.WithMsgID(events.MsgID(demoSource, a.id()))); err != nil {
		return fmt.Errorf("publishing %s: %w", typ, err)
	}
	return nil
}

// demoSource is the CloudEvents source of the demo agent's events.
const demoSource = "urn:agent:demo/worker-1"

// demoEpoch is the time the story starts: its event n is n seconds later.
var demoEpoch = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

// The story's event data; the fields are in the story file's order, so
// that the bodies are the file's, byte for byte.
type (
	demoFloor struct {
		Span int    `json:"span"`
		Unit string `json:"unit"`
	}
	demoOpen struct {
		Unit          string    `json:"unit"`
		RecoveryFloor demoFloor `json:"recovery_floor"`
		Window        int       `json:"window"`
		Trigger       int       `json:"trigger"`
	}
	demoTurn struct {
		Offset  int    `json:"offset"`
		Size    int    `json:"size"`
		Role    string `json:"role"`
		Pinned  bool   `json:"pinned,omitempty"`
		Tokens  int    `json:"tokens"`
		Content any    `json:"content"`
	}
	demoToolResult struct {
		Tool   string         `json:"tool"`
		Path   string         `json:"path"`
		Result demoToolOutput `json:"result"`
	}
	demoToolOutput struct {
		Lines []demoLogLine `json:"lines"`
	}
	demoLogLine struct {
		N   int    `json:"n"`
		Msg string `json:"msg"`
	}
	demoTruncated struct {
		Range events.Range `json:"range"`
		Stage string       `json:"stage"`
	}
	demoCompaction struct {
		RequestID           string         `json:"request_id"`
		SummarizerInput     events.Range   `json:"summarizer_input"`
		SummaryRange        events.Range   `json:"summary_range"`
		TailStart           int            `json:"tail_start"`
		CarriesPriorSummary bool           `json:"carries_prior_summary"`
		CarriedPins         []events.Range `json:"carried_pins,omitempty"`
		Occupancy           int            `json:"occupancy"`
		Threshold           int            `json:"threshold"`
	}
	demoCommitted struct {
		RequestID string `json:"request_id"`
	}
)

var (
	demoOpened     = demoOpen{Unit: "turns", RecoveryFloor: demoFloor{Span: 12, Unit: "turns"}, Window: 200000, Trigger: 160000}
	demoTruncation = demoTruncated{Range: events.Range{Start: 0, End: 8}, Stage: "budget"}
	demoCommit     = demoCommitted{RequestID: "compact-1"}
)

// demoRequest is the story's compaction request, with carried as its
// carried_pins.
func demoRequest(carried []events.Range) demoCompaction {
	return demoCompaction{
		RequestID:       "compact-1",
		SummarizerInput: events.Range{Start: 8, End: 52},
		SummaryRange:    events.Range{Start: 8, End: 40},
		TailStart:       40,
		CarriedPins:     carried,
		Occupancy:       163000,
		Threshold:       160000,
	}
}

// demoTurns are the story's 52 turns.
func demoTurns() []demoTurn {
	var ts []demoTurn
	add := func(off int, role string, tokens int, content any) {
		ts = append(ts, demoTurn{Offset: off, Size: 1, Role: role, Tokens: tokens, Content: content})
	}
	add(0, "user", 35, "Rotate the TLS certificate of the billing API. Do not touch anything under /etc.")
	add(1, "assistant", 90, "Plan: read /srv/billing/tls, issue a new certificate there, reload the service.")
	for i := 2; i < 8; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		add(i, role, 800, fmt.Sprintf("exploring the deployment, step %d", i))
	}
	for i := 8; i < 48; i++ {
		r := demoToolResult{Tool: "read_file", Path: fmt.Sprintf("/srv/billing/logs/chunk-%03d.json", i)}
		for n := range 3 {
			r.Result.Lines = append(r.Result.Lines, demoLogLine{N: n, Msg: "request served"})
		}
		add(i, "tool", 3700, r)
	}
	for i := 48; i < 52; i++ {
		add(i, "assistant", 450, fmt.Sprintf("log chunk %d checked", i-48))
	}
	return ts
}

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
	out  io.Writer
	err  error
	told map[string]bool // the terms explained so far
}

func (t *timeline) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.out, format, args...)
	}
}

// The indents of the lines that explain: glossIndent under a verdict, in
// line with what it says; noteIndent under the story's lines.
const (
	glossIndent = "                         "
	noteIndent  = "    "
)

// term explains a term in one line, "(term: meaning)", under what the
// timeline printed last, the first time the timeline uses it.
func (t *timeline) term(indent, name, meaning string) {
	if t.told[name] {
		return
	}
	if t.told == nil {
		t.told = map[string]bool{}
	}
	t.told[name] = true
	t.printf("%s(%s: %s)\n", indent, name, meaning)
}
