package processor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/spill"
)

// The recover service (see the package doc, "Recovering spills"): agents
// read their own sessions' spills through the processor, which may read
// the object store, with requests on <prefix>.recover.<session>.

// recoverTimeout bounds the work of one request: an object info and at
// most a few chunk reads (or, without a cursor, one read per chunk up to
// the offset).
const recoverTimeout = 5 * time.Second

// What the responder's subscription buffers before NATS drops the newest
// (the requester then times out): enough for a flood of small requests to
// reach the fair queue, which answers the surplus 503 at once (service.go).
const (
	recoverPendingMsgs  = 1 << 16
	recoverPendingBytes = 64 << 20
)

// recoverHeaderRoom is what a read reply keeps of the server's max_payload
// for its headers.
const recoverHeaderRoom = 8 << 10

// ServiceVersion is the version the recover service reports to `nats micro
// info`: the module version of the running binary without its "v", or
// "0.0.0-dev" for a build that has none (micro requires a semantic version).
func ServiceVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := strings.TrimPrefix(bi.Main.Version, "v"); semver.MatchString(v) {
			return v
		}
	}
	return "0.0.0-dev"
}

// semver is semver.org's pattern, as micro checks it.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// recoverService answers the recover protocol for one processor (see
// service.go for the rules every answer follows). Requests are read on the
// responder connection's subscription goroutines and answered by
// serviceWorkers workers; stop may be called from any goroutine, more than
// once.
type recoverService struct {
	spills     *spill.Reader
	bucket     string
	subj       events.Subjects
	log        *slog.Logger
	ctx        context.Context // ends when Run is aborted
	maxPayload int64
	nc         *nats.Conn // where requests come and answers go
	prefixes   []string   // Config.ReplyPrefixes
	denied     *denials
	disc       *discovery
	stats      serviceStats
	queue      *fairQueue

	mu      sync.Mutex
	subs    []*nats.Subscription
	workers sync.WaitGroup
}

// serveRecover subscribes the recover service on the responder connection
// (WithResponder; the processor's own by default) and stops it when ctx
// ends (a drain begins). The returned function stops it too and waits for
// the requests being answered, each bounded by recoverTimeout and by hard.
// With Config.NoRecoverService, or when the service cannot subscribe
// (logged), it does nothing.
func (p *Processor) serveRecover(ctx, hard context.Context) (stop func()) {
	if p.cfg.NoRecoverService {
		return func() {}
	}
	nc := p.responder
	if nc == nil {
		nc = p.js.Conn()
	}
	r := &recoverService{
		spills: spill.NewReader(p.js, p.cfg.Names().Spills, p.res.Spills), bucket: p.cfg.Names().Spills, subj: p.subj,
		log: p.log, ctx: hard, maxPayload: nc.MaxPayload(), nc: nc,
		prefixes: p.cfg.replyPrefixes(), denied: &p.denied, queue: newFairQueue(),
	}
	r.disc = newDiscovery(events.RecoverService, ServiceVersion(),
		"seamguard: agents read their own sessions' spills (transcripts kept when a compaction was refused)",
		map[string]string{"prefix": p.subj.Prefix, "bucket": r.bucket, "source": p.cfg.Source},
		micro.EndpointInfo{
			Name: events.RecoverEndpoint, Subject: p.subj.RecoverWildcard(), QueueGroup: events.RecoverQueueGroup,
			Metadata: map[string]string{
				"request":   `{"op":"info"|"read","name":"<session>/<n>.jsonl","offset":0,"cursor":"","max":0}`,
				"max_chunk": strconv.Itoa(r.chunkLimit(0)),
			},
		})
	if err := r.subscribe(); err != nil {
		r.unsubscribe()
		p.log.Error("recover service not started: agents cannot read their spills through this instance", "err", err)
		return func() {}
	}
	// A server that refuses the subscriptions says so only asynchronously.
	if ferr := nc.FlushTimeout(subscribeWait); ferr == nil {
		if le := nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) &&
			(strings.Contains(le.Error(), p.subj.RecoverWildcard()) || strings.Contains(le.Error(), micro.APIPrefix)) {
			p.log.Error("recover service: the server refused a subscription; grant the responder's identity subscribe on "+
				p.subj.RecoverWildcard()+" and "+micro.APIPrefix+".>, and publish on the inbox prefixes "+strings.Join(r.prefixes, ", "), "err", le)
		}
	}
	for range serviceWorkers {
		r.workers.Add(1)
		go r.work()
	}
	p.log.Info("recover service running", "subject", p.subj.RecoverWildcard(), "version", ServiceVersion(), "reply_prefixes", r.prefixes)
	ended := make(chan struct{})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(ended)
			r.stop()
		})
	}
	go func() {
		select {
		case <-ctx.Done():
			stop()
		case <-ended:
		}
	}()
	return stop
}

