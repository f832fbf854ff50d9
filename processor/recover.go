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
	"github.com/nats-io/nats.go/jetstream"
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

// The requests one instance queues before NATS drops the newest (the
// requester then times out and asks again, perhaps another instance). An
// endpoint answers its requests one at a time.
const (
	recoverPendingMsgs  = 256
	recoverPendingBytes = 8 << 20
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

// recoverService answers the recover protocol for one processor. Its
// handler runs on the endpoint subscription's goroutine, one request at a
// time; stop may be called from any goroutine, more than once.
type recoverService struct {
	js         jetstream.JetStream
	spills     jetstream.ObjectStore
	bucket     string
	subj       events.Subjects
	log        *slog.Logger
	ctx        context.Context // ends when Run is aborted
	maxPayload int64

	mu      sync.Mutex
	stopped bool
	working sync.WaitGroup   // requests being answered
	chunks  jetstream.Stream // the bucket's stream, opened on first use
	svc     micro.Service
}

// serveRecover registers the recover service on the processor's
// connection and stops it when ctx ends (a drain begins). The returned
// function stops it too and waits for the requests being answered, each
// bounded by recoverTimeout and by hard. With Config.NoRecoverService, or
// when the service cannot be registered (logged), it does nothing.
func (p *Processor) serveRecover(ctx, hard context.Context) (stop func()) {
	if p.cfg.NoRecoverService {
		return func() {}
	}
	nc := p.js.Conn()
	r := &recoverService{
		js: p.js, spills: p.res.Spills, bucket: p.cfg.Names().Spills, subj: p.subj,
		log: p.log, ctx: hard, maxPayload: nc.MaxPayload(),
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        events.RecoverService,
		Version:     ServiceVersion(),
		Description: "seamguard: agents read their own sessions' spills (transcripts kept when a compaction was refused)",
		Metadata: map[string]string{
			"prefix": p.subj.Prefix, "bucket": r.bucket, "source": p.cfg.Source,
		},
		QueueGroup: events.RecoverQueueGroup,
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			p.log.Warn("recover service: NATS reported an error on its subscription", "subject", err.Subject, "err", err.Description)
		},
	})
	if err == nil {
		err = svc.AddEndpoint(events.RecoverEndpoint, micro.HandlerFunc(r.handle),
			micro.WithEndpointSubject(p.subj.RecoverWildcard()),
			micro.WithEndpointMetadata(map[string]string{
				"request":   `{"op":"info"|"read","name":"<session>/<n>.jsonl","offset":0,"cursor":"","max":0}`,
				"max_chunk": strconv.Itoa(r.chunkLimit(0)),
			}),
			micro.WithEndpointPendingLimits(recoverPendingMsgs, recoverPendingBytes))
		if err != nil {
			_ = svc.Stop()
		}
	}
	if err != nil {
		p.log.Error("recover service not started: agents cannot read their spills through this instance", "err", err)
		return func() {}
	}
	r.svc = svc
	// A server that refuses the subscriptions says so only asynchronously.
	if ferr := nc.FlushTimeout(2 * time.Second); ferr == nil {
		if le := nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) &&
			(strings.Contains(le.Error(), p.subj.RecoverWildcard()) || strings.Contains(le.Error(), micro.APIPrefix)) {
			p.log.Error("recover service: the server refused a subscription; grant the processor's identity subscribe on "+
				p.subj.RecoverWildcard()+" and "+micro.APIPrefix+".> and allow_responses", "err", le)
		}
	}
	p.log.Info("recover service running", "subject", p.subj.RecoverWildcard(), "version", ServiceVersion())
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

// stop unsubscribes (requests still queued are answered 503) and waits for
// the requests being answered.
func (r *recoverService) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	if err := r.svc.Stop(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		r.log.Warn("recover service: stopping", "err", err)
	}
	r.working.Wait()
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

