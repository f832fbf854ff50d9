package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/seamguard/seamguard/client"
	"github.com/seamguard/seamguard/events"
)

// printVerdict prints what an agent needs from a verdict.
func printVerdict(v *client.Verdict) {
	switch v.Kind() {
	case events.KindAllowed:
		a := v.Allowed()
		fmt.Printf("allowed %s: summary covers %s, tail from %d", a.RequestID, rangesString(a.SummaryCoverage), a.TailStart)
		if len(a.Cured) > 0 {
			var names []string
			for _, h := range a.RecoveredBy {
				names = append(names, h.Name)
			}
			fmt.Printf("; cured %v by spill %s", a.Cured, strings.Join(names, ", "))
		}
		fmt.Println()
	case events.KindRefused:
		r := v.Refused()
		fmt.Printf("refused %s:", r.RequestID)
		for _, reason := range r.Reasons {
			fmt.Printf(" %s at risk %s;", reason.Code, rangesString(reason.AtRisk))
		}
		if r.Spill != nil {
			fmt.Printf(" spill %s holds %s (%d events);", r.Spill.Name, r.Spill.Range, r.Spill.Events)
		}
		fmt.Printf(" next %s\n", r.Next)
	case events.KindHalted:
		fmt.Printf("halted %s: unrecoverable %s\n", v.Halted().RequestID, rangesString(v.Halted().Unrecoverable))
	}
}

// The seed story: an agent with a recovery floor of 12 turns appends 48
// turns, its budget enforcement evicts the oldest 8, it appends 4 more and
// asks to summarize [8, 40) and keep [40, 52) verbatim. Nothing would hold
// [0, 8): seamguard refuses, spills the whole transcript, and the retry is
// allowed because the spill now holds those turns. The agent commits.
func Example() {
	sg := mustStart(true) // an embedded nats-server and the processor
	defer sg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.New(sg.nc, client.Config{Source: "urn:agent:demo/worker-1"})
	if err != nil {
		panic(err)
	}
	s, err := c.Open(ctx, client.SessionConfig{ID: "ops-agent-42", Span: 12})
	if err != nil {
		panic(err)
	}
	for i := range 48 {
		if _, err := s.Append(ctx, client.Turn{Role: "assistant", Content: fmt.Sprintf("step %d", i)}); err != nil {
			panic(err)
		}
	}
	if err := s.Truncated(ctx, events.Range{Start: 0, End: 8}, "budget"); err != nil {
		panic(err)
	}
	for i := range 4 {
		if _, err := s.Append(ctx, client.Turn{Role: "tool", Content: fmt.Sprintf("log chunk %d", i)}); err != nil {
			panic(err)
		}
	}
	fmt.Println("head", s.Head())

	req := events.CompactionRequested{
		RequestID:       "compact-1",
		SummarizerInput: events.Range{Start: 8, End: 52},
		SummaryRange:    events.Range{Start: 8, End: 40},
		TailStart:       40,
	}
	v, err := s.RequestCompaction(ctx, req)
	if err != nil {
		panic(err)
	}
	printVerdict(v)
	if v.Retryable() {
		// The spill now holds [0, 8): the same compaction is allowed.
		if v, err = s.Retry(ctx, v); err != nil {
			panic(err)
		}
		printVerdict(v)
	}
	if v.Allowed() != nil {
		// ... the agent replaces [8, 40) with its summary, then:
		if err := s.Commit(ctx, v.Request.RequestID); err != nil {
			panic(err)
		}
	}
	if err := s.Close(ctx); err != nil {
		panic(err)
	}
	// Output:
	// head 52
	// refused compact-1: coverage_hole at risk [0, 8); spill ops-agent-42/1.jsonl holds [0, 52) (55 events); next retry
	// allowed compact-1: summary covers [8, 40), tail from 40; cured [coverage_hole] by spill ops-agent-42/1.jsonl
}

