package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// scripted is an upstream that reads each request and answers with answer(n), n counting
// all its requests from 0; a nil answer closes the connection unanswered, as does hangUp
// after the answer.
type scripted struct {
	ln     net.Listener
	conns  atomic.Int64
	reqs   atomic.Int64
	closed chan int // the number of each connection whose other end (the proxy) closed it
}

func newScripted(t *testing.T, answer func(n int) (a []byte, hangUp bool)) *scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{ln: ln, closed: make(chan int, 64)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			id := int(s.conns.Add(1))
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						if errors.Is(err, io.EOF) {
							s.closed <- id
						}
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					a, hangUp := answer(int(s.reqs.Add(1) - 1))
					if a == nil {
						return
					}
					if _, err := c.Write(a); err != nil || hangUp {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *scripted) url() string { return "http://" + s.ln.Addr().String() + "/v1/chat/completions" }

func h1Request(t *testing.T, ctx context.Context, u string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// TestH1Framing: how the client reads each framing of a response, and whether the
// connection serves the next request (as http.Transport would, or more cautiously).
func TestH1Framing(t *testing.T) {
	cases := []struct {
		name   string
		answer string
		body   string
		err    bool
		reuse  bool // the second request goes on the same connection
		hangUp bool // the upstream closes the connection after the answer
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", "abc", false, true, false},
		{"chunked with extensions and trailers", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n", "abcde", false, true, false},
		{"neither: read to EOF", "HTTP/1.1 200 OK\r\n\r\nabc", "abc", false, false, true},
		{"1xx first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", "x", false, true, false},
		{"204", "HTTP/1.1 204 No Content\r\n\r\n", "", false, true, false},
		{"204 with a stray body", "HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\nabc", "", false, false, false},
		{"304", "HTTP/1.1 304 Not Modified\r\n\r\n", "", false, true, false},
		{"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", "x", false, false, false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", "x", false, false, false},
		{"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx", "x", false, true, false},
		{"HTTP/1.0 chunked is not chunked", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", "1\r\nx\r\n0\r\n\r\n", false, false, true},
		{"duplicate Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy", "", true, false, false},
		{"invalid Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", "", true, false, false},
		{"unknown transfer coding", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", "", true, false, false},
		// As net/http: chunked wins; what the Content-Length framing would leave is not
		// taken for the next answer.
		{"Content-Length and chunked", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad", "x", false, false, false},
		{"101 unasked", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n", "", true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newScripted(t, func(n int) ([]byte, bool) {
				if n == 0 {
					return []byte(tc.answer), tc.hangUp
				}
				return []byte(okAnswer), false
			})
			c := newH1(4, time.Minute)
			defer c.closeIdle(true)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			got, err := roundTripAll(c, h1Request(t, ctx, up.url()))
			if (err != nil) != tc.err || (!tc.err && got != tc.body) {
				t.Fatalf("got %q, %v", got, err)
			}
			got, err = roundTripAll(c, h1Request(t, ctx, up.url()))
			if err != nil || got != "ok" {
				t.Fatalf("second request: %q, %v", got, err)
			}
			if n := up.conns.Load(); (n == 1) != tc.reuse {
				t.Fatalf("%d connections for two requests, reuse %v", n, tc.reuse)
			}
		})
	}
}

func roundTripAll(c *h1, req *http.Request) (string, error) {
	resp, err := c.roundTrip(req, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestH1ResponseHeadersBounded: response headers past the limit, in one response or in
// endless 1xx ones, end the exchange with an error instead of filling the memory.
func TestH1ResponseHeadersBounded(t *testing.T) {
	big := "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\nContent-Length: 1\r\n\r\nx"
	endless := strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 1000)
	for name, answer := range map[string]string{"one big header": big, "endless 1xx": endless} {
		t.Run(name, func(t *testing.T) {
			up := newScripted(t, func(int) ([]byte, bool) { return []byte(answer), false })
			c := newH1(4, time.Minute)
			c.maxHeader = 4 << 10
			defer c.closeIdle(true)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := roundTripAll(c, h1Request(t, ctx, up.url()))
			if !errors.Is(err, errHeadersTooBig) {
				t.Fatalf("got %v, want %v", err, errHeadersTooBig)
			}
		})
	}
	// Under the limit, the same client reads it.
	up := newScripted(t, func(int) ([]byte, bool) { return []byte(big), false })
	c := newH1(4, time.Minute)
	c.maxHeader = 16 << 10
	defer c.closeIdle(true)
	if got, err := roundTripAll(c, h1Request(t, context.Background(), up.url())); err != nil || got != "x" {
		t.Fatalf("under the limit: %q %v", got, err)
	}
}

// TestH1IdleConnsSwept: idle connections are closed after the idle timeout, and as soon as
// the upstream closes them, without waiting for a request to take them.
func TestH1IdleConnsSwept(t *testing.T) {
	t.Run("idle timeout", func(t *testing.T) {
		up := newScripted(t, func(int) ([]byte, bool) { return []byte(okAnswer), false })
		c := newH1(4, 200*time.Millisecond)
		defer c.closeIdle(true)
		if got, err := roundTripAll(c, h1Request(t, context.Background(), up.url())); err != nil || got != "ok" {
			t.Fatalf("%q %v", got, err)
		}
		select {
		case <-up.closed:
		case <-time.After(3 * time.Second):
			t.Fatal("the idle connection is still open 3 s after its 200 ms idle timeout")
		}
	})
	t.Run("closed by the upstream", func(t *testing.T) {
		up := newScripted(t, func(int) ([]byte, bool) { return []byte(okAnswer), true })
		c := newH1(4, time.Minute)
		c.sweepEvery = 50 * time.Millisecond
		defer c.closeIdle(true)
		if got, err := roundTripAll(c, h1Request(t, context.Background(), up.url())); err != nil || got != "ok" {
			t.Fatalf("%q %v", got, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for c.idleCount() > 0 {
			if time.Now().After(deadline) {
				t.Fatal("a connection the upstream closed is still in the pool after 30 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func (c *h1) idleCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.idle {
		n += len(l)
	}
	return n
}

// TestH1NoHeaderInjection: a header name or value, or a target, that could end a line is
// refused, as http.Transport refuses it, and nothing is sent.
func TestH1NoHeaderInjection(t *testing.T) {
	up := newScripted(t, func(int) ([]byte, bool) { return []byte(okAnswer), false })
	c := newH1(4, time.Minute)
	defer c.closeIdle(true)
	for name, tweak := range map[string]func(*http.Request){
		"CRLF in a value": func(r *http.Request) { r.Header["X-A"] = []string{"a\r\nX-Injected: 1"} },
		"LF in a value":   func(r *http.Request) { r.Header["X-A"] = []string{"a\nX-Injected: 1"} },
		"NUL in a value":  func(r *http.Request) { r.Header["X-A"] = []string{"a\x00b"} },
		"CRLF in a name":  func(r *http.Request) { r.Header["X-A\r\nX-Injected"] = []string{"1"} },
		"colon in a name": func(r *http.Request) { r.Header["X-A: 1\r\nX"] = []string{"1"} },
		"space in a name": func(r *http.Request) { r.Header["X A"] = []string{"1"} },
		"CRLF in the query": func(r *http.Request) {
			r.URL.RawQuery = "a=1 HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /x"
		},
	} {
		req := h1Request(t, context.Background(), up.url())
		tweak(req)
		if _, err := c.roundTrip(req, nil); err == nil {
			t.Errorf("%s: sent", name)
		}
	}
	if n := up.reqs.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
	req := h1Request(t, context.Background(), up.url())
	req.Header["X-Tab"] = []string{"a\tb"}
	req.Header["X-Utf8"] = []string{"é"}
	if got, err := roundTripAll(c, req); err != nil || got != "ok" {
		t.Fatalf("valid headers: %q %v", got, err)
	}
}

// TestH1BodyErrorIsSticky: once a body broke off, every later read says so; an early end does
// not turn into a clean one.
func TestH1BodyErrorIsSticky(t *testing.T) {
	up := newScripted(t, func(int) ([]byte, bool) {
		return []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"), true
	})
	c := newH1(4, time.Minute)
	defer c.closeIdle(true)
	resp, err := c.roundTrip(h1Request(t, context.Background(), up.url()), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); string(b) != "ab" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("%q %v", b, err)
	}
	if _, err := resp.Body.Read(make([]byte, 8)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read after the error: %v", err)
	}
	resp.Body.Close()
	if c.idleCount() != 0 {
		t.Fatal("a connection whose body broke off went back to the pool")
	}
}

// TestHopByHopNotForwarded: the connection's own headers, and those Connection names, stay
// with the client's connection; the upstream gets its own Host.
func TestHopByHopNotForwarded(t *testing.T) { bothClients(t, testHopByHopNotForwarded) }

func testHopByHopNotForwarded(t *testing.T, transport bool) {
	type seen struct {
		host   string
		header http.Header
	}
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- seen{r.Host, r.Header.Clone()}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	if transport {
		r.viaTransport()
	}
	body := chatBody(false, "")
	nc, err := net.Dial("tcp", strings.TrimPrefix(r.proxy.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "POST %s HTTP/1.1\r\nHost: proxy.example\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\n"+
		"Proxy-Authorization: Basic abc\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n"+
		"Upgrade: websocket\r\nTrailer: X-T\r\nX-Keep: yes\r\n\r\n%s", chatPath, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := <-got
	for _, h := range []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te", "Upgrade", "Trailer"} {
		if v, ok := s.header[h]; ok {
			t.Errorf("%s forwarded: %q", h, v)
		}
	}
	if s.header.Get("X-Keep") != "yes" || s.host != u.Host {
		t.Fatalf("host %q, headers %v", s.host, s.header)
	}
	r.cap.next(t)
}

// TestNoLeakAfterHangUps: streams the client hangs up on leave no goroutine and no upstream
// connection behind.
func TestNoLeakAfterHangUps(t *testing.T) {
	fake := httptest.NewUnstartedServer(fakellm.New(fakellm.Options{TTFT: 10 * time.Millisecond, TPOT: 20 * time.Millisecond, Tokens: 200}))
	upConns := make(chan struct{}, 64)
	fake.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed || s == http.StateHijacked {
			upConns <- struct{}{}
		}
	}
	fake.Start()
	defer fake.Close()
	u, _ := ParseUpstream(fake.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	stream := func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.proxy.URL+chatPath, strings.NewReader(chatBody(true, "")))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := resp.Body.Read(make([]byte, 256)); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
		r.cap.next(t)
	}
	stream() // warm up: the servers' and clients' own goroutines
	<-upConns
	base := runtime.NumGoroutine()
	const n = 8
	for range n {
		stream()
	}
	for i := range n {
		select {
		case <-upConns:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d upstream connections still open", n-i, n)
		}
	}
	if r.p.h1.idleCount() != 0 {
		t.Fatal("a connection the client hung up on went back to the pool")
	}
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the streams\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
