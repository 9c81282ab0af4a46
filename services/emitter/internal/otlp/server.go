package otlp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

// Off is the address that turns a receiver off.
const Off = "off"

// Server serves a receiver on OTLP/HTTP and OTLP/gRPC listeners.
type Server struct {
	r              *Receiver
	httpLn, grpcLn net.Listener // nil when off
	// idle closes a connection with no request for that long (HTTP: kept alive between
	// requests; gRPC: no RPC open, told with GOAWAY), so connections left open cannot
	// pile up.
	idle time.Duration
}

// Listen binds the two addresses now, so a start-up error is reported before anything
// runs; either may be Off. The errors name the variables a person sets.
func (r *Receiver) Listen(httpAddr, grpcAddr string) (*Server, error) {
	s := &Server{r: r, idle: ops.DefaultIdleTimeout}
	if httpAddr != Off {
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			return nil, fmt.Errorf("cannot listen on EMITTER_OTLP_HTTP_ADDR=%s: %w", httpAddr, err)
		}
		s.httpLn = ln
	}
	if grpcAddr != Off {
		ln, err := net.Listen("tcp", grpcAddr)
		if err != nil {
			if s.httpLn != nil {
				s.httpLn.Close()
			}
			return nil, fmt.Errorf("cannot listen on EMITTER_OTLP_GRPC_ADDR=%s: %w", grpcAddr, err)
		}
		s.grpcLn = ln
	}
	return s, nil
}

// LimitConns counts the receivers' connections in l, under the listener labels otlp_http
// and otlp_grpc: past the limit a new one gets 503 on HTTP, and is closed on gRPC (the
// exporter retries with its backoff). Call it before Run.
func (s *Server) LimitConns(l *ops.ConnLimit) {
	if s.httpLn != nil {
		s.httpLn = l.HTTPListener(s.httpLn, "otlp_http")
	}
	if s.grpcLn != nil {
		s.grpcLn = l.Listener(s.grpcLn, "otlp_grpc")
	}
}

// HTTPAddr and GRPCAddr return the bound addresses, "" for a receiver that is off.
func (s *Server) HTTPAddr() string { return addr(s.httpLn) }

// GRPCAddr: see HTTPAddr.
func (s *Server) GRPCAddr() string { return addr(s.grpcLn) }

func addr(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// Run serves until ctx ends, then stops taking requests and gives the open ones up to
// grace to finish, so every span answered as taken is with the publisher.
func (s *Server) Run(ctx context.Context, grace time.Duration) error {
	errc := make(chan error, 2)
	var hs *http.Server
	if s.httpLn != nil {
		mux := http.NewServeMux()
		mux.Handle("POST /v1/traces", s.r)
		hs = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: ops.MaxHeaderBytes, IdleTimeout: s.idle}
		go func() { errc <- fmt.Errorf("OTLP/HTTP server on %s stopped: %w", s.HTTPAddr(), hs.Serve(s.httpLn)) }()
	}
	var gs *grpc.Server
	if s.grpcLn != nil {
		gs = grpc.NewServer(grpc.MaxRecvMsgSize(int(s.r.maxRecv())),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.idle}),
			grpc.InTapHandle(s.r.tap), s.r.GRPCCodec())
		s.r.RegisterGRPC(gs)
		go func() { errc <- fmt.Errorf("OTLP/gRPC server on %s stopped: %w", s.GRPCAddr(), gs.Serve(s.grpcLn)) }()
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if gs != nil {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-shutCtx.Done():
			gs.Stop()
		}
	}
	if hs != nil {
		if serr := hs.Shutdown(shutCtx); serr != nil && !errors.Is(serr, context.DeadlineExceeded) && err == nil {
			err = fmt.Errorf("cannot shut down the OTLP/HTTP server: %w", serr)
		}
	}
	return err
}
