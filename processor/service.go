package processor

import (
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
)

// service.go: how the processor answers requests on NATS (the recover
// service, recover.go, and its discovery), so that nothing a requester
// sends makes the processor write where the requester could not:
//
//   - a reply goes only to a subject inside an inbox prefix
//     (Config.ReplyPrefixes); a request with any other reply subject gets
//     no answer, and is counted (Stats.ServiceDenied, the Observer) and
//     logged;
//   - requests wait in a bounded queue per session, served round-robin
//     by a few workers, at most one request of a session at a time, so
//     that one session's flood delays only that session; a request that
//     finds its session's queue or the whole queue full is answered 503 at
//     once;
//   - the service answers on the connection WithResponder gives, whose
//     identity should be allowed to publish to those inboxes and nothing
//     else, so that a slip here still cannot reach anything else.
//
// The discovery requests ($SRV.PING, $SRV.INFO and $SRV.STATS, with and
// without the service's name and id) are answered in the NATS micro
// protocol's format, so that `nats micro ls` finds the service.

const (
	// serviceWorkers answer requests concurrently, each one at a time.
	serviceWorkers = 4
	// servicePerSession bounds the requests of one session waiting.
	servicePerSession = 8
	// serviceQueued bounds the requests waiting in all.
	serviceQueued = 512
	// serviceMaxWait: a request that waited longer in the queue is
	// answered 503 unread (its requester has most likely given up).
	serviceMaxWait = recoverTimeout
	// serviceLogEvery bounds how often denials are logged.
	serviceLogEvery = 10 * time.Second
	// maxReplySubject bounds a reply subject the service answers to.
	maxReplySubject = 256
)

// Reasons a request is not served, as Observer.ServiceDenied reports
// them.
const (
	// DeniedReply: the reply subject is not inside an inbox prefix; the
	// request got no answer.
	DeniedReply = "reply_subject"
	// DeniedOverload: the session's queue, or the whole queue, was full;
	// the request was answered 503.
	DeniedOverload = "overloaded"
)

// answerAnyReply turns the reply check off, for the tests that show what
// it stops (export_test.go); nothing else sets it.
var answerAnyReply atomic.Bool

// replyAllowed reports whether reply is <prefix>.<tokens> for one of
// prefixes: every token non-empty, with no wildcard, space or control
// character.
func replyAllowed(reply string, prefixes []string) bool {
	if answerAnyReply.Load() {
		return reply != ""
	}
	if len(reply) > maxReplySubject {
		return false
	}
	for _, p := range prefixes {
		rest, ok := strings.CutPrefix(reply, p+".")
		if ok && plainTokens(rest) {
			return true
		}
	}
	return false
}

// plainTokens reports whether s is one or more non-empty dot-separated
// tokens without wildcards, spaces or control characters.
func plainTokens(s string) bool {
	if s == "" {
		return false
	}
	prevDot := true
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if prevDot {
				return false
			}
			prevDot = true
			continue
		case c == '*' || c == '>' || c <= ' ' || c == 0x7f:
			return false
		}
		prevDot = false
	}
	return !prevDot
}

// serviceRequest is a request waiting in a fairQueue.
type serviceRequest struct {
	msg     *nats.Msg
	session string
	at      time.Time
}

// fairQueue holds requests per session and hands them out round-robin
// over the sessions, at most one of a session at a time. Safe for
// concurrent use.
type fairQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queues map[string][]serviceRequest // waiting, per session
	ready  []string                    // sessions waiting and not in service, in turn
	busy   map[string]bool             // sessions in service
	n      int                         // requests waiting
	closed bool
}

func newFairQueue() *fairQueue {
	q := &fairQueue{queues: map[string][]serviceRequest{}, busy: map[string]bool{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues r; it returns why not ("" when queued).
func (q *fairQueue) push(r serviceRequest) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return "seamguard's recover service is stopping on this instance; ask again"
	case len(q.queues[r.session]) >= servicePerSession:
		return "session " + r.session + " has " + strconv.Itoa(servicePerSession) + " requests waiting already; wait for their answers, then ask again"
	case q.n >= serviceQueued:
		return "seamguard's recover service has " + strconv.Itoa(serviceQueued) + " requests waiting on this instance; ask again shortly"
	}
	first := len(q.queues[r.session]) == 0
	q.queues[r.session] = append(q.queues[r.session], r)
	q.n++
	if first && !q.busy[r.session] {
		q.ready = append(q.ready, r.session)
		q.cond.Signal()
	}
	return ""
}

// pop waits for the next request whose session is not in service, and
// marks its session in service until done; ok is false once the queue is
// closed.
func (q *fairQueue) pop() (serviceRequest, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ready) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return serviceRequest{}, false
	}
	s := q.ready[0]
	q.ready[0] = ""
	q.ready = q.ready[1:]
	rs := q.queues[s]
	r := rs[0]
	rs[0] = serviceRequest{}
	if len(rs) == 1 {
		delete(q.queues, s)
	} else {
		q.queues[s] = rs[1:]
	}
	q.n--
	q.busy[s] = true
	return r, true
}

