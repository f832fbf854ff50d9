package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// Seed is the seed of every generated input: the same run always publishes
// the same events.
const Seed = 20261129

// epoch stamps generated events, so that their bytes do not depend on the clock.
var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// gen builds binary-mode CloudEvents (the SDK's default mode) for sessions
// named "<prefix>-<n>": session.opened, turns whose content is text of a
// fixed size, truncations and compaction requests.
type gen struct {
	subj   events.Subjects
	rng    *rand.Rand
	text   []byte // a pool of pseudo-random text that contents are cut from
	serial uint64
}

func newGen(subj events.Subjects, seed uint64) *gen {
	g := &gen{subj: subj, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	const alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789.,;:-"
	g.text = make([]byte, 1<<20)
	for i := range g.text {
		g.text[i] = alphabet[g.rng.IntN(len(alphabet))]
	}
	return g
}

// msg builds one event of typ for session with data as its body.
func (g *gen) msg(session, typ string, data []byte) *nats.Msg {
	g.serial++
	id := session + "-" + strconv.FormatUint(g.serial, 10)
	m := nats.NewMsg(g.subj.Events(session))
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-id", id)
	m.Header.Set("ce-source", "urn:seamguard:bench:agent")
	m.Header.Set("ce-type", typ)
	m.Header.Set("ce-subject", session)
	m.Header.Set("ce-time", epoch.Add(time.Duration(g.serial)*time.Millisecond).Format(time.RFC3339Nano))
	m.Header.Set("Content-Type", events.ContentTypeJSON)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Data = data
	return m
}

func (g *gen) open(session string, span uint64) *nats.Msg {
	return g.msg(session, events.TypeSessionOpened,
		fmt.Appendf(nil, `{"unit":"turns","recovery_floor":{"span":%d,"unit":"turns"},"window":200000,"trigger":150000}`, span))
}

// turn is a turn of one offset whose body is about size bytes: the content
// is a JSON string of text cut from the pool at a random place.
func (g *gen) turn(session string, offset uint64, size int) *nats.Msg {
	role := "assistant"
	if offset%2 == 0 {
		role = "user"
	}
	b := fmt.Appendf(nil, `{"offset":%d,"size":1,"role":%q,"tokens":%d,"content":"`, offset, role, size/4)
	n := max(size-len(b)-2, 1)
	at := g.rng.IntN(len(g.text) - n)
	b = append(b, g.text[at:at+n]...)
	b = append(b, `"}`...)
	return g.msg(session, events.TypeTurnAppended, b)
}

func (g *gen) truncate(session string, r events.Range) *nats.Msg {
	return g.msg(session, events.TypeContextTruncated,
		fmt.Appendf(nil, `{"range":{"start":%d,"end":%d},"stage":"budget"}`, r.Start, r.End))
}

// request asks to compact with the summary covering [0, tail), carrying the
// prior summary, and the last keep offsets kept verbatim: allowed when every
// truncated offset was in a committed summary.
func (g *gen) request(session, requestID string, head, keep uint64) *nats.Msg {
	tail := head - min(keep, head)
	return g.msg(session, events.TypeCompactionRequested,
		fmt.Appendf(nil, `{"request_id":%q,"summarizer_input":{"start":0,"end":%d},"summary_range":{"start":0,"end":%d},"tail_start":%d,"carries_prior_summary":true,"occupancy":150001,"threshold":150000}`,
			requestID, head, tail, tail))
}

func (g *gen) commit(session, requestID string) *nats.Msg {
	return g.msg(session, events.TypeCompactionCommitted, fmt.Appendf(nil, `{"request_id":%q}`, requestID))
}

// ingestEvents is the ingest workload: sessions opened, then turns of
// bodySize bytes dealt round-robin over them, every 50th turn of a session
// followed by a compaction request and its commit, and every other 20th by
// the truncation of an offset the last commit summarized, until total
// events are made. Every request is allowed.
func ingestEvents(subj events.Subjects, prefix string, sessions, total, bodySize int) []*nats.Msg {
	g := newGen(subj, Seed)
	out := make([]*nats.Msg, 0, total)
	heads := make([]uint64, sessions)
	name := func(i int) string { return fmt.Sprintf("%s-%06d", prefix, i) }
	for i := 0; i < sessions && len(out) < total; i++ {
		out = append(out, g.open(name(i), 12))
	}
	for len(out) < total {
		for i := 0; i < sessions && len(out) < total; i++ {
			s := name(i)
			out = append(out, g.turn(s, heads[i], bodySize))
			heads[i]++
			switch {
			case heads[i]%50 == 0 && len(out)+1 < total:
				id := fmt.Sprintf("c%d", heads[i])
				out = append(out, g.request(s, id, heads[i], 20), g.commit(s, id))
			case heads[i]%20 == 0 && heads[i] > 80 && len(out) < total:
				out = append(out, g.truncate(s, events.Range{Start: heads[i] - 80, End: heads[i] - 79}))
			}
		}
	}
	return out
}

// publishAll publishes msgs asynchronously with at most window acks
// outstanding, and returns the stream sequence of each.
func publishAll(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, window int) ([]uint64, error) {
	seqs := make([]uint64, len(msgs))
	futs := make([]jetstream.PubAckFuture, 0, window)
	base := 0
	flush := func() error {
		for i, f := range futs {
			select {
			case a := <-f.Ok():
				seqs[base+i] = a.Sequence
			case err := <-f.Err():
				return fmt.Errorf("bench: publish %s: %w", f.Msg().Subject, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		base += len(futs)
		futs = futs[:0]
		return nil
	}
	for _, m := range msgs {
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return nil, fmt.Errorf("bench: publish %s: %w", m.Subject, err)
		}
		futs = append(futs, f)
		if len(futs) == window {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	return seqs, flush()
}
