package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// pinHeader is what the server adds to each delivery of a pinned consumer;
// it is no part of the input (the processor leaves it out as well).
const pinHeader = "Nats-Pin-Id"

// SpillFunc answers a spill request the core made: what the processor's
// spill of it turned out to be.
type SpillFunc func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error)

// Deriver applies input messages, in stream order, to one ledger per
// session with the pure core, exactly as the processor's runtime does:
// the same decoding, the same rejection of what does not decode, the same
// Step, and a spill request answered by Spill and stepped at once. It does
// no I/O of its own. A Deriver is owned by one goroutine.
type Deriver struct {
	Subjects events.Subjects
	Config   ledger.Config
	Spill    SpillFunc

	ledgers map[string]*ledger.Ledger
}

// Applied is what one input message gave.
type Applied struct {
	Session string          // "" when the subject names no session
	EventID string          // the input's CloudEvents id, "" when it did not decode
	Source  string          // the input's CloudEvents source, "" when it did not decode
	Outputs []events.Output // in the order the processor publishes them
	// Accepted is true when the event is part of the session's transcript
	// (what a spill holds): neither rejected nor a duplicate.
	Accepted bool
	// CarriedPins are the ranges a compaction request carried back into
	// the new context (carried_pins); nil for any other input.
	CarriedPins []Range
}

// Apply steps one message of the events stream (its stored subject, headers,
// body and stream sequence).
func (d *Deriver) Apply(ctx context.Context, subject string, hdr map[string][]string, data []byte, seq uint64) (Applied, error) {
	if d.ledgers == nil {
		d.ledgers = map[string]*ledger.Ledger{}
	}
	if _, ok := hdr[pinHeader]; ok {
		hdr = headerCopy(hdr)
	}
	var a Applied
	var l *ledger.Ledger
	if sid, err := d.Subjects.SessionOf(subject); err == nil {
		a.Session = sid
		l = d.ledgers[sid]
		if l == nil {
			l = &ledger.Ledger{}
			d.ledgers[sid] = l
		}
	}
	ev, derr := events.DecodeMsg(subject, hdr, data, d.Subjects)
	if derr != nil {
		var e *events.Error
		if !errors.As(derr, &e) {
			e = &events.Error{Code: events.CodeMalformed, Message: derr.Error()}
		}
		cause := events.Cause{Meta: events.Meta{Subject: subject, Seq: seq, Headers: headerCopy(hdr)}, ReadID: events.ReadableID(hdr, data)}
		a.Outputs = []events.Output{d.Subjects.PublishedRejection(ledger.Rejection(cause, a.Session, e))}
		return a, nil
	}
	if l == nil {
		return a, fmt.Errorf("inspect: seq %d: subject %q names no session but its event decoded", seq, subject)
	}
	a.EventID, a.Source = ev.ID, ev.Source
	if r, ok := ev.Body.(*events.CompactionRequested); ok && len(r.CarriedPins) > 0 {
		a.CarriedPins = slices.Clone(r.CarriedPins)
	}
	ev.Meta.Seq = seq
	res, err := ledger.Step(l, ledger.Input{Event: ev}, d.Config)
	if err != nil {
		return a, fmt.Errorf("inspect: session %s seq %d: %w", a.Session, seq, err)
	}
	a.Outputs, a.Accepted = d.published(res.Outputs), res.Accepted
	if res.Spill != nil {
		if d.Spill == nil {
			return a, fmt.Errorf("inspect: session %s seq %d asks for a spill and nothing can answer it", a.Session, seq)
		}
		result, err := d.Spill(ctx, *res.Spill)
		if err != nil {
			return a, err
		}
		res2, err := ledger.Step(l, ledger.Input{Spill: &result}, d.Config)
		if err != nil {
			return a, fmt.Errorf("inspect: session %s seq %d: %w", a.Session, seq, err)
		}
		a.Outputs = append(a.Outputs, d.published(res2.Outputs)...)
	}
	return a, nil
}

// Ledger returns the ledger of a session, nil when no message named it.
func (d *Deriver) Ledger(session string) *ledger.Ledger { return d.ledgers[session] }

// Sessions returns the sessions seen, sorted.
func (d *Deriver) Sessions() []string {
	out := make([]string, 0, len(d.ledgers))
	for s := range d.ledgers {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// headerCopy copies the headers an input was published with, without the
// delivery's pin.
func headerCopy(h map[string][]string) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if k == pinHeader {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Outcomes are the spill outcomes a verdict stream recorded: the
// transcript.spilled handles and the session.halted messages, by verdict
// id. Whether a spill succeeded is a fact of the past, not of the events, so
// a derivation takes it from here, as the processor's rebuild does.
type Outcomes struct {
	spills map[string]events.SpillHandle
	halts  map[string]string
}

// Add records v if it is a spill or a halt.
func (o *Outcomes) Add(v *events.Verdict) {
	if o.spills == nil {
		o.spills, o.halts = map[string]events.SpillHandle{}, map[string]string{}
	}
	switch d := v.Data.(type) {
	case *events.SpillHandle:
		o.spills[v.ID] = *d
	case *events.SessionHalted:
		o.halts[v.ID] = d.Message
	}
}

// Answer returns the recorded outcome of req, and false when no verdict
// records one.
func (o *Outcomes) Answer(req ledger.SpillRequest) (ledger.SpillResult, bool) {
	if h, ok := o.spills[events.OutputID(req.Cause, events.TypeTranscriptSpilled)]; ok {
		return ledger.SpillResult{Handle: h}, true
	}
	if msg, ok := o.halts[events.OutputID(req.Cause, events.TypeSessionHalted)]; ok {
		return ledger.SpillResult{Failure: spillFailure(msg)}, true
	}
	return ledger.SpillResult{}, false
}

// The core words a halt after a failed spill as "... (" + failedSpill +
// failure + haltTail; spillFailure takes the failure back out, so that the
// derived halt says what the recorded one says.
const (
	failedSpill = "(the transcript could not be spilled: "
	haltTail    = "). Every compaction is refused until"
)

func spillFailure(msg string) string {
	i := strings.Index(msg, failedSpill)
	j := strings.LastIndex(msg, haltTail)
	if i < 0 || j < i+len(failedSpill) {
		return msg
	}
	return msg[i+len(failedSpill) : j]
}

// published gives each rejection among outs the subject its input was
// published on, as the processor does before it publishes.
func (d *Deriver) published(outs []events.Output) []events.Output {
	for i, o := range outs {
		outs[i] = d.Subjects.PublishedRejection(o)
	}
	return outs
}
