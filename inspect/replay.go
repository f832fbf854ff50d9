package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
)

// ReplayOptions say what Replay compares. The zero value compares every
// decision of every session with the deployment's verdict stream, under
// the spill policy.
type ReplayOptions struct {
	// Session limits the replay to one session ("" means all, including
	// rejections of inputs that name no session).
	Session string
	// SinceSeq and SinceTime limit the comparison to the decisions about
	// inputs at or after an events stream sequence, or stored at or after a
	// time (the stream's own timestamp, not the CloudEvent's). Earlier
	// inputs are still stepped, to build the state later decisions depend
	// on, but their decisions are not compared. At most one may be set.
	SinceSeq  uint64
	SinceTime time.Time
	// Verdicts is the stream to compare with; "" means the deployment's.
	Verdicts string
	// Config must be the processor's decision settings (its policy).
	Config ledger.Config
	// Progress, when set, is called as events are stepped, with how many
	// of total are done.
	Progress func(done, total uint64)
	// Notes, when set, is told of spill outcomes that no verdict recorded.
	Notes func(string)
}

// verdictSession is the session token of a verdict subject
// "<prefix>.verdicts.<session>.<kind>", or "".
func verdictSession(prefix, subject string) string {
	rest, ok := strings.CutPrefix(subject, prefix+".verdicts.")
	if !ok {
		return ""
	}
	session, _, _ := strings.Cut(rest, ".")
	return session
}

