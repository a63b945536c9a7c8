// Package admin serves a node's HTTP admin endpoint: /metrics
// (Prometheus), /healthz, /readyz, /locks and, when asked for,
// /debug/pprof/. It is read-only: every path answers GET and HEAD, and
// nothing else (405). The node says what each path shows (Config); the
// package owns the listener, the HTTP server and its timeouts.
package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Config is what the endpoint serves. Each func is called on the request's
// goroutine, concurrently with others: it must be safe for that.
type Config struct {
	Addr string // host:port to listen on (port 0: any)
	// Metrics is the node's own metrics, collected at scrape time; the
	// Go runtime's and the process's are served beside them.
	Metrics prometheus.Collector
	// Health returns why the node cannot serve (it cannot reserve tokens,
	// say), nil when it can: /healthz answers 503 with the reason, or 200.
	Health func() error
	// Ready reports whether the node serves clients (the active) and,
	// when it does not, why: /readyz answers 200, or 503 with the reason.
	Ready func() (ok bool, why string)
	// Locks serves /locks.
	Locks http.Handler
	// Pprof serves net/http/pprof under /debug/pprof/.
	Pprof  bool
	Logger zerolog.Logger
}

// Server is a running admin endpoint. Its methods may be called on a nil
// *Server (a node without one): Addr says "", Stop does nothing.
type Server struct {
	srv  *http.Server
	addr string
}

// readHeaderTimeout bounds a client that opens a connection and sends
// nothing, or a header a byte at a time.
const readHeaderTimeout = 10 * time.Second

// Start listens on cfg.Addr and serves the endpoint on a goroutine of its
// own until Stop.
func Start(cfg Config) (*Server, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(cfg.Metrics); err != nil {
		return nil, fmt.Errorf("server: admin metrics: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("server: admin listen %s: %w", cfg.Addr, err)
	}

	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := cfg.Health(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := cfg.Ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "active")
	})
	mux.Handle("/locks", cfg.Locks)
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	s := &Server{
		srv:  &http.Server{Handler: readOnly(mux), ReadHeaderTimeout: readHeaderTimeout},
		addr: ln.Addr().String(),
	}
	log := cfg.Logger
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("admin endpoint stopped")
		}
	}()
	return s, nil
}

// readOnly refuses every method but GET and HEAD with 405: the admin
// endpoint changes nothing.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Addr returns the address the endpoint listens on.
func (s *Server) Addr() string {
	if s == nil {
		return ""
	}
	return s.addr
}

// Stop shuts the endpoint down, waiting for requests under way until ctx
// ends.
func (s *Server) Stop(ctx context.Context) {
	if s != nil {
		_ = s.srv.Shutdown(ctx)
	}
}
