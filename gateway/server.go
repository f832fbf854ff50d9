package gateway

import (
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"
)

// Server is the HTTP gateway: an http.Handler for POST /v1/events and for
// whatever else is mounted on it. Build it with New; any goroutine may
// call its methods, and ServeHTTP serves any number of requests at once.
type Server struct {
	cfg     Config
	agentJS jetstream.JetStream
	opJS    jetstream.JetStream // nil without Config.Operator
	mux     *http.ServeMux
	waiting chan struct{} // a slot per ?wait= request waiting
}

// New returns a Server for cfg, or cfg's problems.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Auth == nil {
		cfg.Auth = &Auth{}
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), waiting: make(chan struct{}, cfg.MaxWaiting)}
	var err error
	if s.agentJS, err = jetstream.New(cfg.Agent); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.Operator != nil {
		if s.opJS, err = jetstream.New(cfg.Operator); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	s.mux.HandleFunc("POST /v1/events", s.postEvents)
	s.mux.HandleFunc("/v1/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		WriteError(w, http.StatusMethodNotAllowed, fmt.Errorf("gateway: %s /v1/events: only POST is served here", r.Method))
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, fmt.Errorf("gateway: no endpoint %s %s; see docs/http.md", r.Method, r.URL.Path))
	})
	return s, nil
}

// Auth returns the Auth the server checks requests with, for handlers
// mounted beside it.
func (s *Server) Auth() *Auth { return s.cfg.Auth }

// Config returns the server's configuration with its defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Mount serves h for pattern (http.ServeMux syntax, e.g.
// "GET /v1/verdicts"). h checks its own requests, with Auth's Session or
// Operator. Mount panics if pattern is mounted already or conflicts with
// the server's own, as ServeMux.Handle does. Any goroutine may call it,
// before or while the server serves.
func (s *Server) Mount(pattern string, h http.Handler) {
	s.mux.Handle(pattern, h)
}

// ServeHTTP serves r.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}
