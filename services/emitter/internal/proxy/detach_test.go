package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// detachRig is a proxy serving through its listener, as the emitter does, with streams
// detached and parked after a few milliseconds instead of half a second.
type detachRig struct {
	*rig
	accepted atomic.Int64 // connections the listener under the proxy's accepted
	hijacked atomic.Int64 // connections net/http let the proxy take over
}

func newDetachRig(t *testing.T, upstream http.Handler, tweak func(*Config)) *detachRig {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("streams are detached only on Linux")
	}
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	p, cap, reg := newTestProxy(t, up.URL, tweak)
	p.detachAfter, p.parkAfter = 30*time.Millisecond, 30*time.Millisecond
	r := &detachRig{rig: &rig{fake: up, p: p, cap: cap, reg: reg}}
	r.proxy = serveProxy(t, p, func(ln net.Listener) net.Listener { return countingListener{ln, &r.accepted} }, func(srv *http.Server) {
		srv.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateHijacked {
				r.hijacked.Add(1)
			}
		}
	})
	return r
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// waitFor polls cond for up to 30 s: a bound a loaded machine stays under, not a measure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30s", what)
		}
	}
}

// gauge reads one of the proxy's gauges.
func (r *detachRig) gauge(g prometheus.Gauge) float64 { return testutil.ToFloat64(g) }

// stalling is an upstream that sends the head of a stream and one token, then nothing until
// its request ends; it reports each request's end on done.
type stalling struct{ done chan error }

func (s stalling) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
	_ = http.NewResponseController(w).Flush()
	select {
	case <-r.Context().Done():
		s.done <- context.Cause(r.Context())
	case <-time.After(20 * time.Second): // a broken proxy must not hang the test's cleanup
	}
}

// TestDetachedClientHangsUp: a client that hangs up on a stream the proxy took over, parked
// or not, gets the event canceled, and the upstream request ends.
func TestDetachedClientHangsUp(t *testing.T) {
	for _, parked := range []bool{true, false} {
		t.Run(fmt.Sprintf("parked=%v", parked), func(t *testing.T) {
			up := stalling{done: make(chan error, 1)}
			var h http.Handler = up
			if !parked {
				// Tokens keep coming: the stream is detached for its age, never parked.
				h = fakellm.New(fakellm.Options{TPOT: 5 * time.Millisecond, Tokens: 100000})
			}
			r := newDetachRig(t, h, nil)
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.proxy.URL+chatPath, strings.NewReader(chatBody(true, "")))
			req.Header.Set("X-Fakellm-Tokens", "100000")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "stream detached", func() bool { return r.gauge(r.p.m.detached) == 1 })
			if parked {
				waitFor(t, "stream parked", func() bool { return r.gauge(r.p.m.parked) == 1 })
			}
			cancel()
			resp.Body.Close()
			ev := r.cap.next(t)
			if ev.Status != events.StatusCanceled || ev.ErrorCode != CodeClientGone {
				t.Fatalf("event %s %q, want canceled", ev.Status, ev.ErrorCode)
			}
			if parked {
				select {
				case <-up.done:
				case <-time.After(5 * time.Second):
					t.Fatal("the upstream request did not end")
				}
			}
			waitFor(t, "gauges back to 0", func() bool {
				return r.gauge(r.p.m.streams) == 0 && r.gauge(r.p.m.detached) == 0 && r.gauge(r.p.m.parked) == 0 && r.gauge(r.p.m.inflight) == 0
			})
		})
	}
}

