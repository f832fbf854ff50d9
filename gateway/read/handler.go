package read

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/spill"
)

// The patterns of the two endpoints, for an http.ServeMux (Go 1.22 and
// later). The handlers read the path values "session" and "n".
const (
	PatternSpill    = "GET /v1/sessions/{session}/spills/{n}"
	PatternVerdicts = "GET /v1/verdicts"
)

// Media types of the answers.
const (
	ContentTypeJSONLines   = "application/jsonl"
	ContentTypeEventStream = "text/event-stream"
	ContentTypeProblem     = "application/problem+json"
)

// Handler serves the read endpoints. Make one with New; it is safe for
// concurrent use.
type Handler struct {
	js     jetstream.JetStream
	access Access
	cfg    Config
	names  processor.Names
	subj   events.Subjects
	store  *spill.Store
	ver    *attest.Verifier
	log    *slog.Logger

	streams    chan struct{} // a token per open verdict stream
	spillReads chan struct{} // a token per spill read in flight

	closing   chan struct{} // closed by Close
	closeOnce sync.Once

	mu       sync.Mutex
	digests  map[string]string // chain key -> digest of the chain's bytes
	sessions map[string]int    // session ("" for all) -> open verdict streams
}

// New returns a Handler that reads through js, asks access, and serves
// what cfg says. It fails if cfg does not validate or js or access is
// nil.
func New(js jetstream.JetStream, access Access, cfg Config, opts ...Option) (*Handler, error) {
	var errs []error
	if js == nil {
		errs = append(errs, errors.New("read: New: js is nil: a JetStream context is required"))
	}
	if access == nil {
		errs = append(errs, errors.New("read: New: access is nil: use Loopback for a listener without credentials"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	pc := processor.Config{Prefix: cfg.Prefix}
	h := &Handler{
		js:         js,
		access:     access,
		cfg:        cfg,
		names:      pc.Names(),
		subj:       events.Subjects{Prefix: cfg.Prefix},
		log:        slog.Default(),
		streams:    make(chan struct{}, orDefault(cfg.MaxStreams, DefaultMaxStreams)),
		spillReads: make(chan struct{}, orDefault(cfg.MaxSpillReads, DefaultMaxSpillReads)),
		digests:    map[string]string{},
		sessions:   map[string]int{},
		closing:    make(chan struct{}),
	}
	h.store = &spill.Store{JS: js, Stream: h.names.Events, Subjects: h.subj, Bucket: h.names.Spills}
	if err := h.store.Validate(); err != nil {
		return nil, err
	}
	h.ver = &attest.Verifier{Trust: cfg.Trust, Subjects: h.subj}
	for _, o := range opts {
		o(h)
	}
	return h, nil
}

// Register mounts both endpoints on mux at PatternSpill and
// PatternVerdicts.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc(PatternSpill, h.Spill)
	mux.HandleFunc(PatternVerdicts, h.Verdicts)
}

// Close ends every open verdict stream (each gets a last comment asking
// the client to reconnect) and answers later ones 503; spill reads are not
// affected. http.Server.Shutdown waits for handlers that are still
// running, so give it Close: srv.RegisterOnShutdown(h.Close). Close may
// be called more than once, from any goroutine.
func (h *Handler) Close() {
	h.closeOnce.Do(func() { close(h.closing) })
}

// acquire takes a token of sem, or answers 503 and returns false.
func acquire(w http.ResponseWriter, sem chan struct{}, what string) bool {
	select {
	case sem <- struct{}{}:
		return true
	default:
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "too many "+what+" at once (at most "+strconv.Itoa(cap(sem))+"); try again shortly")
		return false
	}
}

// openSession counts a verdict stream of session, or answers 503 and
// returns false when the session has Config.SessionStreams open.
func (h *Handler) openSession(w http.ResponseWriter, session string) bool {
	limit := orDefault(h.cfg.SessionStreams, DefaultSessionStreams)
	h.mu.Lock()
	n := h.sessions[session]
	if n < limit {
		h.sessions[session] = n + 1
	}
	h.mu.Unlock()
	if n >= limit {
		what := "session " + session
		if session == "" {
			what = "every session"
		}
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "too many verdict streams of "+what+" at once (at most "+strconv.Itoa(limit)+"); close one, or try again shortly")
		return false
	}
	return true
}

func (h *Handler) closeSession(session string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions[session]--; h.sessions[session] <= 0 {
		delete(h.sessions, session)
	}
}

// deny answers a denial of Access.
func deny(w http.ResponseWriter, err error) {
	status := statusOf(err)
	if status == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="seamguard"`)
	}
	problem(w, status, err.Error())
}

// problem answers status with an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{"about:blank", http.StatusText(status), status, detail})
	hd := w.Header()
	hd.Del("Content-Length")
	hd.Del("Digest")
	hd.Del("Repr-Digest")
	hd.Set("Content-Type", ContentTypeProblem)
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// writeDeadline extends the connection's write deadline by the configured
// WriteTimeout; a writer that cannot have one (a test recorder) is left as
// it is.
func (h *Handler) writeDeadline(rc *http.ResponseController) {
	_ = rc.SetWriteDeadline(time.Now().Add(orDefault(h.cfg.WriteTimeout, DefaultWriteTimeout)))
}

// OpenStreams is the number of verdict streams open now.
func (h *Handler) OpenStreams() int { return len(h.streams) }