// handle answers one request.
func (r *recoverService) handle(req micro.Request) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		_ = req.Error("503", "seamguard's recover service is stopping on this instance; ask again", nil)
		return
	}
	r.working.Add(1)
	r.mu.Unlock()
	defer r.working.Done()

	ctx, cancel := context.WithTimeout(r.ctx, recoverTimeout)
	defer cancel()
	hdr, body, err := r.answer(ctx, req.Subject(), req.Data())
	if err != nil {
		var re *recoverError
		if !errors.As(err, &re) {
			re = &recoverError{code: 500, msg: err.Error()}
		}
		// A header value holds one line.
		msg := strings.NewReplacer("\r", " ", "\n", " ").Replace(re.msg)
		if rerr := req.Error(strconv.Itoa(re.code), msg, nil); rerr != nil {
			r.log.Debug("recover service: reply not sent", "subject", req.Subject(), "err", rerr)
		}
		return
	}
	if rerr := req.Respond(body, micro.WithHeaders(micro.Headers(hdr))); rerr != nil {
		r.log.Debug("recover service: reply not sent", "subject", req.Subject(), "err", rerr)
	}
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
	info, h, err := r.spill(ctx, session, rq.Name)
	if err != nil {
		return nil, nil, err
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
	body, cursor, err := r.read(ctx, info, rq)
	if err != nil {
		return nil, nil, err
	}
	hdr.Set(events.HeaderOffset, strconv.FormatUint(rq.Offset, 10))
	if cursor != "" {
		hdr.Set(events.HeaderCursor, cursor)
	}
	return hdr, body, nil
}

// spill reads the info of the spill called name and checks that it is a
// spill of session.
func (r *recoverService) spill(ctx context.Context, session, name string) (*jetstream.ObjectInfo, events.SpillHandle, error) {
	info, err := r.spills.GetInfo(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, events.SpillHandle{}, refuse(404, "session %s has no spill named %q in bucket %s", session, events.Excerpt(name), r.bucket)
	case err != nil:
		return nil, events.SpillHandle{}, jetstreamFailure("read the info of "+name, err)
	case info.Opts != nil && info.Opts.Link != nil:
		return nil, events.SpillHandle{}, refuse(404, "%q in bucket %s is a link, not a spill", events.Excerpt(name), r.bucket)
	}
	h, err := spill.HandleOf(info)
	if err != nil {
		return nil, events.SpillHandle{}, refuse(404, "%q in bucket %s is not a spill seamguard wrote", events.Excerpt(name), r.bucket)
	}
	if got := spill.SessionOf(info); got != session {
		return nil, events.SpillHandle{}, refuse(403, "%q is not a spill of session %s", events.Excerpt(name), session)
	}
	return info, h, nil
}

