package processor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// RebuildReport says what a rebuild found and did.
type RebuildReport struct {
	Events      int      // input messages replayed
	Sessions    int      // sessions rebuilt
	Differ      []string // sessions whose stored state differs from the rebuilt one, sorted
	Written     int      // states written to the session bucket
	Republished int      // verdicts missing from the verdict stream, published now
	Respilled   int      // spills written because no verdict recorded their outcome
	// Unannounced counts, in a dry run, the spills no verdict recorded:
	// read back from the bucket when it holds them, else taken as failed.
	Unannounced int
	// Withheld lists the ids of verdicts missing from the verdict stream
	// that the stream still refused as duplicates: deleted from it within
	// its dedupe window (VerdictsDuplicates), which still remembers their
	// ids. A rebuild after the window has passed publishes them.
	Withheld []string
}

// Rebuild derives every session's state from the events stream alone, with
// the same core the runtime uses, and compares it with the session bucket.
// With write it stores the rebuilt states (overwriting) and publishes the
// verdicts the verdict stream lacks, each with its deterministic id as
// Nats-Msg-Id, so that the consumer can go on from there.
//
// A dry run (write false) only reads: it takes no lease, and may run
// beside live instances; it compares what it derives with what they
// stored.
//
// A rebuild that writes is the only writer while it runs. Before it reads anything it
// takes every partition's lease in the leases bucket (as an instance named
// "rebuild-<host>-<pid>-<random>"), renews them every LeaseTTL/4, writes
// only while they are current, and hands them all over (deletes the keys)
// when it returns, so that a Run that follows, in this process or another,
// takes them at once. A live instance meanwhile sees the partitions held
// and leaves them alone. If another instance holds a partition, Rebuild
// watches its key for up to the lease TTL: a holder that renews it is live,
// and Rebuild refuses at once (within about LeaseTTL/4) with a
// *LeasesHeldError naming every holder, having read and written nothing;
// a holder that stopped without handing over (killed) stops renewing, and
// its lease is taken when it expires. Losing a lease while it runs ends
// the rebuild with an error.
//
// Whether a spill succeeded is a fact of the past, not of the events: the
// rebuild takes it from the verdict stream (the transcript.spilled or
// session.halted that answered the request). Only a spill whose outcome no
// verdict records (a crash between spill and publish) is written again.
func (p *Processor) Rebuild(ctx context.Context, write bool) (rep RebuildReport, err error) {
	var lease *leases // nil for a dry run, which writes nothing
	if write {
		if lease, err = p.takeAllLeases(ctx); err != nil {
			return rep, err
		}
		var lost context.CancelCauseFunc
		ctx, lost = context.WithCancelCause(ctx)
		kept := make(chan struct{})
		go func() {
			defer close(kept)
			lease.keepAll(ctx, lost)
		}()
		defer func() {
			if err != nil && ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			lost(nil)
			<-kept
			lease.giveBack(ctx)
		}()
	}
	if rebuildHolding != nil {
		rebuildHolding()
	}
	known, err := p.indexVerdicts(ctx)
	if err != nil {
		return rep, err
	}
	var dups []string // ids the stream reported as duplicates
	sessions := map[string]*session{}
	err = p.readAll(ctx, p.cfg.Names().Events, func(m jetstream.Msg, seq uint64) error {
		rep.Events++
		var sess *session
		if sid, err := p.subj.SessionOf(m.Subject()); err == nil {
			sess = sessions[sid]
			if sess == nil {
				sess = &session{id: sid}
				sessions[sid] = sess
			}
		}
		outs, _, err := p.step(ctx, sess, m.Subject(), m.Headers(), m.Data(), seq, func(ctx context.Context, req ledger.SpillRequest) (ledger.SpillResult, error) {
			return p.pastSpill(ctx, lease, known, req, &rep)
		})
		if err != nil {
			return err
		}
		if sess != nil {
			sess.seq = seq
		}
		for _, o := range outs {
			id, _, _, err := p.enc.Encode(o)
			if err != nil {
				return fmt.Errorf("processor: rebuild: %w", err)
			}
			if _, ok := known.ids[id]; ok || !write {
				continue
			}
			if err := lease.allCurrent(); err != nil {
				return err
			}
			stored, err := p.republish(ctx, o)
			if err != nil {
				return err
			}
			if stored {
				rep.Republished++
			} else {
				dups = append(dups, id)
			}
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	if rep.Withheld, err = p.withheld(ctx, dups); err != nil {
		return rep, err
	}
	ids := make([]string, 0, len(sessions))
	for id := range sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	rep.Sessions = len(ids)
	kv := p.res.Sessions
	for _, id := range ids {
		sess := sessions[id]
		val, err := sess.state()
		if err != nil {
			return rep, err
		}
		e, err := kv.Get(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rep.Differ = append(rep.Differ, id)
		case err != nil:
			return rep, fmt.Errorf("processor: rebuild: read %s: %w", id, err)
		case !bytes.Equal(e.Value(), val):
			rep.Differ = append(rep.Differ, id)
		default:
			continue
		}
		if write {
			if err := lease.allCurrent(); err != nil {
				return rep, err
			}
			if _, err := kv.Put(ctx, id, val); err != nil {
				return rep, fmt.Errorf("processor: rebuild: write %s: %w", id, err)
			}
			rep.Written++
		}
	}
	return rep, nil
}

// rebuildHolding, when set (by tests), is called once a rebuild holds every
// lease, before it reads anything.
var rebuildHolding func()

// takeAllLeases takes every partition's lease for a rebuild (see Rebuild),
// waiting for a stopped holder's lease to expire, at most the bucket's TTL
// and a quarter.
func (p *Processor) takeAllLeases(ctx context.Context) (*leases, error) {
	ttl := p.cfg.LeaseTTL
	if st, err := p.res.Leases.Status(ctx); err == nil {
		ttl = max(ttl, st.TTL())
	}
	l := newLeases(p.res.Leases, nil, p.cfg.Names().Leases, p.cfg.Partitions, p.cfg.LeaseTTL, p.log)
	l.id = "rebuild-" + l.id
	if err := l.takeAll(ctx, ttl+ttl/4); err != nil {
		return nil, err
	}
	p.log.Info("rebuild holds every partition's lease", "instance", l.id, "partitions", p.cfg.Partitions)
	return l, nil
}

// republish publishes a verdict that the verdict stream lacked when the
// rebuild read it, with its deterministic id as Nats-Msg-Id, and reports
// whether the stream stored it now. A verdict the stream reports as a
// duplicate is not published again: either it is stored (published since
// the stream was read), or it was deleted from the stream within its
// dedupe window, which still remembers its id; the caller tells which
// (withheld).
func (p *Processor) republish(ctx context.Context, o events.Output) (bool, error) {
	pub, err := p.prepare(o)
	if err != nil {
		return false, err
	}
	if err := p.send(ctx, &budget{limit: p.cfg.RetryFor}, &pub); err != nil {
		return false, err
	}
	ack, err := p.confirmAck(ctx, &budget{limit: p.cfg.RetryFor}, pub)
	if err != nil {
		return false, err
	}
	return !ack.Duplicate, nil
}

// withheld returns those of ids (verdicts the stream reported as
// duplicates) that the verdict stream does not hold: deleted within its
// dedupe window, which drops them until it has passed.
func (p *Processor) withheld(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	idx, err := p.indexVerdicts(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		if _, ok := idx.ids[id]; !ok {
			p.log.Warn("a verdict missing from the verdict stream is within its dedupe window, which drops it: a rebuild after the window publishes it", "id", id, "window", p.cfg.VerdictsDuplicates)
			out = append(out, id)
		}
	}
	return out, nil
}

// verdictIndex is what a rebuild needs from the verdict stream.
type verdictIndex struct {
	ids    map[string]struct{}
	spills map[string]events.SpillHandle // transcript.spilled by id
	halts  map[string]string             // session.halted message by id
}

func (p *Processor) indexVerdicts(ctx context.Context) (*verdictIndex, error) {
	idx := &verdictIndex{ids: map[string]struct{}{}, spills: map[string]events.SpillHandle{}, halts: map[string]string{}}
	err := p.readAll(ctx, p.cfg.Names().Verdicts, func(m jetstream.Msg, _ uint64) error {
		v, err := events.DecodeVerdict(m.Data())
		if err != nil {
			return nil // not ours to judge; a rebuild only needs seamguard's own
		}
		idx.ids[v.ID] = struct{}{}
		switch d := v.Data.(type) {
		case *events.SpillHandle:
			idx.spills[v.ID] = *d
		case *events.SessionHalted:
			idx.halts[v.ID] = d.Message
		}
		return nil
	})
	return idx, err
}

// pastSpill answers a rebuild's spill request from the verdict that
// recorded its outcome, or writes the spill when none did.
func (p *Processor) pastSpill(ctx context.Context, lease *leases, idx *verdictIndex, req ledger.SpillRequest, rep *RebuildReport) (ledger.SpillResult, error) {
	if h, ok := idx.spills[events.OutputID(req.Cause, events.TypeTranscriptSpilled)]; ok {
		return ledger.SpillResult{Handle: h}, nil
	}
	if msg, ok := idx.halts[events.OutputID(req.Cause, events.TypeSessionHalted)]; ok {
		return ledger.SpillResult{Failure: msg}, nil
	}
	if lease == nil {
		// A dry run writes nothing: the spill a processor wrote and did
		// not announce (it stopped between the two) is read back, if the
		// bucket holds it for this request.
		rep.Unannounced++
		if info, err := p.res.Spills.GetInfo(ctx, req.Name); err == nil {
			if h, err := spill.HandleOf(info); err == nil && h.LastSeq == req.LastSeq && h.FirstSeq == req.FirstSeq {
				return ledger.SpillResult{Handle: h}, nil
			}
		}
		return ledger.SpillResult{Failure: "no verdict records this spill and the bucket does not hold it (a dry run writes none)"}, nil
	}
	if err := lease.allCurrent(); err != nil {
		return ledger.SpillResult{}, err
	}
	rep.Respilled++
	h, err := p.store.Write(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return ledger.SpillResult{}, ctx.Err()
		}
		return ledger.SpillResult{Failure: err.Error()}, nil
	}
	return ledger.SpillResult{Handle: h}, nil
}

// readAll calls fn for every message of the stream, in order, up to the last
// sequence the stream had when it started.
func (p *Processor) readAll(ctx context.Context, stream string, fn func(m jetstream.Msg, seq uint64) error) error {
	s, err := p.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("processor: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("processor: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fmt.Errorf("processor: read %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("processor: read %s: %w", stream, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("processor: read %s: %w", stream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("processor: read %s: %w", stream, err)
		}
		seq := meta.Sequence.Stream
		if seq > last {
			return nil
		}
		if err := fn(m, seq); err != nil {
			return err
		}
		if seq == last || meta.NumPending == 0 {
			return nil
		}
	}
}
