package processor

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/processor/ledger"
)

// This file holds catch-up: a session whose state may be behind what was
// delivered elsewhere reads its inputs from the events stream, in stream
// order, before its next decision.
//
// A state read from the session bucket is always checked this way before
// anything is decided on it, whatever the servers' fsync setting: it may
// be behind the stream (read from a replica behind its leader, lost by a
// lazy server in a power cut, put back from a backup, deleted, written by
// an older instance), and the inputs past its sequence were acknowledged
// all the same. The check is the catch-up's first lookup of each of the
// session's subjects past the stored sequence; in the common case it finds
// the input at hand and nothing before it, and a session with nothing on
// its control subject (all but those an operator resumed) is looked up on
// its events subject alone. The batch's prefetch reads those lookups ahead,
// concurrently with the states (prefetch.go). A session the
// shard holds in memory is current (its stores are compare-and-swap on the
// revision it read: any other write makes it read the state again).

// catchUp applies, in stream order, the session's messages after its last
// applied sequence up to limit, reading them from the stream, and queues
// their outputs on pubs. Messages up to the horizon may be pending after a
// delivery that never arrived (to a process that died, over a lost
// connection): JetStream redelivers them only once their ack deadline
// passes, after later messages of the session, which the sequence check
// would then skip although they were never applied. Applied here, in order,
// their redeliveries are skipped and acknowledged (a rejected one is then
// acked rather than terminated). On an error the session leaves the cache,
// so that its stored state is read again.
func (s *shard) catchUp(ctx context.Context, b *budget, sess *session, limit uint64, d delivery, pubs *[]published) error {
	p := s.p
	filters := p.subj.SessionFilters(sess.id) // the subjects the stream holds its inputs under
	if s.pre.noControl(sess.id, limit) {
		filters = filters[:1] // nothing on its control subject up to limit (prefetch.go)
	}
	r := p.reader(filters)
	r.pre = &s.pre
	checked := false // the leader showed it has applied limit
	for sess.seq < limit {
		raw, err := r.next(ctx, b, sess.seq+1)
		if err != nil {
			s.drop(sess.id)
			return err
		}
		if raw == nil && !checked {
			// Nothing more, short of limit: a stream leader elected a
			// moment ago answers so before it has applied its log
			// (messages are applied in order, so a message found past
			// limit proves it has applied limit; nothing found proves
			// nothing). Asked again once the stream shows limit applied,
			// the answer stands.
			checked = true
			if err := p.applied(ctx, b, limit); err != nil {
				s.drop(sess.id)
				return err
			}
			r = p.reader(filters)
			continue
		}
		if raw == nil || raw.Sequence > limit {
			return nil
		}
		if raw, err = r.whole(ctx, b, raw); err != nil {
			s.drop(sess.id)
			return err
		}
		p.log.Info("applying a message delivered before but not applied", "session", sess.id, "seq", raw.Sequence)
		p.count.appliedAhead.Add(1)
		outs, _, err := p.step(ctx, sess, raw.Subject, raw.Header, raw.Data, raw.Sequence, func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
			return s.spill(ctx, b, d, sess, req)
		})
		if err != nil {
			s.drop(sess.id)
			return err
		}
		if err := p.publishAll(ctx, b, outs, pubs); err != nil {
			return err
		}
		sess.seq = raw.Sequence
	}
	return nil
}

// applied waits, with b's retries, until the events stream's leader shows
// it has applied stream sequence seq: errLeaderBehind while it has not.
func (p *Processor) applied(ctx context.Context, b *budget, seq uint64) error {
	for attempt := 0; ; attempt++ {
		info, err := p.res.Events.Info(ctx)
		if err == nil && info.State.LastSeq >= seq {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%w: its state ends at %d, a delivered input is at %d", errLeaderBehind, info.State.LastSeq, seq)
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return fmt.Errorf("processor: reading the events stream's state: %w", rerr)
		}
	}
}

// wantAll reads every message found whole.
func wantAll(uint64) bool { return true }

// lookupLags, when set (by tests, while no processor runs), makes a lookup
// of the filter it returns true for answer that nothing follows, as a
// stream leader that has not applied its log yet does.
var lookupLags func(filter string) bool

// streamReader reads the events stream's messages matching any of its
// filters in stream order, one direct lookup per filter and message: what
// a filter found beyond the sequence asked for is kept, and a filter that
// found nothing is not asked again (its readers look no further than what
// the stream held when they began).
type streamReader struct {
	p        *Processor
	filters  []string
	ahead    []*jetstream.RawStreamMsg
	position []bool // ahead[i] is a position only (probe.go)
	done     []bool
	pre      *prefetch // answers read ahead, if any
}

func (p *Processor) reader(filters []string) *streamReader {
	filters = slices.DeleteFunc(slices.Clone(filters), func(f string) bool { return f == "" })
	n := len(filters)
	return &streamReader{p: p, filters: filters, ahead: make([]*jetstream.RawStreamMsg, n), position: make([]bool, n), done: make([]bool, n)}
}

// whole returns raw, a message next returned, read whole: a prefetched
// position is read again by its sequence.
func (r *streamReader) whole(ctx context.Context, b *budget, raw *jetstream.RawStreamMsg) (*jetstream.RawStreamMsg, error) {
	for i, m := range r.ahead {
		if m != raw || !r.position[i] {
			continue
		}
		got, err := r.p.nextMsg(ctx, b, raw.Sequence, raw.Subject)
		if err == nil && (got == nil || got.Sequence != raw.Sequence) {
			err = fmt.Errorf("processor: sequence %d of the events stream is gone", raw.Sequence)
		}
		if err != nil {
			return nil, err
		}
		r.ahead[i], r.position[i] = got, false
		return got, nil
	}
	return raw, nil
}

// next returns the first message at or after seq that matches a filter, or
// nil when there is none.
func (r *streamReader) next(ctx context.Context, b *budget, seq uint64) (*jetstream.RawStreamMsg, error) {
	best := -1
	for i, f := range r.filters {
		if r.done[i] {
			continue
		}
		if r.ahead[i] == nil || r.ahead[i].Sequence < seq {
			m, position, ok := r.pre.lookup(lookupKey{filter: f, seq: seq})
			if !ok {
				var err error
				if m, err = r.p.nextMsg(ctx, b, seq, f); err != nil {
					return nil, err
				}
			}
			if lookupLags != nil && lookupLags(f) {
				m = nil
			}
			if m == nil {
				r.done[i] = true
				continue
			}
			r.ahead[i], r.position[i] = m, position
		}
		if best < 0 || r.ahead[i].Sequence < r.ahead[best].Sequence {
			best = i
		}
	}
	if best < 0 {
		return nil, nil
	}
	return r.ahead[best], nil
}

// nextMsg reads the first message of the events stream at or after seq
// whose subject matches subject (a filter), as its leader answers,
// retrying failures until ctx ends (then its error); nil when there is
// none.
func (p *Processor) nextMsg(ctx context.Context, b *budget, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	for attempt := 0; ; attempt++ {
		p.count.readInBatch.Add(1)
		// The leader's answer (STREAM.MSG.GET): Stream.GetMsg would send a
		// direct get, which a replica behind the leader may answer.
		raw, _, err := p.findNext(ctx, seq, subject, wantAll)
		if err == nil {
			return raw, nil
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return nil, fmt.Errorf("processor: reading %s at %d from the events stream: %w", subject, seq, rerr)
		}
		p.log.Warn("reading the events stream failed; retrying", "subject", subject, "seq", seq, "err", err)
	}
}