// jetstreamFailure is a failure of JetStream: 503 (ask again) when it did
// not answer or the processor is stopping, 500 otherwise.
func jetstreamFailure(what string, err error) error {
	if errors.Is(err, context.Canceled) {
		return refuse(503, "seamguard's recover service is stopping on this instance (%s); ask again", what)
	}
	if unreachable(err) {
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

// A cursor says where the chunk holding a read's offset is: the object's
// version (its NUID: a name put again has another), the stream sequence
// at or after which that chunk is the first of the object's chunks, and
// the offset of the chunk's first byte in the object.
type cursor struct {
	nuid       string
	seq, start uint64
}

func (c cursor) String() string {
	return c.nuid + "." + strconv.FormatUint(c.seq, 10) + "." + strconv.FormatUint(c.start, 10)
}

func parseCursor(s string) (cursor, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 || parts[0] == "" {
		return cursor{}, false
	}
	seq, err1 := strconv.ParseUint(parts[1], 10, 64)
	start, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || seq == 0 {
		return cursor{}, false
	}
	return cursor{nuid: parts[0], seq: seq, start: start}, true
}

// read returns up to rq.Max bytes of the object info describes from
// rq.Offset, and the cursor of the next read ("" at the end).
//
// Chunks are read one at a time by direct get of the first message on the
// object's chunk subject at or after a sequence. From a cursor that is one
// read; without one the chunks are counted from the object's first, at
// most its chunk count of reads.
func (r *recoverService) read(ctx context.Context, info *jetstream.ObjectInfo, rq events.RecoverRequest) ([]byte, string, error) {
	if rq.Offset > info.Size {
		return nil, "", refuse(400, "offset %d is past the end of %s, which has %d bytes", rq.Offset, info.Name, info.Size)
	}
	if rq.Offset == info.Size {
		return nil, "", nil
	}
	at := cursor{nuid: info.NUID, seq: 1}
	given := rq.Cursor != ""
	if given {
		c, ok := parseCursor(rq.Cursor)
		switch {
		case !ok:
			return nil, "", refuse(400, "cursor %q is not one this service gave: send back the %s header as it came, or no cursor", events.Excerpt(rq.Cursor), events.HeaderCursor)
		case c.nuid != info.NUID:
			return nil, "", refuse(409, "%s was written again since the cursor was given (it is the same spill when its size and digest are): read on without a cursor, or from the start", info.Name)
		case c.start > rq.Offset:
			return nil, "", refuse(400, "the cursor points at a chunk starting at %d, after offset %d: send the offset the cursor came with", c.start, rq.Offset)
		}
		at = c
	}
	str, err := r.chunkStream(ctx)
	if err != nil {
		return nil, "", err
	}
	subject := "$O." + info.Bucket + ".C." + info.NUID
	// Each pass reads one chunk at a higher sequence, at most the
	// object's chunk count of them.
	for reads := uint32(0); ; reads++ {
		if reads >= info.Chunks {
			return nil, "", refuse(500, "%s is damaged: its %d chunks end before its %d bytes", info.Name, info.Chunks, info.Size)
		}
		m, err := str.GetMsg(ctx, at.seq, jetstream.WithGetMsgSubject(subject))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && given:
			return nil, "", refuse(400, "the cursor points past the chunks of %s: send back the %s header as it came, or no cursor", info.Name, events.HeaderCursor)
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, "", refuse(500, "%s is damaged: bucket %s holds no chunk of it after byte %d of %d", info.Name, info.Bucket, at.start, info.Size)
		case err != nil:
			return nil, "", jetstreamFailure("read a chunk of "+info.Name, err)
		}
		n := uint64(len(m.Data))
		if rq.Offset >= at.start+n {
			if given && reads == 0 {
				return nil, "", refuse(400, "the cursor points at a chunk that ends before offset %d: send the offset the cursor came with", rq.Offset)
			}
			at = cursor{nuid: info.NUID, seq: m.Sequence + 1, start: at.start + n}
			continue
		}
		skip := rq.Offset - at.start
		end := min(n, skip+uint64(r.chunkLimit(rq.Max)))
		if at.start+end > info.Size {
			return nil, "", refuse(500, "%s is damaged: its chunks hold more than its %d bytes", info.Name, info.Size)
		}
		next := cursor{nuid: info.NUID, seq: m.Sequence, start: at.start}
		if end == n {
			next = cursor{nuid: info.NUID, seq: m.Sequence + 1, start: at.start + n}
		}
		if at.start+end == info.Size {
			return m.Data[skip:end], "", nil
		}
		return m.Data[skip:end], next.String(), nil
	}
}

// chunkStream returns the bucket's stream, opening it on first use.
func (r *recoverService) chunkStream(ctx context.Context) (jetstream.Stream, error) {
	r.mu.Lock()
	str := r.chunks
	r.mu.Unlock()
	if str != nil {
		return str, nil
	}
	str, err := r.js.Stream(ctx, "OBJ_"+r.bucket)
	if err != nil {
		return nil, jetstreamFailure("open the stream of bucket "+r.bucket, err)
	}
	r.mu.Lock()
	r.chunks = str
	r.mu.Unlock()
	return str, nil
}
