package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// This file holds deciding one input: decoding it, the pure core's Step,
// and the spill the core may ask for.

// spillFunc writes (or, in a rebuild, looks up) the spill a ledger asked
// for. An error means the input cannot be decided now and must be retried.
type spillFunc func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error)

// step decodes a message and runs it through the session's ledger (sess is
// nil when the subject names no valid session), including the spill the
// ledger may ask for. It returns the outputs to publish and, for a rejected input, the reason
// to terminate it with. The runtime and Rebuild share it, so both decide alike.
func (p *Processor) step(ctx context.Context, sess *session, subject string, hdr nats.Header, data []byte, seq uint64, spillFn spillFunc) ([]events.Output, string, error) {
	if _, ok := hdr[pinHeader]; ok {
		// The input as published, without the delivery's pin. The header
		// is this delivery's own (nats.go has read the pin from it before
		// handing it over), so the pin is dropped in place, not copied.
		delete(hdr, pinHeader)
	}
	// The header and data are this delivery's own, so the event may keep
	// them rather than copies.
	ev, derr := events.DecodeMsgOwned(subject, hdr, data, p.subj)
	if derr != nil {
		p.obs.Input("")
		var e *events.Error
		if !errors.As(derr, &e) {
			e = &events.Error{Code: events.CodeMalformed, Message: derr.Error()}
		}
		sid := ""
		if sess != nil {
			sid = sess.id
		}
		cause := events.Cause{Meta: events.Meta{Subject: subject, Seq: seq, Headers: headerMap(hdr)}, ReadID: events.ReadableID(hdr, data)}
		return []events.Output{ledger.Rejection(cause, sid, e)}, "seamguard: rejected: " + string(e.Code), nil
	}
	ev.Meta.Seq = seq
	p.obs.Input(ev.Type)
	cfg := p.lcfg
	l, err := sess.ledger()
	if err != nil {
		return nil, "", err
	}
	res, err := ledger.Step(l, ledger.Input{Event: ev}, cfg)
	if err != nil {
		// Only a broken protocol between runtime and core gets here.
		return nil, "", fmt.Errorf("processor: session %s seq %d: %w", sess.id, seq, err)
	}
	outs := res.Outputs
	term := ""
	if !res.Accepted && !res.Duplicate && len(outs) == 1 && outs[0].Type == events.TypeEventRejected {
		term = "seamguard: rejected: " + string(outs[0].Data.(*events.EventRejected).Code)
	}
	if res.Spill != nil {
		result, err := spillFn(ctx, *res.Spill)
		if err != nil {
			// Undo nothing by hand: the caller drops the session from its
			// cache, so the stored state is read again on redelivery.
			return nil, "", err
		}
		res2, err := ledger.Step(l, ledger.Input{Spill: &result}, cfg)
		if err != nil {
			return nil, "", fmt.Errorf("processor: session %s seq %d: %w", sess.id, seq, err)
		}
		outs = append(outs, res2.Outputs...)
	}
	return outs, term, nil
}

