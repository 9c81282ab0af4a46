package ops_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

// limitedServer runs a Server limited to max connections; it stops when the test ends.
func limitedServer(t *testing.T, max int) (*ops.Server, *ops.ConnLimit) {
	t.Helper()
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	l := ops.NewConnLimit(max, "test", s.Registry())
	s.LimitConns(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s, l
}

// get sends GET /healthz on c and reads the answer's head.
func get(t *testing.T, c net.Conn, br *bufio.Reader) *http.Response {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func waitOpen(t *testing.T, l *ops.ConnLimit, want int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); l.Open() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want %d", l.Open(), want)
		}
	}
}

// TestConnLimit: at the limit a new connection gets a 503 and is closed, the ones open are
// served as before, requests on one connection hold one place, and once one closes a new one
// is served.
func TestConnLimit(t *testing.T) {
	s, l := limitedServer(t, 2)
	if err := testutil.GatherAndCompare(s.Registry(), strings.NewReader(`
# HELP test_connections_open Client connections open, by listener.
# TYPE test_connections_open gauge
test_connections_open{listener="http"} 0
# HELP test_connections_refused_total Client connections refused at once, the limit of open connections reached, by listener.
# TYPE test_connections_refused_total counter
test_connections_refused_total{listener="http"} 0
`), "test_connections_open", "test_connections_refused_total"); err != nil {
		t.Fatalf("before any connection: %v", err)
	}
	c1, br1 := dial(t, s.Addr())
	c2, br2 := dial(t, s.Addr())
	for range 3 {
		for _, c := range []struct {
			c  net.Conn
			br *bufio.Reader
		}{{c1, br1}, {c2, br2}} {
			if resp := get(t, c.c, c.br); resp.StatusCode != 200 {
				t.Fatalf("under the limit: %d", resp.StatusCode)
			}
		}
	}
	if l.Open() != 2 {
		t.Fatalf("%d open after three requests on each of two connections, want 2", l.Open())
	}

	c3, br3 := dial(t, s.Addr())
	resp := get(t, c3, br3)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !resp.Close {
		t.Fatalf("over the limit: %d, Retry-After %q, close %v", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close)
	}
	if n, err := br3.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the 503: %d bytes, %v; want the connection closed", n, err)
	}
	c1.Close()
	waitOpen(t, l, 1)
	c4, br4 := dial(t, s.Addr())
	if resp := get(t, c4, br4); resp.StatusCode != 200 {
		t.Fatalf("after one closed: %d", resp.StatusCode)
	}
	if err := testutil.GatherAndCompare(s.Registry(), strings.NewReader(`
# HELP test_connections_open Client connections open, by listener.
# TYPE test_connections_open gauge
test_connections_open{listener="http"} 2
# HELP test_connections_refused_total Client connections refused at once, the limit of open connections reached, by listener.
# TYPE test_connections_refused_total counter
test_connections_refused_total{listener="http"} 1
`), "test_connections_open", "test_connections_refused_total"); err != nil {
		t.Fatal(err)
	}
}

// TestConnLimitRefusedClientsDoNotHoldAccept: refused clients that never read nor hang up
// each keep their 503 unread for up to a second; the listener goes on accepting meanwhile.
func TestConnLimitRefusedClientsDoNotHoldAccept(t *testing.T) {
	s, l := limitedServer(t, 1)
	c1, br1 := dial(t, s.Addr())
	if resp := get(t, c1, br1); resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	for range 30 {
		dial(t, s.Addr()) // never read, closed when the test ends
	}
	c1.Close()
	waitOpen(t, l, 0)
	start := time.Now()
	c, br := dial(t, s.Addr())
	if resp := get(t, c, br); resp.StatusCode != 200 {
		t.Fatalf("got %d, want the connection served", resp.StatusCode)
	}
	// Answered one after another, the refusals would hold Accept for 30 s.
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("served after %v", waited)
	}
}

// TestConnLimitListener: a listener that does not answer closes a refused connection at
// once; a connection frees its place when closed, once, however often Close is called, and
// not when only its writing side is.
func TestConnLimitListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := ops.NewConnLimit(1, "test", prometheus.NewRegistry())
	ln := l.Listener(raw, "grpc")
	defer ln.Close()
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial(t, raw.Addr().String())
	held := <-accepted
	if _, ok := held.(syscall.Conn); !ok {
		t.Fatal("the connection does not give its socket")
	}
	refused, br := dial(t, raw.Addr().String())
	_ = refused.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("refused: %d bytes, %v; want it closed", n, err)
	}
	if err := held.(interface{ CloseWrite() error }).CloseWrite(); err != nil || l.Open() != 1 {
		t.Fatalf("after CloseWrite: %v, %d open", err, l.Open())
	}
	_ = held.Close()
	_ = held.Close()
	if l.Open() != 0 {
		t.Fatalf("%d open after closing twice, want 0", l.Open())
	}
	dial(t, raw.Addr().String())
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("a place was freed, but the next connection was not accepted")
	}
}

// BenchmarkLimitedConn: requests on one kept-alive connection, through a ConnLimit's listener
// and not: the limit works per connection, so both cost the same per request.
func BenchmarkLimitedConn(b *testing.B) {
	for _, limited := range []bool{false, true} {
		b.Run(map[bool]string{false: "unlimited", true: "limited"}[limited], func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if limited {
				ln = ops.NewConnLimit(10, "bench", prometheus.NewRegistry()).HTTPListener(ln, "http")
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte("ok\n"))
			})}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Close()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// TestProbesOnTheirOwnListener: with every connection of the service's address taken, its
// probes and scrapes are still answered on the probes' address, which serves nothing else.
func TestProbesOnTheirOwnListener(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.ProbesOn("127.0.0.1:0")
	s.Handle("GET /work", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "done\n") }))
	l := ops.NewConnLimit(1, "test", s.Registry())
	s.LimitConns(l)
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if s.ProbesAddr() == s.Addr() || strings.HasSuffix(s.ProbesAddr(), ":0") {
		t.Fatalf("probes on %s, service on %s", s.ProbesAddr(), s.Addr())
	}

	c1, br1 := dial(t, s.Addr())
	if resp := get(t, c1, br1); resp.StatusCode != 200 {
		t.Fatalf("the service's address: %d", resp.StatusCode)
	}
	c2, br2 := dial(t, s.Addr())
	if resp := get(t, c2, br2); resp.StatusCode != 503 {
		t.Fatalf("the service's address, full: %d, want 503", resp.StatusCode)
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200, "/work": 404} {
		resp, err := http.Get("http://" + s.ProbesAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("probes' %s: %d, want %d", path, resp.StatusCode, want)
		}
		if path == "/metrics" && !strings.Contains(string(body), `test_connections_open{listener="http"} 1`) {
			t.Fatalf("the scrape does not show the full service address:\n%s", body)
		}
	}
}
