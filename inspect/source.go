package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// ErrNoSession is returned (wrapped) when nothing is known of a session.
var ErrNoSession = errors.New("inspect: no such session")

// Source reads one seamguard deployment: its events and verdict streams,
// its session bucket and its spill object store. Config names them (only
// its Prefix matters here). A Source is a plain value; its methods may be
// called concurrently.
type Source struct {
	JS     jetstream.JetStream
	Config processor.Config
	// Verifier checks every message read from the verdict stream (see
	// package attest); one that fails is left out of the history and the
	// spill outcomes, and reported (Model.Unattributed, replay's
	// "unattributed" differences). nil checks each signature against the
	// key it names, trusting no key in particular.
	Verifier *attest.Verifier
}

// verifier is s.Verifier, or one that trusts no key in particular.
func (s Source) verifier() *attest.Verifier {
	if s.Verifier != nil {
		return s.Verifier
	}
	return &attest.Verifier{Subjects: s.Config.Subjects()}
}

// unattributed describes a message of the verdict stream that failed
// verification.
func unattributed(m message, err error) Unattributed {
	u := Unattributed{Seq: m.Seq, Subject: m.Subject, Reason: attest.Reason(err), Message: err.Error()}
	var e *attest.Error
	if errors.As(err, &e) {
		u.Message, u.Signer = e.Message, e.Signer
	}
	if v, derr := events.DecodeVerdict(m.Data); derr == nil {
		u.ID, u.Type, u.Session = v.ID, v.Type, v.Session
	}
	return u
}

func (s Source) prefix() string {
	if p := s.Config.Subjects().Prefix; p != "" {
		return p
	}
	return events.DefaultPrefix
}

// eventsFilters match the stored subjects of one session's inputs, whatever
// the number of partitions and the stream's layout (events.Subjects): its
// events and control inputs stored in a partition, and control inputs
// stored as published.
func (s Source) eventsFilters(session string) []string {
	pt := s.prefix() + ".partitioned.*."
	return []string{pt + session, pt + "events." + session, pt + "control." + session, s.prefix() + ".control." + session}
}

func (s Source) verdictsFilter(session string) string {
	return s.prefix() + ".verdicts." + session + ".*"
}

// message is one message read from a stream.
type message = *jsread.Msg

// readStream calls fn for every message of stream that matches filters (all
// when none), in order, up to the last one the stream held when it started.
// It never waits for new messages. total reports how many it will read
// (0 when the stream cannot say).
//
// It creates no consumer (see package jsread): the verdict stream is read
// with batched direct gets, the events stream with the leader's
// STREAM.MSG.GET.
func (s Source) readStream(ctx context.Context, stream string, filters []string, total func(uint64), fn func(message) error) error {
	str, err := s.JS.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("inspect: stream %s: %w", stream, err)
	}
	info := str.CachedInfo()
	if total != nil {
		total(0)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	if total != nil {
		total(s.count(ctx, str, filters))
	}
	var fnErr error
	r := jsread.New(s.JS, info)
	if stream == s.Config.Names().Events {
		// It allows direct gets (for the processor's lookups), which an
		// operator's identity need not hold: read from its leader.
		r.Direct = false
	}
	err = r.Read(ctx, info.State.FirstSeq, info.State.LastSeq, filters, func(m message) error {
		fnErr = fn(m)
		return fnErr
	})
	switch {
	case fnErr != nil:
		return fnErr
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		return fmt.Errorf("inspect: read %s: %w", stream, err)
	}
	return nil
}

// count is how many messages of str match filters (all when none), as its
// leader says; 0 when it cannot say.
func (s Source) count(ctx context.Context, str jetstream.Stream, filters []string) uint64 {
	if len(filters) == 0 {
		return str.CachedInfo().State.Msgs
	}
	var n uint64
	for _, f := range filters {
		info, err := str.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return 0
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n
}

// History reads the verdicts of session from the deployment's verdict
// stream, in stream order, and the spill outcomes they record. Messages
// that fail verification are left out (see HistoryChecked).
func (s Source) History(ctx context.Context, session string) ([]Entry, *Outcomes, error) {
	hist, out, _, err := s.HistoryChecked(ctx, session)
	return hist, out, err
}

// HistoryChecked is History, and also returns the messages on the
// session's verdict subjects that failed verification, in stream order.
func (s Source) HistoryChecked(ctx context.Context, session string) ([]Entry, *Outcomes, []Unattributed, error) {
	var hist []Entry
	var bad []Unattributed
	out := &Outcomes{}
	ver := s.verifier()
	stream := s.Config.Names().Verdicts
	err := s.readStream(ctx, stream, []string{s.verdictsFilter(session)}, nil, func(m message) error {
		a, err := ver.Verify(m.Subject, m.Header, m.Data)
		if err != nil {
			bad = append(bad, unattributed(m, err))
			return nil
		}
		out.Add(a.Verdict)
		hist = append(hist, EntryOf(m.Seq, a.Verdict))
		return nil
	})
	return hist, out, bad, err
}

// Load builds the model of session from its snapshot in the session bucket
// and its verdicts.
func (s Source) Load(ctx context.Context, session string) (*Model, error) {
	names := s.Config.Names()
	kv, err := s.JS.KeyValue(ctx, names.Sessions)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("inspect: bucket %s: %w; is seamguard deployed with this prefix?", names.Sessions, err)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: bucket %s: %w", names.Sessions, err)
	}
	e, err := kv.Get(ctx, session)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: bucket %s holds no state for session %q; check the id, or use --rebuild to derive it from the events stream", ErrNoSession, names.Sessions, session)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: read %s from bucket %s: %w", session, names.Sessions, err)
	}
	st, err := processor.UnmarshalState(e.Value())
	if err != nil {
		return nil, fmt.Errorf("inspect: session %s: %w; use --rebuild to derive it from the events stream", session, err)
	}
	hist, _, bad, err := s.HistoryChecked(ctx, session)
	if err != nil {
		return nil, err
	}
	carried, err := s.carriedPins(ctx, session)
	if err != nil {
		return nil, err
	}
	AttachCarried(hist, carried)
	m := Build(st.Ledger.View(), Origin{From: "kv", Name: names.Sessions, Seq: st.Seq}, names.Verdicts, hist)
	m.Unattributed = bad
	switch pe, err := kv.Get(ctx, processor.ParkedKey(session)); {
	case err == nil:
		var rec processor.ParkRecord
		if err := json.Unmarshal(pe.Value(), &rec); err != nil {
			return nil, fmt.Errorf("inspect: session %s: its park record does not parse: %w", session, err)
		}
		m.Parked = &Parked{Cause: rec.Cause, StuckSince: rec.StuckSince, ParkedAt: rec.ParkedAt, StoredSeq: rec.StoredSeq, By: rec.By}
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, fmt.Errorf("inspect: read the park record of %s from bucket %s: %w", session, names.Sessions, err)
	}
	return m, nil
}