// Compact does the refuse-spill-retry round for the agent: a healthy
// compaction is allowed at once; one that puts evicted turns at risk is
// allowed after seamguard spilled them, and Previous holds the refusal.
func ExampleSession_Compact() {
	sg := mustStart(true)
	defer sg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.New(sg.nc, client.Config{})
	if err != nil {
		panic(err)
	}
	s, err := c.Open(ctx, client.SessionConfig{ID: "support-7", Span: 4})
	if err != nil {
		panic(err)
	}
	for range 10 {
		if _, err := s.Append(ctx, client.Turn{Content: "..."}); err != nil {
			panic(err)
		}
	}
	// Summarize [0, 6), keep [6, 10): the summary meets the tail.
	v, err := s.Compact(ctx, events.CompactionRequested{
		RequestID:       "c1",
		SummarizerInput: events.Range{Start: 0, End: 10},
		SummaryRange:    events.Range{Start: 0, End: 6},
		TailStart:       6,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(v.Kind(), "after a retry:", v.Previous != nil)
	if err := s.Commit(ctx, v.Request.RequestID); err != nil {
		panic(err)
	}

	// Ten more turns; the summary is not carried over, so [0, 10) is lost
	// unless seamguard spills it first.
	for range 10 {
		if _, err := s.Append(ctx, client.Turn{Content: "..."}); err != nil {
			panic(err)
		}
	}
	v, err = s.Compact(ctx, events.CompactionRequested{
		RequestID:       "c2",
		SummarizerInput: events.Range{Start: 10, End: 20},
		SummaryRange:    events.Range{Start: 10, End: 16},
		TailStart:       16,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(v.Kind(), "after a retry:", v.Previous != nil)
	printVerdict(v.Previous)
	printVerdict(v)
	// Output:
	// allowed after a retry: false
	// allowed after a retry: true
	// refused c2: coverage_hole at risk [0, 10); spill support-7/1.jsonl holds [0, 20) (24 events); next retry
	// allowed c2: summary covers [10, 16), tail from 16; cured [coverage_hole] by spill support-7/1.jsonl
}

// Recover reads back the transcript a refusal's spill holds, through the
// processor: the agent needs no JetStream access. The budget evicted the
// turn that set the rule; the spill still has it, word for word.
func ExampleSession_Recover() {
	sg := mustStart(true)
	defer sg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.New(sg.nc, client.Config{})
	if err != nil {
		panic(err)
	}
	s, err := c.Open(ctx, client.SessionConfig{ID: "ops-agent-7", Span: 4})
	if err != nil {
		panic(err)
	}
	if _, err := s.Append(ctx, client.Turn{Role: "user", Content: "Never touch /etc."}); err != nil {
		panic(err)
	}
	for range 11 {
		if _, err := s.Append(ctx, client.Turn{Role: "assistant", Content: "..."}); err != nil {
			panic(err)
		}
	}
	if err := s.Truncated(ctx, events.Range{Start: 0, End: 3}, "budget"); err != nil {
		panic(err)
	}
	v, err := s.Compact(ctx, events.CompactionRequested{
		RequestID:       "c1",
		SummarizerInput: events.Range{Start: 3, End: 12},
		SummaryRange:    events.Range{Start: 3, End: 8},
		TailStart:       8,
	})
	if err != nil || v.Previous == nil {
		panic(fmt.Sprint("no refusal before the allowed retry: ", err))
	}

	var transcript strings.Builder
	chain, err := s.Recover(ctx, *v.Previous.Refused().Spill, &transcript)
	if err != nil {
		panic(err)
	}
	for _, h := range chain {
		fmt.Printf("spill %s: %d events, size and digest checked\n", h.Name, h.Events)
	}
	fmt.Println(strings.Count(transcript.String(), "\n"), "lines")
	for line := range strings.Lines(transcript.String()) {
		ev, err := events.DecodeJSON([]byte(line), events.Meta{})
		if err != nil {
			panic(err)
		}
		if t, ok := ev.Body.(*events.TurnAppended); ok && t.Offset == 0 {
			fmt.Printf("turn 0 (%s): %s\n", t.Role, t.Content)
		}
	}
	// Output:
	// spill ops-agent-7/1.jsonl: 15 events, size and digest checked
	// 15 lines
	// turn 0 (user): "Never touch /etc."
}

// RequestCompaction waits as long as its context allows. With no processor
// running, no verdict comes, and the error names the request.
func ExampleSession_RequestCompaction_deadline() {
	sg := mustStart(false) // the streams exist, the processor is not running
	defer sg.Close()
	ctx := context.Background()

	c, err := client.New(sg.nc, client.Config{})
	if err != nil {
		panic(err)
	}
	s, err := c.Open(ctx, client.SessionConfig{ID: "batch-3", Span: 4})
	if err != nil {
		panic(err)
	}
	if _, err := s.Append(ctx, client.Turn{Content: "hello"}); err != nil {
		panic(err)
	}
	wait, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = s.RequestCompaction(wait, events.CompactionRequested{RequestID: "compact-9", TailStart: 0})
	fmt.Println(errors.Is(err, client.ErrNoVerdict), errors.Is(err, context.DeadlineExceeded))
	fmt.Println(strings.Contains(err.Error(), `"compact-9"`))
	var nv *client.NoVerdictError
	if errors.As(err, &nv) {
		fmt.Println("no verdict for", nv.RequestID, "of", nv.Session)
	}
	// Output:
	// true true
	// true
	// no verdict for compact-9 of batch-3
}

// OnRejected hears seamguard reject the session's events. Here the agent
// reuses the id of a session that was closed: every publish succeeds (the
// events stream stores the events), and seamguard rejects each of them.
func ExampleSessionConfig_onRejected() {
	sg := mustStart(true)
	defer sg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.New(sg.nc, client.Config{})
	if err != nil {
		panic(err)
	}
	old, err := c.Open(ctx, client.SessionConfig{ID: "reused", Span: 4})
	if err != nil {
		panic(err)
	}
	if err := old.Close(ctx); err != nil {
		panic(err)
	}

	rejected := make(chan *client.RejectedError, 16)
	s, err := c.Open(ctx, client.SessionConfig{ID: "reused", Span: 4,
		OnRejected: func(e *client.RejectedError) { rejected <- e }})
	if err != nil {
		panic(err)
	}
	for range 2 {
		if _, err := s.Append(ctx, client.Turn{Content: "..."}); err != nil {
			panic(err)
		}
	}
	for range 3 { // the open and both turns
		select {
		case e := <-rejected:
			fmt.Println("rejected:", e.Rejection.Code, e.Rejection.Field)
		case <-ctx.Done():
			panic("no rejection")
		}
	}
	// Output:
	// rejected: session_closed subject
	// rejected: session_closed subject
	// rejected: session_closed subject
}