// subscribe makes the endpoint's queue subscription and the discovery
// subscriptions.
func (r *recoverService) subscribe() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sub, err := r.nc.QueueSubscribe(r.subj.RecoverWildcard(), events.RecoverQueueGroup, r.receive)
	if err != nil {
		return fmt.Errorf("processor: subscribe to %s: %w", r.subj.RecoverWildcard(), err)
	}
	_ = sub.SetPendingLimits(recoverPendingMsgs, recoverPendingBytes)
	r.subs = append(r.subs, sub)
	for _, subject := range r.disc.subjects() {
		sub, err := r.nc.Subscribe(subject, r.discover)
		if err != nil {
			return fmt.Errorf("processor: subscribe to %s: %w", subject, err)
		}
		r.subs = append(r.subs, sub)
	}
	return nil
}

func (r *recoverService) unsubscribe() {
	r.mu.Lock()
	subs := r.subs
	r.subs = nil
	r.mu.Unlock()
	for _, s := range subs {
		if err := s.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			r.log.Warn("recover service: stopping", "subject", s.Subject, "err", err)
		}
	}
}

// stop unsubscribes, answers 503 to the requests still waiting, and waits
// for those being answered.
func (r *recoverService) stop() {
	r.unsubscribe()
	for _, req := range r.queue.close() {
		r.send(req.msg, errorReply(req.msg.Reply, 503, "seamguard's recover service is stopping on this instance; ask again"))
	}
	r.workers.Wait()
}

// receive takes a request off the subscription: a reply subject outside
// the inboxes is denied unanswered; the rest waits its session's turn, or
// is answered 503 at once when the queue is full.
func (r *recoverService) receive(m *nats.Msg) {
	if !replyAllowed(m.Reply, r.prefixes) {
		r.denied.deny(DeniedReply, m.Subject, m.Reply)
		return
	}
	session, ok := r.subj.RecoverSession(m.Subject)
	if !ok {
		r.reply(m, time.Now(), nil, nil, refuse(400, "%q is not a recover subject: ask on %s with one of your session ids", events.Excerpt(m.Subject), r.subj.Recover("<session>")))
		return
	}
	if len(m.Data) > events.MaxRecoverRequestBytes {
		// Refused before it waits, so that the queue holds small requests only.
		r.reply(m, time.Now(), nil, nil, refuse(413, "the request has %d bytes; at most %d are read", len(m.Data), events.MaxRecoverRequestBytes))
		return
	}
	if why := r.queue.push(serviceRequest{msg: m, session: session, at: time.Now()}); why != "" {
		r.denied.deny(DeniedOverload, m.Subject, m.Reply)
		r.reply(m, time.Now(), nil, nil, refuse(503, "%s", why))
	}
}

// discover answers a discovery request, to an inbox only.
func (r *recoverService) discover(m *nats.Msg) {
	if !replyAllowed(m.Reply, r.prefixes) {
		r.denied.deny(DeniedReply, m.Subject, m.Reply)
		return
	}
	body, err := r.disc.answer(m.Subject, &r.stats)
	if err != nil {
		r.log.Warn("recover service: encode a discovery answer", "err", err)
		return
	}
	out := nats.NewMsg(m.Reply)
	out.Data = body
	r.send(m, out)
}

// work answers requests until the queue closes.
func (r *recoverService) work() {
	defer r.workers.Done()
	for {
		req, ok := r.queue.pop()
		if !ok {
			return
		}
		r.serve(req)
		r.queue.done(req.session)
	}
}

// serve answers one request.
func (r *recoverService) serve(req serviceRequest) {
	if waited := time.Since(req.at); waited > serviceMaxWait {
		r.reply(req.msg, req.at, nil, nil, refuse(503, "the request waited %s for its turn on this instance; ask again", waited.Round(time.Millisecond)))
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, recoverTimeout)
	defer cancel()
	hdr, body, err := r.answer(ctx, req.msg.Subject, req.msg.Data)
	r.reply(req.msg, req.at, hdr, body, err)
}

// reply sends an answer, or the refusal err is, and counts it.
func (r *recoverService) reply(m *nats.Msg, at time.Time, hdr nats.Header, body []byte, err error) {
	var out *nats.Msg
	errMsg := ""
	if err != nil {
		var re *recoverError
		if !errors.As(err, &re) {
			re = &recoverError{code: 500, msg: err.Error()}
		}
		out = errorReply(m.Reply, re.code, re.msg)
		errMsg = strconv.Itoa(re.code) + ":" + re.msg
	} else {
		out = nats.NewMsg(m.Reply)
		for k, v := range hdr {
			out.Header[k] = v
		}
		out.Data = body
	}
	r.stats.add(time.Since(at), errMsg)
	r.send(m, out)
}

// send publishes out, the answer to m, whose reply subject was checked.
func (r *recoverService) send(m, out *nats.Msg) {
	if !replyAllowed(out.Subject, r.prefixes) {
		// Every path checks the reply subject before it gets here.
		r.denied.deny(DeniedReply, m.Subject, out.Subject)
		return
	}
	if err := r.nc.PublishMsg(out); err != nil {
		r.log.Debug("recover service: reply not sent", "subject", m.Subject, "err", err)
	}
}

// recoverError is a refusal, sent as micro's error headers.
type recoverError struct {
	code int
	msg  string
}

