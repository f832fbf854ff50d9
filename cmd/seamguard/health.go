package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor"
)

// health serves /healthz (the process runs and NATS is connected) and
// /readyz (the processor consumes), for compose health checks and
// Kubernetes probes, and /metrics for Prometheus.
type health struct {
	nc      *nats.Conn
	ready   func() error
	parked  func() []processor.ParkRecord // nil: none reported
	metrics http.Handler                  // nil: no /metrics
}

func (h health) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if st := h.nc.Status(); st != nats.CONNECTED {
			http.Error(w, "nats: "+st.String(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if st := h.nc.Status(); st != nats.CONNECTED {
			http.Error(w, "nats: "+st.String(), http.StatusServiceUnavailable)
			return
		}
		if err := h.ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
		// Parked sessions do not make the processor unready (every other
		// session goes on); they are named here, and counted by
		// seamguard_sessions_parked.
		if h.parked != nil {
			for _, r := range h.parked() {
				fmt.Fprintf(w, "parked: session %s since %s (stored up to events sequence %d): %s; seamguard resume %s --note ... applies its waiting inputs\n",
					termtext.Escape(r.Session), r.ParkedAt.Format(time.RFC3339), r.StoredSeq, termtext.Escape(r.Cause), termtext.Escape(r.Session))
			}
		}
	})
	if h.metrics != nil {
		mux.Handle("GET /metrics", h.metrics)
	}
	return mux
}

// serveHealth serves on ln until ctx ends, and returns the address it
// serves on.
func serveHealth(ctx context.Context, ln net.Listener, h health, log *slog.Logger) string {
	srv := &http.Server{Handler: h.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("health endpoint stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr().String()
}
