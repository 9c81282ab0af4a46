package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

func TestServer(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	dbErr := errors.New("ClickHouse at 127.0.0.1:9000 does not answer")
	s.AddCheck("clickhouse", func(context.Context) error { mu.Lock(); defer mu.Unlock(); return dbErr })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()
	base := "http://" + s.Addr()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	code, body := get("/readyz")
	var r struct {
		Ready  bool
		Failed map[string]string
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || code != 503 || r.Ready || !strings.Contains(r.Failed["clickhouse"], "does not answer") {
		t.Fatalf("/readyz %d %s", code, body)
	}
	mu.Lock()
	dbErr = nil
	mu.Unlock()
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz after recovery: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHeadBounded: a request head over MaxHeaderBytes is answered 431, not read into memory;
// one under it is served.
func TestHeadBounded(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()
	defer func() {
		cancel()
		<-done
	}()
	for _, tc := range []struct {
		size int
		want int
	}{{32 << 10, http.StatusOK}, {ops.MaxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/healthz", nil)
		req.Header.Set("X-Big", strings.Repeat("a", tc.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("a head of %d bytes: %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}

func TestListenError(t *testing.T) {
	s := ops.NewServer("256.0.0.1:99999", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Listen(); err == nil || !strings.Contains(err.Error(), "HTTP_ADDR") {
		t.Fatalf("got %v", err)
	}
}

type wrapped struct {
	net.Listener
	accepted *atomic.Int64
}

func (w wrapped) Accept() (net.Conn, error) {
	c, err := w.Listener.Accept()
	if err == nil {
		w.accepted.Add(1)
	}
	return c, err
}

// TestWrapListenerAndOnShutdown: Run serves through the wrapped listener, tells handlers their
// connection through ConnContext, and calls the shutdown hooks after the HTTP server's
// shutdown, with what is left of the grace.
func TestWrapListenerAndOnShutdown(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	s.WrapListener(func(ln net.Listener) net.Listener { return wrapped{ln, &accepted} })
	type connKey struct{}
	s.ConnContext(func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) })
	entered, release := make(chan struct{}), make(chan struct{})
	var conn net.Conn
	s.Handle("GET /slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _ = r.Context().Value(connKey{}).(net.Conn)
		close(entered)
		<-release
	}))
	hook := make(chan time.Duration, 1)
	s.OnShutdown(func(ctx context.Context) error {
		deadline, _ := ctx.Deadline()
		hook <- time.Until(deadline)
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, 2*time.Second) }()
	slow := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + s.Addr() + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		slow <- err
	}()
	<-entered
	if accepted.Load() != 1 {
		t.Fatalf("%d connections through the wrapped listener", accepted.Load())
	}
	if conn == nil || conn.LocalAddr().String() != s.Addr() {
		t.Fatalf("ConnContext gave the handler %v, want the connection to %s", conn, s.Addr())
	}
	cancel()
	select {
	case <-hook:
		t.Fatal("the hook ran before the server's requests ended")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if left := <-hook; left <= 0 || left > 2*time.Second {
		t.Fatalf("the hook got %s of grace", left)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A kept-alive connection left idle is closed once the idle timeout passes; one in use is not.
func TestIdleConnectionsAreClosed(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.SetIdleTimeout(300 * time.Millisecond)
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
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := []byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	buf := make([]byte, 4096)
	// Three requests 100 ms apart: each restarts the idle clock.
	for i := range 3 {
		if _, err := c.Write(req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
			t.Fatalf("request %d: %q %v", i, buf[:n], err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Then nothing: the server hangs up (EOF) well before the client's own bound.
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %q, %v; want the server to close it", buf[:n], err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("closed after %v", waited)
	}
}
