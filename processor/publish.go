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
// again after those behind it.
func (p *Processor) publishAll(ctx context.Context, b *budget, outs []events.Output, pubs *[]published) error {
	for i, o := range outs {
		pub, err := p.publish(ctx, b, o)
		if err != nil {
			return err
		}
		if o.Type == events.TypeTranscriptSpilled && i < len(outs)-1 {
			if err := p.confirm(ctx, b, pub); err != nil {
				return err
			}
			pub.stored = true
		}
		*pubs = append(*pubs, pub)
	}
	return nil
}

func (p *Processor) publish(ctx context.Context, b *budget, o events.Output) (published, error) {
	o = p.subj.PublishedRejection(o)
	id, subject, body, err := p.enc.Encode(o)
	if err != nil {
		return published{}, fmt.Errorf("processor: encode %s: %w", o.Type, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	msg.Header.Set(jetstream.MsgIDHeader, id)
	// The signature covers the body alone, and ed25519 is deterministic:
	// a verdict published again carries the same bytes and headers.
	p.signer.SignMsg(msg.Header, body)
	pub := published{msg: msg, id: id, out: o}
	for attempt := 0; ; attempt++ {
		pub.f, err = p.js.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(p.cfg.Names().Verdicts))
		if err == nil {
			return pub, nil
		}
		if rerr := b.retry(ctx, attempt, err); rerr != nil {
			return pub, fmt.Errorf("processor: publishing %s on %s: %w", o.Type, subject, rerr)
		}
		p.log.Warn("publish failed; retrying", "subject", subject, "err", err)
	}
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
const pubAckWait = 10 * time.Second

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
			pub.f, err = p.js.PublishMsgAsync(pub.msg, jetstream.WithMsgID(pub.id), jetstream.WithExpectStream(p.cfg.Names().Verdicts))
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
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
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