// done ends the service of session's request: its next one, if any,
// takes its turn at the back.
func (q *fairQueue) done(session string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.busy, session)
	if len(q.queues[session]) > 0 && !q.closed {
		q.ready = append(q.ready, session)
		q.cond.Signal()
	}
}

// close wakes every worker and returns the requests still waiting.
func (q *fairQueue) close() []serviceRequest {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
	var left []serviceRequest
	for _, rs := range q.queues {
		left = append(left, rs...)
	}
	q.queues, q.ready, q.n = map[string][]serviceRequest{}, nil, 0
	return left
}

// denials counts and logs the requests a service would not answer; the
// log says so at most once per serviceLogEvery, with the count since.
type denials struct {
	log     *slog.Logger
	obs     Observer
	total   atomic.Uint64
	mu      sync.Mutex
	lastLog time.Time
	since   uint64
}

func (d *denials) deny(reason, subject, reply string) {
	d.total.Add(1)
	d.obs.ServiceDenied(reason)
	d.mu.Lock()
	d.since++
	now := time.Now()
	if !d.lastLog.IsZero() && now.Sub(d.lastLog) < serviceLogEvery {
		d.mu.Unlock()
		return
	}
	n := d.since
	d.since, d.lastLog = 0, now
	d.mu.Unlock()
	switch reason {
	case DeniedReply:
		d.log.Warn("recover service: a request named a reply subject outside the inbox prefixes; it got no answer (a requester trying to make the processor publish for it?)",
			"subject", excerptSubject(subject), "reply", excerptSubject(reply), "denied_since_last_log", n)
	default:
		d.log.Warn("recover service: requests answered 503, their session's queue or the whole queue being full",
			"subject", excerptSubject(subject), "denied_since_last_log", n)
	}
}

// excerptSubject is a subject as a log may quote it.
func excerptSubject(s string) string {
	if len(s) > 128 {
		s = s[:128] + "…"
	}
	return strconv.Quote(s)
}

// serviceStats are what $SRV.STATS reports of the endpoint.
type serviceStats struct {
	mu        sync.Mutex
	requests  int
	errors    int
	lastError string
	busy      time.Duration
}

func (s *serviceStats) add(took time.Duration, errMsg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	s.busy += took
	if errMsg != "" {
		s.errors++
		s.lastError = errMsg
	}
}

// discovery is the micro protocol's view of the service.
type discovery struct {
	id          micro.ServiceIdentity
	description string
	endpoint    micro.EndpointInfo
	started     time.Time
}

func newDiscovery(name, version, description string, metadata map[string]string, endpoint micro.EndpointInfo) *discovery {
	return &discovery{
		id:          micro.ServiceIdentity{Name: name, ID: nuid.Next(), Version: version, Metadata: metadata},
		description: description, endpoint: endpoint, started: time.Now().UTC(),
	}
}

// subjects are the discovery subjects the service answers.
func (d *discovery) subjects() []string {
	var out []string
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		base := micro.APIPrefix + "." + verb
		out = append(out, base, base+"."+d.id.Name, base+"."+d.id.Name+"."+d.id.ID)
	}
	return out
}

// answer is the body answering a request on a discovery subject.
func (d *discovery) answer(subject string, st *serviceStats) ([]byte, error) {
	verb, _, _ := strings.Cut(strings.TrimPrefix(subject, micro.APIPrefix+"."), ".")
	switch verb {
	case "PING":
		return json.Marshal(micro.Ping{ServiceIdentity: d.id, Type: micro.PingResponseType})
	case "INFO":
		return json.Marshal(micro.Info{ServiceIdentity: d.id, Type: micro.InfoResponseType, Description: d.description, Endpoints: []micro.EndpointInfo{d.endpoint}})
	default:
		st.mu.Lock()
		es := &micro.EndpointStats{
			Name: d.endpoint.Name, Subject: d.endpoint.Subject, QueueGroup: d.endpoint.QueueGroup,
			NumRequests: st.requests, NumErrors: st.errors, LastError: st.lastError, ProcessingTime: st.busy,
		}
		if st.requests > 0 {
			es.AverageProcessingTime = st.busy / time.Duration(st.requests)
		}
		st.mu.Unlock()
		return json.Marshal(micro.Stats{ServiceIdentity: d.id, Type: micro.StatsResponseType, Started: d.started, Endpoints: []*micro.EndpointStats{es}})
	}
}

// errorReply is a refusal in the micro protocol: no body, the code and
// description in headers (one line each).
func errorReply(reply string, code int, msg string) *nats.Msg {
	m := nats.NewMsg(reply)
	m.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(code))
	m.Header.Set(micro.ErrorHeader, strings.NewReplacer("\r", " ", "\n", " ").Replace(msg))
	return m
}