// Difference is one way the verdict stream differs from the derivation.
type Difference struct {
	// Kind is "missing" (derived, not recorded), "extra" (recorded, not
	// derived), "different" (same id, other content), "duplicate" (the
	// id recorded more than once), "unattributed" (a message on a verdict
	// subject that failed verification: ID, Session and Type are what it
	// claims, Reason says why it failed; it is not compared otherwise) or
	// "state" (the session bucket's ledger differs from the derived one;
	// ID is then the bucket's key).
	Kind       string `json:"kind"`
	ID         string `json:"id"`
	Session    string `json:"session"`
	Type       string `json:"type"`
	Cause      string `json:"causation_id,omitempty"`
	InputSeq   uint64 `json:"input_seq,omitempty"`   // events stream sequence of the input, when known
	VerdictSeq uint64 `json:"verdict_seq,omitempty"` // verdict stream sequence, when recorded
	// Fields names what differs ("data.summary_coverage: derived ...,
	// recorded ..."), for "different".
	Fields   []string `json:"fields,omitempty"`
	Derived  string   `json:"derived,omitempty"`  // the derived verdict, normalised
	Recorded string   `json:"recorded,omitempty"` // the recorded one, normalised
	// Subject and Reason, for "unattributed": the NATS subject it was on,
	// and attest's reason (unsigned, bad_signature, untrusted_signer,
	// misrouted or malformed).
	Subject string `json:"subject,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// ReplayReport is what a replay found.
type ReplayReport struct {
	EventsStream  string `json:"events_stream"`
	VerdictStream string `json:"verdict_stream"`
	Events        int    `json:"events"`   // input messages stepped
	Sessions      int    `json:"sessions"` // sessions seen
	FromSeq       uint64 `json:"from_seq"` // first input sequence whose decisions were compared
	Derived       int    `json:"derived"`  // verdicts derived and compared
	Recorded      int    `json:"recorded"` // verdicts read from the verdict stream
	Matched       int    `json:"matched"`  // derived verdicts recorded identically
	// States counts the sessions whose stored ledger (the session bucket's
	// snapshot) was compared with the derived one, set by set.
	States      int          `json:"states_compared"`
	StateBucket string       `json:"state_bucket"`
	Differences []Difference `json:"differences"`
}

// recorded is one message of the verdict stream.
type recorded struct {
	seq     uint64
	body    string // normalised
	verdict *events.Verdict
	err     error
}

// Replay re-derives every decision from the events stream with the pure
// core, as Deriver does, and compares the result with the verdict stream.
// A spill request is answered with the outcome recorded in the compared
// verdict stream (transcript.spilled or session.halted), as the
// processor's rebuild does; see SpillAnswers for when none is recorded.
//
// Then every derived session's ledger is compared with the session bucket's
// snapshot of it, set by set, the pinned set N included, when the snapshot
// is of the same input as the derivation (compareStates); --since does not
// limit this comparison, which is of the state after the last input.
//
// Verdicts are compared by id, which derives from the input they answer;
// the time and source attributes are left out of the comparison, since
// they say when and by which instance a verdict was decided, not what.
func (s Source) Replay(ctx context.Context, o ReplayOptions) (*ReplayReport, error) {
	if o.SinceSeq > 0 && !o.SinceTime.IsZero() {
		return nil, fmt.Errorf("inspect: replay: give a sequence or a time to start comparing from, not both")
	}
	names := s.Config.Names()
	rep := &ReplayReport{EventsStream: names.Events, VerdictStream: o.Verdicts, Differences: []Difference{}}
	if rep.VerdictStream == "" {
		rep.VerdictStream = names.Verdicts
	}

	// The verdict stream, by id.
	byID := map[string][]recorded{}
	var order []string
	outcomes := &Outcomes{}
	var vfilters []string
	if o.Session != "" && rep.VerdictStream == names.Verdicts {
		vfilters = []string{s.verdictsFilter(o.Session)}
	}
	ver := s.verifier()
	// A copy of the verdict stream may store verdicts under other
	// subjects (a stream that sources the verdict stream with a subject
	// transform adding tokens in front): its verdicts are checked against
	// the part of their subject from "<prefix>.verdicts." on.
	copied := func(subject string) string {
		if rep.VerdictStream == names.Verdicts {
			return subject
		}
		if i := strings.Index(subject, "."+s.prefix()+".verdicts."); i >= 0 {
			return subject[i+1:]
		}
		return subject
	}
	err := s.readStream(ctx, rep.VerdictStream, vfilters, nil, func(m message) error {
		r := recorded{seq: m.Seq}
		// What failed verification is its own difference, and is not
		// compared: a forged verdict neither matches nor stands in for a
		// derived one, and its spill outcome is not believed.
		if _, verr := ver.Verify(copied(m.Subject), m.Header, m.Data); verr != nil {
			u := unattributed(m, verr)
			if o.Session != "" && u.Session != o.Session && verdictSession(s.prefix(), copied(u.Subject)) != o.Session {
				return nil
			}
			session := u.Session
			if session == "" {
				session = verdictSession(s.prefix(), copied(u.Subject))
			}
			rep.Recorded++
			body, _ := normalise(m.Data)
			rep.Differences = append(rep.Differences, Difference{Kind: "unattributed", ID: u.ID, Session: session, Type: u.Type,
				VerdictSeq: u.Seq, Subject: u.Subject, Reason: u.Reason, Fields: []string{u.Reason + ": " + u.Message}, Recorded: body})
			return nil
		}
		id := fmt.Sprintf("unreadable@%d", r.seq)
		v, err := events.DecodeVerdict(m.Data)
		if err != nil {
			r.err = err
		} else {
			if o.Session != "" && v.Session != o.Session {
				return nil
			}
			r.verdict = v
			id = v.ID
			outcomes.Add(v)
		}
		r.body, _ = normalise(m.Data)
		if _, ok := byID[id]; !ok {
			order = append(order, id)
		}
		byID[id] = append(byID[id], r)
		rep.Recorded++
		return nil
	})
	if err != nil {
		return nil, err
	}

	// The events stream, stepped in order. If retention removed its
	// beginning, sessions that began before are derived from part of their
	// history, and their decisions may differ for that reason alone.
	if str, err := s.JS.Stream(ctx, names.Events); err == nil {
		if info, err := str.Info(ctx); err == nil && info.State.FirstSeq > 1 && o.Notes != nil {
			o.Notes(fmt.Sprintf("stream %s starts at seq %d: the events before it are gone (retention or purge), so sessions that began earlier are derived from part of their history and may differ for that reason", names.Events, info.State.FirstSeq))
		}
	}
	d := &Deriver{Subjects: s.Config.Subjects(), Config: o.Config, Spill: s.SpillAnswers(outcomes, o.Notes)}
	enc := events.Encoder{Subjects: s.Config.Subjects()}
	type derived struct {
		out      events.Output
		body     string
		inputSeq uint64
	}
	var derivedList []derived
	derivedIDs := map[string]bool{}
	inputSeq := map[string]uint64{} // input event id -> its latest sequence, to place extra verdicts
	var efilters []string
	if o.Session != "" {
		efilters = s.eventsFilters(o.Session)
	}
	rep.FromSeq = max(o.SinceSeq, 1)
	if !o.SinceTime.IsZero() {
		rep.FromSeq = math.MaxUint64 // until an input at or after the time shows up
	}
	lastSeq := map[string]uint64{} // session -> the last input of it stepped
	var total uint64
	err = s.readStream(ctx, names.Events, efilters, func(n uint64) { total = n }, func(m message) error {
		seq := m.Seq
		if !o.SinceTime.IsZero() && rep.FromSeq == math.MaxUint64 && !m.Time.Before(o.SinceTime) {
			rep.FromSeq = seq
		}
		a, err := d.Apply(ctx, m.Subject, m.Header, m.Data, seq)
		if err != nil {
			return err
		}
		rep.Events++
		if a.Session != "" {
			lastSeq[a.Session] = seq
		}
		if o.Progress != nil {
			o.Progress(uint64(rep.Events), total)
		}
		if a.EventID != "" && (o.SinceSeq > 0 || !o.SinceTime.IsZero()) {
			inputSeq[a.EventID] = seq
		}
		for _, out := range a.Outputs {
			id, _, body, err := enc.Encode(out)
			if err != nil {
				return fmt.Errorf("inspect: replay: seq %d: %w", seq, err)
			}
			nb, _ := normalise(body)
			derivedList = append(derivedList, derived{out: out, body: nb, inputSeq: seq})
			derivedIDs[id] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep.Sessions = len(d.Sessions())

	// Compare what was derived about inputs in scope.
	for _, dv := range derivedList {
		if dv.inputSeq < rep.FromSeq {
			continue
		}
		id := events.OutputID(dv.out.Cause, dv.out.Type)
		rep.Derived++
		diff := Difference{ID: id, Session: dv.out.Session, Type: dv.out.Type, Cause: dv.out.Cause.ID, InputSeq: dv.inputSeq, Derived: dv.body}
		recs := byID[id]
		switch {
		case len(recs) == 0:
			diff.Kind = "missing"
			rep.Differences = append(rep.Differences, diff)
			continue
		case recs[0].body != dv.body:
			diff.Kind = "different"
			diff.VerdictSeq = recs[0].seq
			diff.Recorded = recs[0].body
			diff.Fields = fieldDiff(dv.body, recs[0].body)
			rep.Differences = append(rep.Differences, diff)
		default:
			rep.Matched++
		}
		for _, r := range recs[1:] {
			dup := diff
			dup.Kind, dup.VerdictSeq, dup.Recorded, dup.Fields = "duplicate", r.seq, r.body, nil
			rep.Differences = append(rep.Differences, dup)
		}
	}
	// What was recorded and never derived.
	for _, id := range order {
		if derivedIDs[id] {
			continue
		}
		for _, r := range byID[id] {
			diff := Difference{Kind: "extra", ID: id, VerdictSeq: r.seq, Recorded: r.body}
			if r.verdict == nil {
				diff.Type = "unreadable: " + r.err.Error()
				rep.Differences = append(rep.Differences, diff)
				continue
			}
			v := r.verdict
			diff.Session, diff.Type, diff.Cause = v.Session, v.Type, v.Cause.ID
			if seq, ok := inputSeq[v.Cause.ID]; ok {
				diff.InputSeq = seq
			}
			if rj, ok := v.Data.(*events.EventRejected); ok && v.Cause.ID == "" {
				diff.InputSeq = rj.Input.Seq
			}
			if diff.InputSeq != 0 && diff.InputSeq < rep.FromSeq {
				continue // about an input before the comparison starts
			}
			rep.Differences = append(rep.Differences, diff)
		}
	}
	// The stored ledgers, set by set.
	rep.StateBucket = names.Sessions
	states, err := s.compareStates(ctx, d, lastSeq, o.Notes)
	if err != nil {
		return nil, err
	}
	rep.States = len(lastSeq) - len(states.skipped)
	rep.Differences = append(rep.Differences, states.diffs...)
	sort.SliceStable(rep.Differences, func(i, j int) bool {
		a, b := rep.Differences[i], rep.Differences[j]
		if a.InputSeq != b.InputSeq {
			return a.InputSeq < b.InputSeq
		}
		return a.VerdictSeq < b.VerdictSeq
	})
	if rep.FromSeq == math.MaxUint64 {
		rep.FromSeq = 0
	}
	return rep, nil
}

// stateComparison is what compareStates found.
type stateComparison struct {
	diffs   []Difference
	skipped []string // sessions not compared
}

// compareStates compares every derived session's ledger with the one the
// session bucket holds, when the bucket's is at the same input as the
// derivation: its head, status and every set (received, T, K, P, W and the
// pinned set N). A snapshot at another input (the processor is behind or
// ahead of what was read) is not compared, and notes says so.
func (s Source) compareStates(ctx context.Context, d *Deriver, lastSeq map[string]uint64, notes func(string)) (stateComparison, error) {
	var sc stateComparison
	note := func(format string, args ...any) {
		if notes != nil {
			notes(fmt.Sprintf(format, args...))
		}
	}
	names := s.Config.Names()
	sessions := make([]string, 0, len(lastSeq))
	for sid := range lastSeq {
		sessions = append(sessions, sid)
	}
	sort.Strings(sessions)
	kv, err := s.JS.KeyValue(ctx, names.Sessions)
	if err != nil {
		note("bucket %s: %v; no session's stored ledger was compared", names.Sessions, err)
		sc.skipped = sessions
		return sc, nil
	}
	for _, sid := range sessions {
		derived := d.Ledger(sid).View()
		e, err := kv.Get(ctx, sid)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if derived.Status != "new" {
				note("bucket %s holds no state for session %s; its ledger was not compared", names.Sessions, sid)
			}
			sc.skipped = append(sc.skipped, sid)
			continue
		}
		if err != nil {
			return sc, fmt.Errorf("inspect: replay: read %s from bucket %s: %w", sid, names.Sessions, err)
		}
		diff := Difference{Kind: "state", ID: names.Sessions + "/" + sid, Session: sid, Type: "session.state", InputSeq: lastSeq[sid]}
		st, err := processor.UnmarshalState(e.Value())
		if err != nil {
			diff.Fields = []string{"snapshot: " + err.Error()}
			sc.diffs = append(sc.diffs, diff)
			continue
		}
		if st.Seq != lastSeq[sid] {
			note("bucket %s holds session %s as of events seq %d and the replay read up to seq %d; its ledger was not compared", names.Sessions, sid, st.Seq, lastSeq[sid])
			sc.skipped = append(sc.skipped, sid)
			continue
		}
		if diff.Fields = stateDiff(derived, st.Ledger.View()); len(diff.Fields) > 0 {
			sc.diffs = append(sc.diffs, diff)
		}
	}
	return sc, nil
}

// stateDiff names what differs between a derived ledger and a stored one.
func stateDiff(derived, stored ledger.View) []string {
	var out []string
	if derived.Head != stored.Head {
		out = append(out, fmt.Sprintf("head: derived %d, stored %d", derived.Head, stored.Head))
	}
	if derived.Status != stored.Status {
		out = append(out, fmt.Sprintf("status: derived %s, stored %s", derived.Status, stored.Status))
	}
	for _, set := range []struct {
		name     string
		der, sto ledger.RangeSet
	}{
		{"received", derived.Received, stored.Received},
		{"truncated T", derived.Truncated, stored.Truncated},
		{"committed K", derived.Committed, stored.Committed},
		{"spilled P", derived.Spilled, stored.Spilled},
		{"waived W", derived.Waived, stored.Waived},
		{"pinned N", derived.Pinned, stored.Pinned},
	} {
		a, b := set.der.Ranges(), set.sto.Ranges()
		if !slices.Equal(a, b) {
			out = append(out, fmt.Sprintf("%s: derived %s, stored %s", set.name, ledger.FormatRanges(a), ledger.FormatRanges(b)))
		}
	}
	return out
}

// normalise returns a verdict body as canonical JSON without the time and
// source attributes; a body that is not a JSON object is returned as it is.
func normalise(body []byte) (string, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return string(body), err
	}
	delete(m, "time")
	delete(m, "source")
	b, err := json.Marshal(m)
	if err != nil {
		return string(body), err
	}
	return string(b), nil
}

// fieldDiff names the paths where two normalised bodies differ, with both
// values, at most a few.
func fieldDiff(derived, recorded string) []string {
	var a, b any
	da, db := json.NewDecoder(strings.NewReader(derived)), json.NewDecoder(strings.NewReader(recorded))
	da.UseNumber()
	db.UseNumber()
	if da.Decode(&a) != nil || db.Decode(&b) != nil {
		return []string{"body: not comparable as JSON"}
	}
	var out []string
	var walk func(path string, x, y any)
	walk = func(path string, x, y any) {
		if len(out) >= 4 {
			return
		}
		mx, okx := x.(map[string]any)
		my, oky := y.(map[string]any)
		if okx && oky {
			keys := map[string]bool{}
			for k := range mx {
				keys[k] = true
			}
			for k := range my {
				keys[k] = true
			}
			sorted := make([]string, 0, len(keys))
			for k := range keys {
				sorted = append(sorted, k)
			}
			sort.Strings(sorted)
			for _, k := range sorted {
				p := k
				if path != "" {
					p = path + "." + k
				}
				vx, inx := mx[k]
				vy, iny := my[k]
				if !inx {
					vx = absent{}
				}
				if !iny {
					vy = absent{}
				}
				walk(p, vx, vy)
			}
			return
		}
		if !reflect.DeepEqual(x, y) {
			out = append(out, fmt.Sprintf("%s: derived %s, recorded %s", path, compact(x), compact(y)))
		}
	}
	walk("", a, b)
	return out
}

// absent stands for a member one side does not have.
type absent struct{}

func compact(v any) string {
	if _, ok := v.(absent); ok {
		return "(absent)"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return abbreviate(string(b), 160)
}
