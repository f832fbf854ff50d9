package processor

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/jsread"
)

// This file holds the prefetch's first lookup of each session, sent as a
// direct get of the events stream.
//
// A session read fresh is checked against the events stream: the first
// message on its events subject past its stored sequence, almost always
// the input at hand. Asked of the stream's leader (STREAM.MSG.GET), each
// lookup goes through the server's JetStream API and comes back as JSON
// with the message in base64; a direct get is answered where it arrives,
// with the message as it is stored, at about three times the rate on one
// server. A batch's lookups are pipelined, each answered to an inbox of
// its own under one subscription, with as many in flight as 32 MiB of the
// largest messages the server takes (32 at its default max_payload).
//
// The lookups are direct gets only when the events stream has a single
// replica. Any replica may answer a direct get, and one restarted with
// entries its leader never committed (it was the leader, or had them
// appended, when it stopped) answers from them until it has caught up and
// truncated them: its message at a sequence need not be the leader's. So
// with replicas every lookup asks the leader. What follows holds for a replica that lags but agrees.
//
// A replica behind its leader answers as of what it has applied. Only an answer that holds a message is
// taken: a replica that holds a message at sequence m has applied every
// sequence before m (a stream's replicas apply its log in order), so the
// first message it finds from a sequence is the first there is up to m,
// as the leader would answer. "No message" may be a replica that has not
// applied the input yet, and so is asked of the leader (the prefetch's
// usual lookup, and then catch-up's own check, catchup.go). An answer of
// another stream (a mirror that serves direct gets) or on another subject
// is not taken either.

// directWait bounds the wait for a batch's next direct lookup's answer.
const directWait = 5 * time.Second

// directPause is how long direct lookups stay off after a batch of them
// went unanswered (an identity without the permission, a stream without
// allow_direct, a server away); then one shard's batch tries them again,
// and they are on again once one is answered.
var directPause = time.Minute

// eventsReplicated reports whether the events stream has more than one
// replica. Then the lookups ask its leader: a replica restarted with
// entries its leader never committed answers from them until it has
// caught up, so its messages need not be the leader's at their sequences.
func (p *Processor) eventsReplicated() bool {
	info := p.res.Events.CachedInfo()
	return info == nil || info.Config.Replicas > 1
}

// directOn reports whether this shard's batch sends direct lookups: they
// are on, or their pause is over and this batch is the one that tries
// them again (the others wait for its outcome).
func (p *Processor) directOn() bool {
	until := p.directOffUntil.Load()
	if until == 0 {
		return true
	}
	now := time.Now()
	return now.UnixNano() >= until && p.directOffUntil.CompareAndSwap(until, now.Add(directPause).UnixNano())
}

// maxDirect is the most lookups one call of lookDirect sends.
const maxDirect = 1024

// directLookups sends the first lookup of each of tasks whose state the
// prefetch holds as a direct get, and keeps every answer that holds a
// message; the others are left to the prefetch's usual lookups.
func (s *shard) directLookups(ctx context.Context, tasks []prefetchTask) {
	p := s.p
	if len(s.pre.states) == 0 || p.eventsReplicated() || !p.directOn() {
		return
	}
	keys := make([]lookupKey, 0, len(tasks))
	for _, t := range tasks {
		got, ok := s.pre.states[t.id]
		if !ok {
			continue // read by the usual way, state first
		}
		from := uint64(1)
		if got.state != nil {
			from = got.state.Seq + 1
		}
		keys = append(keys, lookupKey{filter: p.subj.SessionFilters(t.id)[0], seq: from})
	}
	for len(keys) > 0 {
		n := min(len(keys), maxDirect)
		found, answered, refused, err := p.lookDirect(ctx, p.readConn(s.index), keys[:n])
		if ctx.Err() == nil && (err != nil || answered == 0 || refused == answered) {
			// Most likely an identity that may not make the request (no
			// answer comes): every batch would wait for it.
			if p.directOffUntil.Swap(time.Now().Add(directPause).UnixNano()) == 0 {
				p.log.Warn("looking up sessions in the events stream by direct get failed; asking its leader for each, and trying direct gets again every "+directPause.String()+" (the processor's identity needs publish on $JS.API.DIRECT.GET.<events stream>, and the stream allow_direct)", "lookups", n, "err", err)
			}
			return
		}
		if answered > 0 && p.directOffUntil.Swap(0) != 0 {
			p.log.Info("looking up sessions in the events stream by direct get works again")
		}
		for i, raw := range found {
			if raw != nil {
				s.pre.lookups[keys[i].filter] = append(s.pre.lookups[keys[i].filter], span{from: keys[i].seq, msg: raw})
			}
		}
		p.count.readAhead.Add(uint64(answered))
		keys = keys[n:]
	}
}