func (e *recoverError) Error() string { return e.msg }

func refuse(code int, format string, args ...any) error {
	return &recoverError{code: code, msg: fmt.Sprintf(format, args...)}
}

// answer decides one request: the reply's headers and body, or a
// *recoverError.
func (r *recoverService) answer(ctx context.Context, subject string, data []byte) (nats.Header, []byte, error) {
	session, ok := r.subj.RecoverSession(subject)
	if !ok {
		return nil, nil, refuse(400, "%q is not a recover subject: ask on %s with one of your session ids", events.Excerpt(subject), r.subj.Recover("<session>"))
	}
	if len(data) > events.MaxRecoverRequestBytes {
		return nil, nil, refuse(413, "the request has %d bytes; at most %d are read", len(data), events.MaxRecoverRequestBytes)
	}
	var rq events.RecoverRequest
	if err := json.Unmarshal(data, &rq); err != nil {
		return nil, nil, refuse(400, `the request is not a JSON object {"op":"info"|"read","name":...,"offset":...,"cursor":...,"max":...}: %v`, err)
	}
	switch {
	case rq.Name == "":
		return nil, nil, refuse(400, "the request names no spill: set name to the spill handle's name")
	case len(rq.Name) > events.MaxRecoverNameBytes:
		return nil, nil, refuse(400, "the spill name has %d bytes; a spill's name has at most %d", len(rq.Name), events.MaxRecoverNameBytes)
	case !strings.HasPrefix(rq.Name, session+"/"):
		return nil, nil, refuse(403, "%q is not a spill of session %s (its spills are named %s/<n>.jsonl): ask for a spill of the session this subject names", events.Excerpt(rq.Name), session, session)
	case rq.Op != "" && rq.Op != events.RecoverOpInfo && rq.Op != events.RecoverOpRead:
		return nil, nil, refuse(400, "op %q is unknown: use %q or %q", events.Excerpt(rq.Op), events.RecoverOpInfo, events.RecoverOpRead)
	case rq.Max < 0:
		return nil, nil, refuse(400, "max is %d; use 0 for the default of %d bytes, or a positive number", rq.Max, events.MaxRecoverChunk)
	case len(rq.Cursor) > events.MaxRecoverCursorBytes:
		return nil, nil, refuse(400, "the cursor has %d bytes; a cursor has at most %d: send back the %s header as it came", len(rq.Cursor), events.MaxRecoverCursorBytes, events.HeaderCursor)
	}
	info, h, err := r.spills.Spill(ctx, session, rq.Name)
	if err != nil {
		return nil, nil, refusal(err)
	}
	hdr := nats.Header{}
	hdr.Set(events.HeaderSpillName, h.Name)
	hdr.Set(events.HeaderSpillSize, strconv.FormatUint(h.Size, 10))
	hdr.Set(events.HeaderSpillDigest, h.Digest)
	if rq.Op != events.RecoverOpRead {
		body, err := json.Marshal(h)
		if err != nil {
			return nil, nil, fmt.Errorf("processor: encode the handle of %s: %w", h.Name, err)
		}
		return hdr, body, nil
	}
	body, cursor, err := r.spills.ReadAt(ctx, info, rq.Offset, r.chunkLimit(rq.Max), rq.Cursor)
	if err != nil {
		return nil, nil, refusal(err)
	}
	hdr.Set(events.HeaderOffset, strconv.FormatUint(rq.Offset, 10))
	if cursor != "" {
		hdr.Set(events.HeaderCursor, cursor)
	}
	return hdr, body, nil
}

// refusal is the answer to a read package spill refused: its message,
// with the code of its kind, or a JetStream failure as jetstreamFailure
// answers it.
func refusal(err error) error {
	var re *spill.ReadError
	if !errors.As(err, &re) {
		return err
	}
	code := 500 // spill.ReadDamaged
	switch re.Kind {
	case spill.ReadFailed:
		return jetstreamFailure(re.Msg, re.Err)
	case spill.ReadNotFound, spill.ReadNotSpill:
		code = 404
	case spill.ReadOtherSession:
		code = 403
	case spill.ReadBadRequest:
		code = 400
	case spill.ReadStale:
		code = 409
	}
	return refuse(code, "%s", re.Msg)
}

// jetstreamFailure is a failure of JetStream: 503 (ask again) when it did
// not answer or the processor is stopping, 500 otherwise.
func jetstreamFailure(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return refuse(503, "seamguard's recover service is stopping on this instance (%s); ask again", what)
	}
	if Unreachable(err) {
		return refuse(503, "JetStream did not answer (%s): %v; ask again", what, err)
	}
	return refuse(500, "%s: %v", what, err)
}

// chunkLimit is the most bytes one read reply carries: want (0: the
// default), at most MaxRecoverChunk, and within the server's max_payload.
func (r *recoverService) chunkLimit(want int) int {
	n := events.MaxRecoverChunk
	if want > 0 {
		n = min(n, want)
	}
	if r.maxPayload > 0 {
		n = min(n, int(r.maxPayload)-recoverHeaderRoom)
	}
	return max(n, 1)
}