// TestManyParkedStreamsHangUp: every one of many parked streams sees its client leave, after
// a garbage collection, and ends its upstream request.
func TestManyParkedStreamsHangUp(t *testing.T) {
	const n = 300
	up := stalling{done: make(chan error, n)}
	// Idle far longer than opening 300 streams can take on two busy cores under -race: with
	// the rig's 5 s, the first streams timed out before the last had parked.
	r := newDetachRig(t, up, func(c *Config) { c.IdleTimeout = time.Minute })
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.proxy.URL+chatPath, strings.NewReader(chatBody(true, "")))
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
				t.Error(err)
			}
			<-ctx.Done()
		})
	}
	start := time.Now()
	waitFor(t, "streams parked", func() bool {
		if time.Since(start) > 9*time.Second {
			t.Logf("parked %v, detached %v, streams %v", r.gauge(r.p.m.parked), r.gauge(r.p.m.detached), r.gauge(r.p.m.streams))
		}
		return t.Failed() || r.gauge(r.p.m.parked) == n
	})
	runtime.GC()
	cancel()
	wg.Wait()
	for i := range n {
		select {
		case <-up.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d upstream requests did not end; parked %v, detached %v", n-i, n, r.gauge(r.p.m.parked), r.gauge(r.p.m.detached))
		}
	}
	for range n {
		if ev := r.cap.next(t); ev.Status != events.StatusCanceled {
			t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
		}
	}
}

// slowChat asks the fake for n tokens, every 10 ms: a stream that outlives detachAfter.
func slowChat(n int) map[string]string {
	return map[string]string{"X-Fakellm-Tokens": fmt.Sprint(n), "X-Fakellm-TPOT": "10ms"}
}

// post sends a chat request on client and reads the whole answer.
func post(t *testing.T, client *http.Client, base string, hdr map[string]string) reply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+chatPath, strings.NewReader(chatBody(true, "")))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// TestDetachedKeepAlive: a stream the proxy takes over gives the client the upstream's bytes,
// the usage chunk it asked for stripped, and its connection serves the next requests, streamed
// or not, at once or after a pause.
func TestDetachedKeepAlive(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{}), nil)
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	hdr := slowChat(10) // 100 ms: detached after 30
	direct := post(t, http.DefaultClient, r.fake.URL, hdr)
	for i, pause := range []time.Duration{0, 0, 200 * time.Millisecond} {
		time.Sleep(pause)
		via := post(t, client, r.proxy.URL, hdr)
		if via.err != nil || via.status != 200 || string(via.body) != string(direct.body) {
			t.Fatalf("request %d: %d %v\n%s\nwant\n%s", i, via.status, via.err, via.body, direct.body)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != 10 || ev.TokensEstimated {
			t.Fatalf("request %d: event %+v", i, ev)
		}
		if got := testutil.ToFloat64(r.p.m.detaches); got != float64(i+1) {
			t.Fatalf("request %d: %v streams detached, want %d", i, got, i+1)
		}
	}
	// Not streamed: net/http answers on the connection it was given back.
	if via := call(t, r.proxy.URL, chatPath, chatBody(false, ""), nil); via.status != 200 {
		t.Fatalf("not streamed: %d %v", via.status, via.err)
	}
	r.cap.next(t)
	if n := r.accepted.Load(); n != 2 { // the kept-alive one, and call's own
		t.Fatalf("%d connections accepted, want 2", n)
	}
	waitFor(t, "gauges back to 0", func() bool { return r.gauge(r.p.m.detached) == 0 && r.gauge(r.p.m.streams) == 0 })
}

// TestShortStreamsStayWithNetHTTP: streams shorter than detachAfter are never taken over.
func TestShortStreamsStayWithNetHTTP(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{Tokens: 3}), nil)
	r.p.detachAfter, r.p.parkAfter = detachAfter, parkAfter
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for range 10 {
		if via := post(t, client, r.proxy.URL, nil); via.status != 200 || via.err != nil {
			t.Fatalf("%d %v", via.status, via.err)
		}
		r.cap.next(t)
	}
	if r.hijacked.Load() != 0 || testutil.ToFloat64(r.p.m.detaches) != 0 || r.accepted.Load() != 1 {
		t.Fatalf("%d hijacked, %v detached, %d connections", r.hijacked.Load(), testutil.ToFloat64(r.p.m.detaches), r.accepted.Load())
	}
}

