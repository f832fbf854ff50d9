package processor

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// This file holds publishing and confirming verdicts: every output goes out
// asynchronously with its deterministic id, signed (package attest), and a
// batch waits for every publish ack before it stores state and
// acknowledges inputs.

// published is one output on its way to the verdict stream.
type published struct {
	msg      *nats.Msg
	id       string
	f        jetstream.PubAckFuture
	out      events.Output
	received time.Time // when the message whose handling decided it was received
	stored   bool      // confirmed already (see publishAll)
}

// publishAll publishes a decision's outputs in order. A spill's
// announcement is confirmed before anything after it is published: the
// contract puts transcript.spilled before the refusal that names it, and
// a publish the server answers late (a stream leader moving) is sent
// again after those behind it. With atomic batches on, the outputs are
// only encoded here, and sendVerdicts publishes the batch's outputs
// together, in order, once its decisions are made.
func (p *Processor) publishAll(ctx context.Context, b *budget, outs []events.Output, pubs *[]published) error {
	held := p.batches.on(false)
	for i, o := range outs {
		pub, err := p.prepare(o)
		if err != nil {
			return err
		}
		if !held {
			if err := p.send(ctx, b, &pub); err != nil {
				return err
			}
			if o.Type == events.TypeTranscriptSpilled && i < len(outs)-1 {
				if err := p.confirm(ctx, b, pub); err != nil {
					return err
				}
				pub.stored = true
			}
		}
		*pubs = append(*pubs, pub)
	}
	return nil
}

// prepare encodes and signs an output.
func (p *Processor) prepare(o events.Output) (published, error) {
	o = p.subj.PublishedRejection(o)
	id, subject, body, err := p.enc.Encode(o)
	if err != nil {
		return published{}, fmt.Errorf("processor: encode %s: %w", o.Type, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	msg.Header.Set(jetstream.MsgIDHeader, id)
	msg.Header.Set(jetstream.ExpectedStreamHeader, p.cfg.Names().Verdicts)
	// The signature covers the body alone, and ed25519 is deterministic:
	// a verdict published again carries the same bytes and headers.
	p.signer.SignMsg(msg.Header, body)
	return published{msg: msg, id: id, out: o}, nil
}

// send publishes a prepared output asynchronously; confirm waits for its
// ack. A prepared message carries its id and expected stream in its
// headers, and nothing changes it after prepare: a message handed to the
// writer of verdicts (group.go) and not answered in time may still be read
// by the writer while the shard publishes it again.
func (p *Processor) send(ctx context.Context, b *budget, pub *published) error {
	for attempt := 0; ; attempt++ {
		var err error
		pub.f, err = p.js.PublishMsgAsync(pub.msg)
		if err == nil {
			return nil
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return fmt.Errorf("processor: publishing %s on %s: %w", pub.out.Type, pub.msg.Subject, rerr)
		}
		p.log.Warn("publish failed; retrying", "subject", pub.msg.Subject, "err", err)
	}
}

// sendVerdicts publishes the outputs publishAll held back (atomic batches
// on), leaving out those of sessions the batch left: through the
// processor's writer of verdicts (group.go), with other shards' verdicts,
// as one atomic batch where there are enough, and otherwise each on its
// own; then whatever that did not store (a verdict published before, a
// lost reply, a batch with a spill's announcement that did not commit), in
// order, a spill's announcement confirmed before what follows it. A
// session whose output cannot be published is parked (park decides what
// becomes of it). Only the end of Run makes it return an error.
func (s *shard) sendVerdicts(ctx context.Context, b *budget, pubs []published, fenced map[string]bool, park func(string, error) error) error {
	p := s.p
	var held []int
	for i := range pubs {
		if pubs[i].f == nil && !pubs[i].stored && !fenced[pubs[i].out.Session] {
			held = append(held, i)
		}
	}
	if len(held) > 0 {
		msgs := make([]*nats.Msg, len(held))
		ordered := false
		for k, i := range held {
			msgs[k] = pubs[i].msg
			ordered = ordered || pubs[i].out.Type == events.TypeTranscriptSpilled
		}
		for k, a := range s.verdicts.submit(ctx, p, false, ordered, msgs) {
			pubs[held[k]].stored = a.ok
		}
	}
	for _, i := range held {
		pub := &pubs[i]
		if fenced[pub.out.Session] || pub.stored {
			continue
		}
		err := p.send(ctx, b, pub)
		if err == nil && pub.out.Type == events.TypeTranscriptSpilled {
			if err = p.confirm(ctx, b, *pub); err == nil {
				pub.stored = true
			}
		}
		if err != nil {
			if err := park(pub.out.Session, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// confirm waits for a publish ack, republishing (same id, so at most once in
// the stream) until the server confirms or ctx ends.
func (p *Processor) confirm(ctx context.Context, b *budget, pub published) error {
	if pub.stored {
		return nil
	}
	_, err := p.confirmAck(ctx, b, pub)
	return err
}

// pubAckWait bounds the wait for one publish ack.
var pubAckWait = 10 * time.Second

// confirmAck is confirm, returning the server's ack.
func (p *Processor) confirmAck(ctx context.Context, b *budget, pub published) (*jetstream.PubAck, error) {
	for attempt := 0; ; attempt++ {
		var err error
		// A publish ack lost with a connection or a server restart never
		// resolves the future: wait a bounded time, then publish again
		// (same id, so the stream keeps one).
		t := time.NewTimer(pubAckWait)
		select {
		case ack := <-pub.f.Ok():
			t.Stop()
			return ack, nil
		case err = <-pub.f.Err():
		case <-t.C:
			err = fmt.Errorf("no publish ack within %s", pubAckWait)
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return nil, fmt.Errorf("processor: verdict %s not confirmed: %w", pub.id, rerr)
		}
		if attempt >= 2 {
			// Not answered for a while: say where the stream stands, which
			// tells a lost leader from a lost connection.
			p.log.Warn("verdict not confirmed; publishing again", "id", pub.id, "err", err, "attempt", attempt+1, "verdict_stream", p.placement(ctx))
		} else {
			p.log.Warn("verdict not confirmed; publishing again", "id", pub.id, "err", err)
		}
		for again := attempt; ; again++ {
			pub.f, err = p.js.PublishMsgAsync(pub.msg)
			if err == nil {
				break
			}
			if rerr := b.retry(ctx, again, err); rerr != nil {
				return nil, fmt.Errorf("processor: verdict %s not confirmed: %w", pub.id, rerr)
			}
		}
	}
}

// placement describes the verdict stream's leader and replicas as the
// server reports them now, for a log line.
func (p *Processor) placement(ctx context.Context) string {
	ictx, cancel := context.WithTimeout(ctx, infoWait)
	defer cancel()
	info, err := p.res.Verdicts.Info(ictx)
	switch {
	case err != nil:
		return "unknown: " + err.Error()
	case info.Cluster == nil:
		return fmt.Sprintf("last seq %d, single server", info.State.LastSeq)
	}
	out := fmt.Sprintf("last seq %d, leader %q", info.State.LastSeq, info.Cluster.Leader)
	for _, r := range info.Cluster.Replicas {
		out += fmt.Sprintf(", %s current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
	}
	return out
}
