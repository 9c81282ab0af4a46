//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// TestLoopShortStreams: many short streams at once, each over a kept-alive connection that
// serves the next right after, all relayed by the loop, each whole and measured. The upstream
// answers at once, so the stream's bytes often come with its head or between the head and
// the loop taking the stream over (a race that once left a connection's events to a stream
// already ended, and the next answer unread). The upstream connections are spread over the
// proxy's three loops, and each relays its share.
func TestLoopShortStreams(t *testing.T) {
	r := newRig(t, fakellm.Options{Tokens: 3}, func(c *Config) { c.Loops = 3 })
	direct := call(t, r.fake.URL, chatPath, chatBody(true, ""), nil)
	if direct.status != 200 {
		t.Fatalf("direct: %d %v", direct.status, direct.err)
	}
	const clients, each = 8, 25
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for range clients {
		wg.Go(func() {
			for range each {
				via := post(t, client, r.proxy.URL, nil)
				if via.err != nil || via.status != 200 || string(via.body) != string(direct.body) {
					errs <- fmt.Errorf("%d %v\n%s", via.status, via.err, via.body)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for range clients * each {
		if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != 3 { // the fake's length, under max_tokens
			t.Fatalf("event %+v", ev)
		}
	}
	if got := r.p.loops.started(); got != clients*each {
		t.Fatalf("%d streams relayed on the loops, want %d", got, clients*each)
	}
	for i, l := range r.p.loops.ls {
		if l.started.Load() == 0 {
			t.Fatalf("loop %d of %d relayed no stream", i+1, len(r.p.loops.ls))
		}
	}
}

// TestLoopSlowClient: a client that does not read while its stream comes fills its socket;
// the loop hands the rest of the chunk to a goroutine, holds the upstream meanwhile, and the
// client gets every byte once it reads, the idle timeout not counting the wait.
func TestLoopSlowClient(t *testing.T) {
	const idle = 3 * time.Second // well over what a loaded machine may hold up a goroutine
	fake := httptest.NewServer(fakellm.New(fakellm.Options{}))
	t.Cleanup(fake.Close)
	p, cap, _ := newTestProxy(t, fake.URL+"/v1", func(c *Config) { c.IdleTimeout = idle })
	// The proxy's socket to the client buffers little, so the client's fills soon.
	srv := serveProxy(t, p, func(ln net.Listener) net.Listener { return acceptedConns{ln, 64 << 10, nil} }, nil)
	hdr := map[string]string{"X-Fakellm-Tokens": "10000"} // ~1.7 MB: more than the sockets hold
	direct := call(t, fake.URL, chatPath, chatBody(true, ""), hdr)
	if direct.status != 200 || len(direct.body) < 1<<20 {
		t.Fatalf("direct: %d %v, %d bytes", direct.status, direct.err, len(direct.body))
	}
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Small, but not under the loopback MSS (64 KB), or the window never reopens past it.
	_ = conn.(*net.TCPConn).SetReadBuffer(256 << 10)
	body := chatBody(true, "")
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Fakellm-Tokens: 10000\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(body), body)
	// Once the client's socket is full, the loop hands the chunk to a goroutine, which waits
	// for the client longer than the idle timeout: the proxy waits for the client, not for the
	// upstream.
	waitFor(t, "the client's socket fills", func() bool { return testutil.ToFloat64(p.m.clientWaits) > 0 })
	time.Sleep(idle + time.Second)
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for a loaded machine
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != string(direct.body) {
		t.Fatalf("%v: %d bytes, want the %d the upstream sent", err, len(got), len(direct.body))
	}
	if ev := cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != 10000 {
		t.Fatalf("event %+v", ev)
	}
}

// TestLoopConn: an upstream connection on the loop is a net.Conn: reads wait for bytes, a
// deadline or Close wakes a read waiting, the peer's close reads as EOF, and closing takes the
// descriptor off the loop.
func TestLoopConn(t *testing.T) {
	l, err := newLoop(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, peer := adoptedPair(t, l, ln)
	if _, ok := c.(*loopConn); !ok {
		t.Fatalf("adopted as %T", c)
	}

	// A read waits for the bytes.
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = peer.Write([]byte("hello"))
	}()
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if _, err := c.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	if n, err := io.ReadFull(peer, buf[:5]); err != nil || string(buf[:n]) != "world" {
		t.Fatalf("peer read %q %v", buf[:n], err)
	}

	// A deadline set while a read waits wakes it.
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_ = c.SetReadDeadline(time.Now())
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after the deadline: %v", err)
	}
	_ = c.SetReadDeadline(time.Time{})

	// The peer's close reads as EOF.
	_ = peer.Close()
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("read after the peer closed: %v", err)
	}

	// Close wakes a read waiting on another connection, and leaves the loop.
	c2, _ := adoptedPair(t, l, ln)
	go func() {
		_, err := c2.Read(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_ = c2.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	_ = c.Close()
	l.mu.Lock()
	left := len(l.conns)
	l.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d connections left on the loop", left)
	}
}

// adoptedPair dials ln, has l adopt the connection, and returns it and the accepted peer, which
// is closed when the test ends.
func adoptedPair(t *testing.T, l *evloop, ln net.Listener) (c, peer net.Conn) {
	t.Helper()
	peers := make(chan net.Conn, 1)
	go func() {
		p, err := ln.Accept()
		if err == nil {
			peers <- p
		}
		close(peers)
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c, err = l.adopt(nc); err != nil {
		t.Fatal(err)
	}
	peer = <-peers
	if peer == nil {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// rawUpstream is an upstream that reads each request and then lets serve answer on the
// connection as it likes.
func rawUpstream(t *testing.T, serve func(c *net.TCPConn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					c.Close()
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/v1"
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"

// corkAndClose sends p and the connection's end in one segment: the loop's event for the
// bytes is the only one the end brings.
func corkAndClose(c *net.TCPConn, p string) {
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 1) })
	}
	_, _ = io.WriteString(c, p)
	_ = c.Close()
}

// TestLoopUpstreamEndsWithItsLastBytes: an upstream's end that comes in the same segment as its
// last bytes ends the stream at once, as a body read to the connection's end (ok) or as a
// chunked body cut short (error, upstream_disconnect); not by the idle timeout.
func TestLoopUpstreamEndsWithItsLastBytes(t *testing.T) {
	for _, tc := range []struct {
		name, head, body string
		status           events.Status
		code             string
	}{
		{"read to the end", sseHead + "Connection: close\r\n\r\n", sseEvent("hi") + "data: [DONE]\n\n", events.StatusOK, ""},
		{"chunked, cut", sseHead + "Transfer-Encoding: chunked\r\n\r\n", fmt.Sprintf("%x\r\n%s", len(sseEvent("hi"))+10, sseEvent("hi")), events.StatusError, CodeUpstreamDisconnect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := rawUpstream(t, func(c *net.TCPConn) {
				_, _ = io.WriteString(c, tc.head)
				time.Sleep(100 * time.Millisecond) // the head first: the loop takes the stream
				corkAndClose(c, tc.body)
			})
			// The idle timeout is well past the bound on the stream's end.
			p, cap, _ := newTestProxy(t, up, func(c *Config) { c.IdleTimeout = 10 * time.Second })
			srv := serveProxy(t, p, nil, nil)
			start := time.Now()
			call(t, srv.URL, chatPath, chatBody(true, ""), nil)
			ev := cap.next(t)
			if took := time.Since(start); took > 5*time.Second || ev.Status != tc.status || ev.ErrorCode != tc.code {
				t.Fatalf("after %s: event %s %q, want %s %q", took, ev.Status, ev.ErrorCode, tc.status, tc.code)
			}
			if p.loops.started() != 1 {
				t.Fatal("the stream did not go through the loop")
			}
		})
	}
}

// smallSendBuffer accepts connections whose socket takes little at a time.
type smallSendBuffer struct{ net.Listener }

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		_ = c.(*net.TCPConn).SetWriteBuffer(8 << 10)
	}
	return c, err
}

// TestLoopSlowLastChunk: when the piece that ends the body is the one the client's socket does
// not take at once, the stream ends once the goroutine has written it, with no more bytes or
// events to come from the kept-alive upstream.
func TestLoopSlowLastChunk(t *testing.T) {
	ev := sseEvent(strings.Repeat("x", 50000)) + "data: [DONE]\n\n"
	body := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(ev), ev)
	up := rawUpstream(t, func(c *net.TCPConn) {
		_, _ = io.WriteString(c, sseHead+"Transfer-Encoding: chunked\r\n\r\n")
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(c, body)
		time.Sleep(20 * time.Second) // kept alive: nothing more comes
		_ = c.Close()
	})
	// The idle timeout, and the upstream's silence, are well past the bound on the stream's end.
	p, cap, _ := newTestProxy(t, up, func(c *Config) { c.IdleTimeout = 10 * time.Second })
	srv := serveProxy(t, p, func(ln net.Listener) net.Listener { return smallSendBuffer{ln} }, nil)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(16 << 10)
	rb := chatBody(true, `,"stream_options":{"include_usage":true}`)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(rb), rb)
	// The loop's write of the piece goes partial.
	waitFor(t, "the client's socket fills", func() bool { return testutil.ToFloat64(p.m.clientWaits) > 0 })
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != ev {
		t.Fatalf("%v: %d bytes, want the upstream's %d", err, len(got), len(ev))
	}
	if e := cap.next(t); time.Since(start) > 5*time.Second || e.Status != events.StatusOK {
		t.Fatalf("after %s: event %s %q", time.Since(start), e.Status, e.ErrorCode)
	}
}

// TestLoopOutlivesClose: closed, the loop stays until its last connection is closed, so that
// what that Close posts never goes to a descriptor the loop no longer owns.
func TestLoopOutlivesClose(t *testing.T) {
	l, err := newLoop(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, _ := adoptedPair(t, l, ln)
	l.close()
	time.Sleep(50 * time.Millisecond)
	if _, err := fcntl(l.wake, syscall.F_GETFD); err != nil {
		t.Fatalf("the loop closed its eventfd with a connection open: %v", err)
	}
	_ = c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		stopped := l.stopped
		l.mu.Unlock()
		if stopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the loop did not stop after its last connection closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.post(func() { t.Error("ran after the loop stopped") }) // dropped, and written nowhere
}

func fcntl(fd, cmd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}