// TestDetachedPipelined: a request sent right behind the one whose stream the proxy takes
// over, in the same write, is served after it, from the bytes net/http had read already.
func TestDetachedPipelined(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{}), nil)
	conn, err := net.Dial("tcp", r.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	stream, whole := chatBody(true, ""), chatBody(false, "")
	raw := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Fakellm-TPOT: 10ms\r\nX-Fakellm-Tokens: 10\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(stream), stream) +
		fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tokenscope-Turn: 2\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(whole), whole) +
		fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tokenscope-Turn: 3\r\nX-Fakellm-TPOT: 10ms\r\nX-Fakellm-Tokens: 10\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(stream), stream)
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for i, want := range []string{"data: [DONE]", `"object":"chat.completion"`, "data: [DONE]"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("answer %d: %d %v %q", i, resp.StatusCode, err, b)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.Turn != max(i+1, 0)*boolInt(i > 0) {
			t.Fatalf("answer %d: event %s turn %d", i, ev.Status, ev.Turn)
		}
	}
	if testutil.ToFloat64(r.p.m.detaches) != 2 || r.accepted.Load() != 1 {
		t.Fatalf("%v detached, %d connections", testutil.ToFloat64(r.p.m.detaches), r.accepted.Load())
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDetachedConnectionClose: a client that asked to close the connection gets it closed
// after its stream, as net/http would.
func TestDetachedConnectionClose(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{}), nil)
	conn, br, resp := rawStream(t, r, "Connection: close\r\n")
	b, err := io.ReadAll(resp.Body)
	if err != nil || !resp.Close || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("close %v, %v, %q", resp.Close, err, b)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the stream: %d bytes, %v; want the connection closed", n, err)
	}
	if r.hijacked.Load() != 1 {
		t.Fatal("the stream was not detached")
	}
	r.cap.next(t)
}

// TestDetachedIdleTimeout: a stream the proxy took over, parked, whose upstream falls silent
// for the idle timeout is cut: the client's connection breaks and the event says timeout.
func TestDetachedIdleTimeout(t *testing.T) {
	up := stalling{done: make(chan error, 1)}
	r := newDetachRig(t, up, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	start := time.Now()
	via := post(t, http.DefaultClient, r.proxy.URL, nil)
	if via.err == nil || !strings.Contains(string(via.body), `"content":"hi"`) {
		t.Fatalf("client got %q, %v; want the first event, then a broken stream", via.body, via.err)
	}
	ev := r.cap.next(t)
	if ev.Status != events.StatusTimeout || ev.ErrorCode != CodeStreamIdle {
		t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Fatalf("cut after %s, want the idle timeout", d)
	}
	if testutil.ToFloat64(r.p.m.detaches) != 1 {
		t.Fatal("the stream was not detached")
	}
	select {
	case <-up.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request did not end")
	}
}

// TestDetachedUpstreamBreaksOff: an upstream that breaks off a stream the proxy took over
// breaks the client's connection too, as a direct call would.
func TestDetachedUpstreamBreaksOff(t *testing.T) {
	r := newDetachRig(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		_ = http.NewResponseController(w).Flush()
		time.Sleep(100 * time.Millisecond) // parked by then
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	}), nil)
	via := post(t, http.DefaultClient, r.proxy.URL, nil)
	if via.err == nil {
		t.Fatalf("client got a whole answer: %q", via.body)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusError || ev.ErrorCode != CodeUpstreamDisconnect {
		t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
	}
}

