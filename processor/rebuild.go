package processor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// RebuildReport says what a rebuild found and did.
type RebuildReport struct {
	Events      int      // input messages replayed
	Sessions    int      // sessions rebuilt
	Differ      []string // sessions whose stored state differs from the rebuilt one, sorted
	Written     int      // states written to the session bucket
	Republished int      // verdicts missing from the verdict stream, published now
	Respilled   int      // spills written because no verdict recorded their outcome
}

// Rebuild derives every session's state from the events stream alone, with
// the same core the runtime uses, and compares it with the session bucket.
// With write it stores the rebuilt states (overwriting) and publishes the
// verdicts the verdict stream lacks, so that the consumer can go on from
// there (a verdict whose id the stream's dedupe window still remembers goes
// in without Nats-Msg-Id; see republish). Run it while no processor
// consumes.
//
// Whether a spill succeeded is a fact of the past, not of the events: the
// rebuild takes it from the verdict stream (the transcript.spilled or
// session.halted that answered the request). Only a spill whose outcome no
// verdict records (a crash between spill and publish) is written again.
func (p *Processor) Rebuild(ctx context.Context, write bool) (RebuildReport, error) {
	var rep RebuildReport
	known, err := p.indexVerdicts(ctx)
	if err != nil {
		return rep, err
	}
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
			return p.pastSpill(ctx, known, req, &rep)
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
			if err := p.republish(ctx, o); err != nil {
				return err
			}
			rep.Republished++
		}
		return nil
	})
	if err != nil {
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
			if _, err := kv.Put(ctx, id, val); err != nil {
				return rep, fmt.Errorf("processor: rebuild: write %s: %w", id, err)
			}
			rep.Written++
		}
	}
	return rep, nil
}

// republish publishes a verdict that the verdict stream lacks. A verdict
// deleted from the stream keeps its id in the stream's dedupe window until
// the window passes, and JetStream would drop the copy as a duplicate (the
// ack says Duplicate and nothing is stored). Then the copy is published once
// more without Nats-Msg-Id, so that it is stored; Rebuild runs while no
// processor consumes, so nothing else publishes it meanwhile. That second
// publish is not retried: if its ack is lost, a second rebuild sees whether
// it landed.
func (p *Processor) republish(ctx context.Context, o events.Output) error {
	pub, err := p.publish(ctx, &budget{limit: p.cfg.RetryFor}, o)
	if err != nil {
		return err
	}
	var ack *jetstream.PubAck
	if ack, err = p.confirmAck(ctx, &budget{limit: p.cfg.RetryFor}, pub); err != nil {
		return err
	}
	if !ack.Duplicate {
		return nil
	}
	msg := nats.NewMsg(pub.msg.Subject)
	msg.Data = pub.msg.Data
	for k, v := range pub.msg.Header {
		if k != jetstream.MsgIDHeader {
			msg.Header[k] = v
		}
	}
	if _, err := p.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(p.cfg.Names().Verdicts)); err != nil {
		return fmt.Errorf("processor: rebuild: republish %s: %w", pub.id, err)
	}
	return nil
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
func (p *Processor) pastSpill(ctx context.Context, idx *verdictIndex, req ledger.SpillRequest, rep *RebuildReport) (ledger.SpillResult, error) {
	if h, ok := idx.spills[events.OutputID(req.Cause, events.TypeTranscriptSpilled)]; ok {
		return ledger.SpillResult{Handle: h}, nil
	}
	if msg, ok := idx.halts[events.OutputID(req.Cause, events.TypeSessionHalted)]; ok {
		return ledger.SpillResult{Failure: msg}, nil
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
