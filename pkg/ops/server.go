package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether one dependency is ready; nil means ready.
type Check func(ctx context.Context) error

// Server is a service's HTTP listener: /healthz (the process runs), /readyz (every check
// passes) and /metrics, plus any routes the service adds with Handle.
type Server struct {
	addr     string
	mux      *http.ServeMux
	registry *prometheus.Registry
	logger   *slog.Logger

	mu     sync.Mutex
	checks []namedCheck

	idle       time.Duration
	ln         net.Listener
	probes     *http.ServeMux // /healthz, /readyz and /metrics alone, for probesAddr
	probesAddr string         // "": no listener of their own
	probesLn   net.Listener
	conns      *ConnLimit
	wrap       func(net.Listener) net.Listener
	connCtx    func(context.Context, net.Conn) context.Context
	onShutdown []func(ctx context.Context) error
}

type namedCheck struct {
	name  string
	check Check
}

// DefaultIdleTimeout is how long a kept-alive connection may wait for its next request
// before the server closes it: longer than the idle timeouts of the common HTTP clients'
// pools (Go's 90 s, Node's and Python's a few seconds), so that the client, not the server,
// closes an idle connection and never sends a request on one being closed.
const DefaultIdleTimeout = 2 * time.Minute

// MaxHeaderBytes bounds a request's head (request line and headers) on the servers of the
// services: 64 KiB, what Envoy allows by default and eight times what the LLM SDKs send. A
// longer head is answered 431. net/http's own default, 1 MiB, would let each of the
// emitter's 10,000 connections hold a megabyte of headers.
const MaxHeaderBytes = 64 << 10

// NewServer returns a server for addr with a fresh registry holding the Go and process
// collectors.
func NewServer(addr string, logger *slog.Logger) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{addr: addr, mux: http.NewServeMux(), probes: http.NewServeMux(), registry: reg, logger: logger, idle: DefaultIdleTimeout}
	for _, mux := range []*http.ServeMux{s.mux, s.probes} {
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("ok\n"))
		})
		mux.HandleFunc("GET /readyz", s.readyz)
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	}
	return s
}

// ProbesOn makes Run serve /healthz, /readyz and /metrics on addr too, and nothing else
// there: for a service whose own address can fill (every connection the emitter allows taken
// by streams), so that its probes and scrapes are still answered. With LimitConns, addr has
// a limit of its own, DefaultMaxConns, counted as the listener "probes". Call it before
// Listen.
func (s *Server) ProbesOn(addr string) { s.probesAddr = addr }

// Registry is where the service registers its metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Handle adds a route, such as the emitter's proxy and ingest.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// AddCheck adds a readiness check, such as "the streams exist" or "ClickHouse answers".
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, namedCheck{name, c})
}

// Ready runs every check and returns the failures by name; an empty map means ready.
func (s *Server) Ready(ctx context.Context) map[string]string {
	s.mu.Lock()
	checks := append([]namedCheck(nil), s.checks...)
	s.mu.Unlock()
	failed := map[string]string{}
	for _, c := range checks {
		if err := c.check(ctx); err != nil {
			failed[c.name] = err.Error()
		}
	}
	return failed
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	failed := s.Ready(ctx)
	w.Header().Set("Content-Type", "application/json")
	if len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "failed": failed})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": true})
}

// LimitConns bounds the connections Run serves at once (NewConnLimit), as the listener
// "http"; without it Run serves any number.
func (s *Server) LimitConns(l *ConnLimit) {
	l.open.WithLabelValues("http")
	l.refusals.WithLabelValues("http")
	if s.probesAddr != "" {
		l.open.WithLabelValues("probes")
		l.refusals.WithLabelValues("probes")
	}
	s.conns = l
}

// WrapListener makes Run serve the connections that wrap(listener) accepts: for a service
// that takes connections over from the HTTP server and gives them back (the emitter's proxy).
func (s *Server) WrapListener(wrap func(net.Listener) net.Listener) { s.wrap = wrap }

// SetIdleTimeout sets how long a kept-alive connection may wait for its next request
// (DefaultIdleTimeout unless set); d must be positive. Without one, every connection a client
// leaves open would hold a goroutine and its buffers for ever.
func (s *Server) SetIdleTimeout(d time.Duration) { s.idle = d }

// ConnContext sets the HTTP server's http.Server.ConnContext: for a handler that needs the
// client's connection (the emitter's proxy writes streams to its socket).
func (s *Server) ConnContext(f func(ctx context.Context, c net.Conn) context.Context) { s.connCtx = f }

// OnShutdown adds f to Run's shutdown, after the HTTP server's: f gets what is left of the
// grace, for what the server no longer tracks, such as hijacked connections.
func (s *Server) OnShutdown(f func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onShutdown = append(s.onShutdown, f)
}

// Listen binds the address now, so a start-up error is reported before anything runs
// and Addr knows the port when HTTP_ADDR asks for port 0.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("cannot listen on HTTP_ADDR=%s: %w", s.addr, err)
	}
	s.ln = ln
	if s.probesAddr != "" {
		if s.probesLn, err = net.Listen("tcp", s.probesAddr); err != nil {
			_ = ln.Close()
			return fmt.Errorf("cannot listen for probes on %s: %w", s.probesAddr, err)
		}
	}
	return nil
}

// ProbesAddr returns the probes' bound address once Listen has run ("" without ProbesOn).
func (s *Server) ProbesAddr() string {
	if s.probesLn == nil {
		return s.probesAddr
	}
	return s.probesLn.Addr().String()
}

// Addr returns the bound address once Listen has run.
func (s *Server) Addr() string {
	if s.ln == nil {
		return s.addr
	}
	return s.ln.Addr().String()
}

// Run serves until ctx ends, then shuts down, giving open requests up to grace to finish.
func (s *Server) Run(ctx context.Context, grace time.Duration) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: MaxHeaderBytes, IdleTimeout: s.idle, ConnContext: s.connCtx}
	ln := s.ln
	if s.conns != nil {
		ln = s.conns.HTTPListener(ln, "http") // under wrap: a connection it took over still holds its place
	}
	if s.wrap != nil {
		ln = s.wrap(ln)
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if s.probesLn != nil {
		probes := &http.Server{Handler: s.probes, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: MaxHeaderBytes, IdleTimeout: s.idle}
		pln := s.probesLn
		if s.conns != nil {
			pln = s.conns.apart(DefaultMaxConns).HTTPListener(pln, "probes")
		}
		go func() { errc <- probes.Serve(pln) }()
		defer probes.Close()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("HTTP server on %s stopped: %w", s.Addr(), err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("cannot shut down the HTTP server: %w", err)
	}
	s.mu.Lock()
	hooks := append([]func(context.Context) error(nil), s.onShutdown...)
	s.mu.Unlock()
	for _, f := range hooks {
		if err := f(shutCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("cannot shut down: %w", err)
		}
	}
	return nil
}