// lookDirect sends keys as direct gets of the events stream, pipelined
// (at most directWindow unanswered at once), and returns, by index, each
// message found that is taken as the answer (nil for none taken), how many
// were answered at all, and how many of those were "no responders" (a
// stream that does not allow direct gets). A permission violation the
// server reports for the requests ends it with that error.
func (p *Processor) lookDirect(ctx context.Context, nc *nats.Conn, keys []lookupKey) (found []*jetstream.RawStreamMsg, answered, refused int, err error) {
	stream := p.cfg.Names().Events
	inbox := nc.NewInbox() // not under the request mux: its subscription would get every answer too
	sub, err := nc.SubscribeSync(inbox + ".*")
	if err != nil {
		return nil, 0, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	subject := "$JS.API.DIRECT.GET." + stream
	// A server that refuses the request for permissions answers nothing,
	// but tells the connection at once (its last error).
	lastErr := nc.LastError()
	sent := 0
	send := func() error {
		k := keys[sent]
		body, err := json.Marshal(struct {
			Seq    uint64 `json:"seq"`
			NextBy string `json:"next_by_subj"`
		}{k.seq, k.filter})
		if err == nil {
			err = nc.PublishRequest(subject, inbox+"."+strconv.Itoa(sent), body)
		}
		sent++
		return err
	}
	// At most window answers are on their way at once: each may be as
	// large as the server's max_payload.
	window := directWindow(nc)
	found = make([]*jetstream.RawStreamMsg, len(keys))
	seen := make([]bool, len(keys))
	for answered < len(keys) {
		for sent < len(keys) && sent-answered < window {
			if err := send(); err != nil {
				return found, answered, refused, err
			}
		}
		m, err := nextAnswer(ctx, nc, sub, lastErr, subject)
		if errors.Is(err, nats.ErrPermissionViolation) {
			return found, answered, refused, err
		}
		if err != nil {
			// The rest are asked the usual way.
			return found, answered, refused, nil
		}
		i, err := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
		if err != nil || i < 0 || i >= sent || seen[i] {
			continue
		}
		seen[i] = true
		answered++
		found[i] = directAnswer(stream, keys[i], m)
		if found[i] == nil && m.Header.Get("Status") == "503" {
			refused++
		}
	}
	return found, answered, refused, nil
}

// directBytes bounds what a batch's direct lookups may bring back at once.
const directBytes = 32 << 20

// directWindow is how many direct lookups may be unanswered at once on nc:
// as many as directBytes holds of the largest messages the server takes,
// at least 16.
func directWindow(nc *nats.Conn) int {
	return max(16, min(maxDirect, directBytes/max(int(nc.MaxPayload()), 1)))
}

// nextAnswer waits at most directWait for sub's next message, and ends
// early with the connection's error when the server reports a permission
// violation for subject on nc since lastErr (then none is coming).
func nextAnswer(ctx context.Context, nc *nats.Conn, sub *nats.Subscription, lastErr error, subject string) (*nats.Msg, error) {
	const step = 50 * time.Millisecond
	for waited := time.Duration(0); ; waited += step {
		m, err := nextWithin(ctx, sub, min(step, directWait-waited))
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || waited+step >= directWait {
			return m, err // an answer, an error of its own (no responders), or the end
		}
		if e := nc.LastError(); e != lastErr && errors.Is(e, nats.ErrPermissionViolation) && strings.Contains(e.Error(), `"`+subject+`"`) {
			return nil, e
		}
	}
}

// nextWithin waits at most d for sub's next message.
func nextWithin(ctx context.Context, sub *nats.Subscription, d time.Duration) (*nats.Msg, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return sub.NextMsgWithContext(wctx)
}

// directAnswer is the message a direct get for k found, when it is taken as
// the answer: a message (the server's headers say which; a message's own
// headers may say anything, and the server's come last), of stream, on k's
// subject, at or after k's sequence.
func directAnswer(stream string, k lookupKey, m *nats.Msg) *jetstream.RawStreamMsg {
	if len(m.Header.Values("Nats-Sequence")) == 0 {
		return nil // a status: 404 (none, maybe not yet), 408, 503
	}
	from, msg, err := jsread.DirectMsg(m)
	if err != nil || from != stream || msg.Subject != k.filter || msg.Seq < k.seq {
		return nil
	}
	return &jetstream.RawStreamMsg{Subject: msg.Subject, Sequence: msg.Seq, Header: msg.Header, Data: msg.Data, Time: msg.Time}
}