// TestDrainDetached: at shutdown, Drain waits for the streams the proxy took over, and cuts
// those still open when its context ends, each with its event.
func TestDrainDetached(t *testing.T) {
	t.Run("ends within the grace", func(t *testing.T) {
		r := newDetachRig(t, fakellm.New(fakellm.Options{}), nil)
		got := make(chan reply, 1)
		go func() { got <- post(t, http.DefaultClient, r.proxy.URL, slowChat(30)) }()
		waitFor(t, "stream detached", func() bool { return r.gauge(r.p.m.detached) == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.proxy.Config.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.p.Drain(ctx); err != nil {
			t.Fatalf("drain: %v", err)
		}
		if n := r.gauge(r.p.m.detached); n != 0 {
			t.Fatalf("Drain returned with %v streams open", n)
		}
		if via := <-got; via.err != nil || !strings.HasSuffix(string(via.body), "data: [DONE]\n\n") {
			t.Fatalf("client got %q, %v", via.body, via.err)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusOK {
			t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
		}
	})
	t.Run("cut when the grace ends", func(t *testing.T) {
		up := stalling{done: make(chan error, 1)}
		r := newDetachRig(t, up, nil)
		got := make(chan reply, 1)
		go func() { got <- post(t, http.DefaultClient, r.proxy.URL, nil) }()
		waitFor(t, "stream parked", func() bool { return r.gauge(r.p.m.parked) == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := r.proxy.Config.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.p.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("drain: %v, want the deadline", err)
		}
		if via := <-got; via.err == nil {
			t.Fatalf("client got a whole answer: %q", via.body)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusError || ev.ErrorCode != CodeShutdown {
			t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
		}
		select {
		case <-up.done:
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream request did not end")
		}
	})
}

// TestListenerClosesWaitingConnections: a connection given back, waiting for the client's
// next request, is closed when the server shuts down, as net/http closes its idle ones.
func TestListenerClosesWaitingConnections(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{}), nil)
	conn, br, resp := rawStream(t, r, "")
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	r.cap.next(t)
	waitFor(t, "connection waiting in the watcher", func() bool {
		r.p.ln.mu.Lock()
		defer r.p.ln.mu.Unlock()
		return len(r.p.ln.parked) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.proxy.Config.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("%d bytes, %v; want the connection closed", n, err)
	}
}

// TestHTTP2NotDetached: HTTP/2 cannot be hijacked: its streams stay with net/http, over TLS or
// in clear text (h2c), and are relayed as before; so do HTTP/1.1 streams over TLS, which the
// watcher cannot watch.
func TestHTTP2NotDetached(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tls, http2 bool
	}{{"h2", true, true}, {"h2c", false, true}, {"HTTP/1.1 over TLS", true, false}} {
		tls := tc.tls
		t.Run(tc.name, func(t *testing.T) {
			if runtime.GOOS != "linux" {
				t.Skip("streams are detached only on Linux")
			}
			fake := httptest.NewServer(fakellm.New(fakellm.Options{}))
			defer fake.Close()
			u, _ := ParseUpstream(fake.URL)
			cap := newCapture(t)
			p := New(Config{Upstream: u, UpstreamTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second,
				DefaultScene: "default", DefaultEnv: "test", MaxParseBytes: 1 << 20, MaxLabels: 10},
				cap, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
			p.detachAfter, p.parkAfter = 30*time.Millisecond, 30*time.Millisecond
			defer p.Close()
			mux := http.NewServeMux()
			p.Register(mux)
			srv := httptest.NewUnstartedServer(mux)
			srv.Listener = p.Listener(srv.Listener)
			srv.Config.ConnContext = p.ConnContext
			var client *http.Client
			if tls {
				srv.EnableHTTP2 = tc.http2
				srv.StartTLS()
				client = srv.Client()
			} else {
				srv.Config.Protocols = new(http.Protocols)
				srv.Config.Protocols.SetHTTP1(true)
				srv.Config.Protocols.SetUnencryptedHTTP2(true)
				srv.Start()
				tr := &http.Transport{Protocols: new(http.Protocols)}
				tr.Protocols.SetUnencryptedHTTP2(true)
				client = &http.Client{Transport: tr}
			}
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+chatPath, strings.NewReader(chatBody(true, "")))
			req.Header.Set("X-Fakellm-TPOT", "20ms")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || (resp.ProtoMajor == 2) != tc.http2 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("%s %v %q", resp.Proto, err, b)
			}
			if ev := cap.next(t); ev.Status != events.StatusOK || ev.TotalMs < 80 {
				t.Fatalf("event %s total %.0f ms", ev.Status, ev.TotalMs)
			}
			if n := testutil.ToFloat64(p.m.detaches); n != 0 {
				t.Fatalf("%v streams detached", n)
			}
		})
	}
}

// rawStream writes one streaming request of ten tokens, 10 ms apart, with extra header lines,
// on a new connection to the rig's proxy, and reads the response head.
func rawStream(t *testing.T, r *detachRig, extra string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", r.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := chatBody(true, "")
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\n%sX-Fakellm-TPOT: 10ms\r\nX-Fakellm-Tokens: 10\r\nContent-Length: %d\r\n\r\n%s", chatPath, extra, len(body), body)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}
