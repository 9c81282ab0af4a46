package otlp

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionsAreClosed: an OTLP/HTTP connection kept alive with no next request, and
// an OTLP/gRPC connection with no RPC, are closed once the idle timeout passes.
func TestIdleConnectionsAreClosed(t *testing.T) {
	r := newTestReceiver(&pubRecorder{}, "", 1<<20)
	srv, err := r.Listen("127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.idle = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, time.Second) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// within bounds the wait: gRPC tells the client with GOAWAY and a ping first, and closes
	// the connection seconds later when, as here, no answer comes.
	closed := func(t *testing.T, c net.Conn, within time.Duration) {
		t.Helper()
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(within + 10*time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("want the server to close the idle connection: %v", err)
		}
		if waited := time.Since(start); waited > within {
			t.Fatalf("closed after %v", waited)
		}
	}

	t.Run("http", func(t *testing.T) {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		buf := make([]byte, 4096)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
			t.Fatalf("answer %q %v", buf[:n], err)
		}
		closed(t, c, 5*time.Second)
	})
	t.Run("grpc", func(t *testing.T) {
		c, err := net.Dial("tcp", srv.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The HTTP/2 client preface and an empty SETTINGS frame: a client connection with no RPC.
		_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
		closed(t, c, 15*time.Second)
	})
}