// Rebuild builds the model of session from its events alone, stepped with
// the pure core under cfg; spill outcomes come from the verdict stream (or,
// when no verdict records one, from the object store; see SpillAnswers).
// notes receives what the reader should know about such fallbacks.
func (s Source) Rebuild(ctx context.Context, session string, cfg ledger.Config, notes func(string)) (*Model, error) {
	names := s.Config.Names()
	hist, outcomes, bad, err := s.HistoryChecked(ctx, session)
	if err != nil {
		return nil, err
	}
	d := &Deriver{Subjects: s.Config.Subjects(), Config: cfg, Spill: s.SpillAnswers(outcomes, notes)}
	var n int
	var last uint64
	carried := map[string][]Range{}
	err = s.readStream(ctx, names.Events, s.eventsFilters(session), nil, func(m message) error {
		n++
		last = m.Seq
		a, err := d.Apply(ctx, m.Subject, m.Header, m.Data, last)
		if a.CarriedPins != nil {
			carried[a.EventID] = a.CarriedPins
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	l := d.Ledger(session)
	if n == 0 || l == nil {
		return nil, fmt.Errorf("%w: stream %s holds no events of session %q (it may have aged out)", ErrNoSession, names.Events, session)
	}
	AttachCarried(hist, carried)
	m := Build(l.View(), Origin{From: "events", Name: names.Events, Seq: last, Events: n}, names.Verdicts, hist)
	m.Unattributed = bad
	return m, nil
}

// carriedPins reads the session's compaction requests from the events
// stream and returns the carried_pins of those that carried any, by event
// id. Requests that aged out of the stream are simply not found.
func (s Source) carriedPins(ctx context.Context, session string) (map[string][]Range, error) {
	names := s.Config.Names()
	subjects := s.Config.Subjects()
	out := map[string][]Range{}
	err := s.readStream(ctx, names.Events, s.eventsFilters(session), nil, func(m message) error {
		ev, err := events.DecodeMsg(m.Subject, m.Header, m.Data, subjects)
		if err != nil {
			return nil // rejected inputs carry nothing
		}
		if r, ok := ev.Body.(*events.CompactionRequested); ok && len(r.CarriedPins) > 0 {
			out[ev.ID] = r.CarriedPins
		}
		return nil
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	return out, err
}

// SpillAnswers answers spill requests from the recorded outcomes. When no
// verdict records a spill's outcome (it was deleted, or the processor
// stopped between writing the spill and publishing its verdicts), the spill
// object itself is the record: its handle is rebuilt from the object's
// info. With neither, the spill is taken as failed. notes (may be nil) is
// told of every such fallback.
func (s Source) SpillAnswers(o *Outcomes, notes func(string)) SpillFunc {
	names := s.Config.Names()
	store := &spill.Store{JS: s.JS, Stream: names.Events, Subjects: s.Config.Subjects(), Bucket: names.Spills}
	note := func(format string, args ...any) {
		if notes != nil {
			notes(fmt.Sprintf(format, args...))
		}
	}
	return func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
		if r, ok := o.Answer(req); ok {
			return r, nil
		}
		info, err := store.Info(ctx, req.Name)
		switch {
		case err == nil:
			// The object answers the request if it is the spill the
			// request asks for: the same stretch of the same chain.
			h, herr := spill.HandleOf(info)
			prev := ""
			if herr == nil && h.Previous != nil {
				prev = *h.Previous
			}
			if herr == nil && h.FirstSeq == req.FirstSeq && h.LastSeq == req.LastSeq && h.Events == req.Events && prev == req.Previous {
				note("no verdict records the outcome of spill %s (for event %s); its handle was read from bucket %s", req.Name, req.Cause.ID, names.Spills)
				return ledger.SpillResult{Handle: h}, nil
			}
		case errors.Is(err, jetstream.ErrObjectNotFound), errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		default:
			return ledger.SpillResult{}, err
		}
		note("no verdict records the outcome of spill %s (for event %s) and bucket %s holds no such spill; it is taken as failed", req.Name, req.Cause.ID, names.Spills)
		return ledger.SpillResult{Failure: "no verdict and no object records this spill"}, nil
	}
}
