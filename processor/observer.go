package processor

import (
	"context"
	"log/slog"
	"time"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// Observer is told what the runtime does, for metrics. The runtime calls it
// from its shard goroutines, concurrently, on the path of every message: its
// methods must be safe for concurrent use, quick, and must never block.
// Package metrics implements it for Prometheus.
type Observer interface {
	// Input is called for every input stepped through a session's ledger
	// (including those a catch-up or Rebuild applies): its CloudEvents
	// type, or "" when it could not be decoded (it is then rejected).
	Input(eventType string)
	// Published is called for every output once the verdict stream has
	// acknowledged it. received is when the message whose handling decided
	// it was received from the events stream: the input it answers, or,
	// for an input applied by a catch-up (read from the stream ahead of its
	// own delivery), the message that caught its session up. It is zero
	// when unknown.
	Published(o events.Output, received time.Time)
	// Spilled is called for every spill written (and verified, when the
	// configuration says so), with how long writing it took.
	Spilled(h events.SpillHandle, took time.Duration)
	// SpillFailed is called when a spill fails in a way that halts the
	// session.
	SpillFailed()
	// Stored is called for every session state written to the bucket,
	// with how long the write took, retries included.
	Stored(took time.Duration)
	// CASConflict is called whenever the bucket refuses a session state
	// because its revision moved (compare-and-swap), whether it was this
	// instance's own earlier write whose reply was lost or another
	// instance's.
	CASConflict()
	// Stuck is called when a session becomes stuck (stuck true: its
	// effects could not be made durable, its inputs wait for redelivery)
	// and when it no longer is.
	Stuck(session string, stuck bool)
	// ServiceDenied is called for every request to the processor's
	// services that was not served, with why: DeniedReply (a reply subject
	// outside the inbox prefixes, left unanswered) or DeniedOverload (a
	// full queue, answered 503).
	ServiceDenied(reason string)
	// StoreMissing is called when the stream behind one of the processor's
	// stores (events, verdicts, sessions, spills, leases) is found missing
	// (missing true), and when it exists again. It is called from the
	// goroutine that watches the stores, not on the path of a message.
	StoreMissing(stream string, missing bool)
	// Parked is called when a session is parked (parked true: stuck past
	// Config.ParkAfter on a failure retrying cannot fix, its inputs
	// acknowledged into its park record) and when it no longer is, on this
	// instance or as another instance's record is found or found gone.
	Parked(session string, parked bool)
}

// WithObserver sets the Observer; the default observes nothing.
func WithObserver(o Observer) Option { return func(p *Processor) { p.obs = o } }

// nopObserver is the default Observer.
type nopObserver struct{}

func (nopObserver) Input(string)                              {}
func (nopObserver) Published(events.Output, time.Time)        {}
func (nopObserver) Spilled(events.SpillHandle, time.Duration) {}
func (nopObserver) SpillFailed()                              {}
func (nopObserver) Stored(time.Duration)                      {}
func (nopObserver) CASConflict()                              {}
func (nopObserver) Stuck(string, bool)                        {}
func (nopObserver) Parked(string, bool)                       {}
func (nopObserver) ServiceDenied(string)                      {}
func (nopObserver) StoreMissing(string, bool)                 {}

// observe reports an output the verdict stream has acknowledged to the
// Observer and to the log: refusals, halts, violations and rejections at
// info (halts at warn), the rest at debug.
func (p *Processor) observe(pub published) {
	p.obs.Published(pub.out, pub.received)
	o := pub.out
	level := slog.LevelDebug
	switch o.Type {
	case events.TypeCompactionRefused, events.TypeCompactionViolation, events.TypeEventRejected:
		level = slog.LevelInfo
	case events.TypeSessionHalted:
		level = slog.LevelWarn
	}
	ctx := context.Background()
	if !p.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("kind", o.Kind()), slog.String("session", o.Session), slog.Uint64("seq", o.Cause.Meta.Seq), slog.String("id", pub.id)}
	switch d := o.Data.(type) {
	case *events.CompactionAllowed:
		attrs = append(attrs, slog.String("request_id", d.RequestID), slog.Any("cured", d.Cured))
	case *events.CompactionRefused:
		codes := make([]events.ReasonCode, len(d.Reasons))
		for i, r := range d.Reasons {
			codes[i] = r.Code
		}
		attrs = append(attrs, slog.String("request_id", d.RequestID), slog.Any("reasons", codes), slog.String("next", d.Next))
		if d.Spill != nil {
			attrs = append(attrs, slog.String("spill", d.Spill.Name))
		}
	case *events.SessionHalted:
		attrs = append(attrs, slog.String("request_id", d.RequestID), slog.String("unrecoverable", ledger.FormatRanges(d.Unrecoverable)))
	case *events.CompactionViolation:
		attrs = append(attrs, slog.String("request_id", d.RequestID))
	case *events.EventRejected:
		attrs = append(attrs, slog.String("code", string(d.Code)), slog.String("field", d.Field))
	case *events.SpillHandle:
		attrs = append(attrs, slog.String("spill", d.Name), slog.Uint64("bytes", d.Size))
	}
	if !pub.received.IsZero() {
		attrs = append(attrs, slog.String("latency", time.Since(pub.received).Round(time.Microsecond).String()))
	}
	p.log.LogAttrs(ctx, level, "verdict", attrs...)
}