// spill writes the transcript the ledger asked for. Failures of the
// transcript or of the object store become the result that halts the
// session; a cancelled context or a lost NATS connection is not the
// session's fault and returns an error instead, so the input is
// redelivered and decided again.
//
// A spill's outcome is the one part of a decision that does not follow from
// the inputs, so two instances that both hold a session for a moment (an
// ownership move) could disagree on it, and what the loser publishes before
// its compare-and-swap fails would contradict the owner. So a failure is
// only accepted after more attempts (a write of the same name by the other
// instance makes a read-back fail once; rewriting is harmless, the content
// is the same), and only while the session's stored state is still the one
// this instance read: otherwise the error is errFenced and nothing of the
// failure is published.
//
// Nor may it count once the lease of its partition (the one delivery d,
// the input decided, was fetched under) is no longer this instance's: a
// spill that outlasted the lease may have been decided meanwhile by the
// partition's next holder, whose state the bucket may not hold yet, so the
// stored state alone cannot tell. Its outcome, success or failure, is then
// errFenced too, and the session is left to that holder.
func (s *shard) spill(ctx context.Context, b *budget, d delivery, sess *session, req ledger.SpillRequest) (ledger.SpillResult, error) {
	p, m := s.p, d.msg
	// A spill's failure is judged against the stored state (owned), and
	// a spill is rare and slow: the pending round's states first.
	if err := s.settleFor(sess.id); err != nil {
		return ledger.SpillResult{}, err
	}
	stop := keepAlive(ctx, m, p.cfg.AckWait/3)
	defer stop()
	start := time.Now()
	failures := 0
	var firstFailure time.Time
	for attempt := 0; ; attempt++ {
		h, err := p.writeSpill(ctx, req)
		if err == nil {
			if ferr := s.leaseHeld(d, sess.id, "after its spill"); ferr != nil {
				return ledger.SpillResult{}, ferr
			}
			s.cur.noteSpill(sess.id, d)
			p.log.Info("spilled", "session", req.Session, "seq", req.Cause.Meta.Seq, "name", req.Name, "bytes", h.Size, "events", h.Events)
			p.obs.Spilled(h, time.Since(start))
			return ledger.SpillResult{Handle: h}, nil
		}
		if ctx.Err() != nil {
			return ledger.SpillResult{}, ctx.Err()
		}
		// Retrying cannot fix a full bucket or store, the session's quota,
		// or a refusal: the session halts at once (rule 5).
		permanent := spill.Permanent(err)
		p.noticeFailure(err)
		// A store deleted under the processor is an operator's doing, not
		// the session's: the input waits, unacknowledged, until it is back.
		if !permanent && (storeMissing(err) || p.storeGone(p.cfg.Names().SpillsStream()) || p.storeGone(p.cfg.Names().Events)) {
			if rerr := b.retry(ctx, attempt, err); rerr != nil {
				return ledger.SpillResult{}, fmt.Errorf("processor: spill %s: a store is missing: %w", req.Name, rerr)
			}
			p.log.Warn("spill waits: a store it needs is missing", "session", req.Session, "seq", req.Cause.Meta.Seq, "err", err)
			continue
		}
		if !permanent && spillWaits(err, p.status() == nats.CONNECTED) {
			if rerr := b.retry(ctx, attempt, err); rerr != nil {
				return ledger.SpillResult{}, fmt.Errorf("processor: spill %s: %w", req.Name, rerr)
			}
			p.log.Warn("spill interrupted: NATS or JetStream did not answer; retrying", "session", req.Session, "seq", req.Cause.Meta.Seq, "err", err)
			continue
		}
		if failures++; failures == 1 {
			firstFailure = time.Now()
		}
		again := failures < spillFailures || time.Since(firstFailure) < spillFailFor
		if again && !errors.Is(err, spill.ErrIncomplete) && !permanent {
			p.log.Warn("spill failed; trying again", "session", req.Session, "seq", req.Cause.Meta.Seq, "attempt", failures, "err", err)
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return ledger.SpillResult{}, err
			}
			continue
		}
		if ferr := s.leaseHeld(d, sess.id, "before its spill failure"); ferr != nil {
			return ledger.SpillResult{}, ferr
		}
		if ferr := s.owned(ctx, b, sess); ferr != nil {
			return ledger.SpillResult{}, ferr
		}
		s.cur.noteSpill(sess.id, d)
		p.log.Warn("spill failed; the session halts", "session", req.Session, "seq", req.Cause.Meta.Seq, "err", err)
		p.obs.SpillFailed()
		return ledger.SpillResult{Failure: err.Error()}, nil
	}
}

// spillWaits reports whether a spill's failure (err, not permanent) is
// NATS or JetStream not serving now, which the spill waits out with the
// batch's retries rather than counting it against the session: the
// transcript unavailable for now, the connection down, no answer, or a
// JetStream cluster that cannot serve for a moment (a leader election:
// "temporarily unavailable", not the leader, the stream offline). A
// transcript no longer whole is never waited for.
func spillWaits(err error, connected bool) bool {
	if errors.Is(err, spill.ErrUnavailable) {
		return true
	}
	return !errors.Is(err, spill.ErrIncomplete) && (!connected || waitable(err))
}

// spillFailures is how many times a spill may fail (beyond NATS not
// answering, which is retried without limit) before the session halts, and
// spillFailFor the least time from its first failure: a failure that only
// lasts while a JetStream cluster elects a leader or a server restarts
// (some of its errors are not told apart from lasting ones) halts nothing.
const spillFailures = 4

var spillFailFor = 10 * time.Second

// spillFails, when set (by tests), is asked before each spill attempt; an
// error it returns is the attempt's.
var spillFails func() error

// writeSpill is one attempt of req's spill.
func (p *Processor) writeSpill(ctx context.Context, req ledger.SpillRequest) (events.SpillHandle, error) {
	if spillFails != nil {
		if err := spillFails(); err != nil {
			return events.SpillHandle{}, err
		}
	}
	return p.store.Write(ctx, req)
}

// owned checks that the session's stored state is still the one this
// instance read (or stored): errFenced if another instance stored since, an
// error if the bucket cannot tell now.
func (s *shard) owned(ctx context.Context, b *budget, sess *session) error {
	for attempt := 0; ; attempt++ {
		e, err := s.p.res.Sessions.Get(ctx, sess.id)
		switch {
		case err == nil && e.Revision() == sess.rev:
			return nil
		case errors.Is(err, jetstream.ErrKeyNotFound) && sess.rev == 0:
			return nil
		case err == nil || errors.Is(err, jetstream.ErrKeyNotFound):
			return fmt.Errorf("%w: %s (revision %d) before its spill failure", errFenced, sess.id, sess.rev)
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return fmt.Errorf("processor: reading the state of session %s: %w", sess.id, rerr)
		}
	}
}

// pinHeader is the header the server adds to each delivery of a pinned
// consumer.
const pinHeader = "Nats-Pin-Id"

// headerMap copies the headers the input was published with, for a
// rejection to echo. Nats-Pin-Id is left out: the server adds it to each
// delivery of a pinned consumer, so it is no part of the input and differs
// from one delivery to the next.
func headerMap(h nats.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if k == pinHeader {
			continue
		}
		out[k] = append([]string(nil), v...)
	}
	return out
}
