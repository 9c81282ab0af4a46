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
	"os"
	"sync"
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
// already ended, and the next answer unread).
func TestLoopShortStreams(t *testing.T) {
	r := newRig(t, fakellm.Options{Tokens: 3}, nil)
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
		if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != 5 { // max_tokens
			t.Fatalf("event %+v", ev)
		}
	}
	if got := r.p.loop.started.Load(); got != clients*each {
		t.Fatalf("%d streams relayed on the loop, want %d", got, clients*each)
	}
}

// TestLoopSlowClient: a client that does not read while its stream comes fills its socket;
// the loop hands the rest of the chunk to a goroutine, holds the upstream meanwhile, and the
// client gets every byte once it reads, the idle timeout not counting the wait.
func TestLoopSlowClient(t *testing.T) {
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.IdleTimeout = 2 * time.Second })
	hdr := map[string]string{"X-Fakellm-Tokens": "40000"} // ~7 MB: more than the sockets hold
	direct := call(t, r.fake.URL, chatPath, chatBody(true, ""), hdr)
	if direct.status != 200 || len(direct.body) < 5<<20 {
		t.Fatalf("direct: %d %v, %d bytes", direct.status, direct.err, len(direct.body))
	}
	conn, err := net.Dial("tcp", r.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Small, but not under the loopback MSS (64 KB), or the window never reopens past it.
	_ = conn.(*net.TCPConn).SetReadBuffer(256 << 10)
	body := chatBody(true, "")
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Fakellm-Tokens: 40000\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(body), body)
	// Longer than the idle timeout: the proxy waits for the client, not for the upstream.
	time.Sleep(3 * time.Second)
	if testutil.ToFloat64(r.p.m.clientWaits) == 0 {
		t.Fatal("the client's socket never filled: the test proves nothing")
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != string(direct.body) {
		t.Fatalf("%v: %d bytes, want the %d the upstream sent", err, len(got), len(direct.body))
	}
	if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != 40000 {
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
