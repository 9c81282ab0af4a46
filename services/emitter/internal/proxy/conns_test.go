package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// TestDetachedStreamsFreeTheirPlace: a connection the proxy took over for a stream holds its
// place under the connection limit while the stream lasts, given back or not, and frees it
// once when its socket is closed, however it ends: closed after the stream, closed by the
// client after being given back, cut by the client's hang-up, or closed waiting too long for
// a next request.
func TestDetachedStreamsFreeTheirPlace(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("streams are detached only on Linux")
	}
	limited := func(t *testing.T, upstream http.Handler) (*detachRig, *ops.ConnLimit) {
		up := httptest.NewServer(upstream)
		t.Cleanup(up.Close)
		p, cap, reg := newTestProxy(t, up.URL, func(c *Config) { c.ClientIdleTimeout = 300 * time.Millisecond })
		p.detachAfter, p.parkAfter = 30*time.Millisecond, 30*time.Millisecond
		conns := ops.NewConnLimit(10, "test", prometheus.NewRegistry())
		r := &detachRig{rig: &rig{fake: up, p: p, cap: cap, reg: reg}}
		r.proxy = serveProxy(t, p, func(ln net.Listener) net.Listener { return conns.HTTPListener(ln, "http") }, func(srv *http.Server) {
			srv.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateHijacked {
					r.hijacked.Add(1)
				}
			}
		})
		return r, conns
	}
	readStream := func(t *testing.T, r *detachRig, extra string) net.Conn {
		conn, _, resp := rawStream(t, r, extra)
		b, err := io.ReadAll(resp.Body)
		if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("stream: %v %q", err, b)
		}
		r.cap.next(t)
		if r.hijacked.Load() != 1 {
			t.Fatal("the stream was not detached")
		}
		return conn
	}

	t.Run("closed after the stream", func(t *testing.T) {
		r, conns := limited(t, fakellm.New(fakellm.Options{}))
		readStream(t, r, "Connection: close\r\n")
		waitFor(t, "place freed", func() bool { return conns.Open() == 0 })
	})
	t.Run("given back, then closed by the client", func(t *testing.T) {
		r, conns := limited(t, fakellm.New(fakellm.Options{}))
		conn := readStream(t, r, "")
		waitFor(t, "connection waiting for its next request", func() bool {
			r.p.ln.mu.Lock()
			defer r.p.ln.mu.Unlock()
			return len(r.p.ln.parked) == 1
		})
		if n := conns.Open(); n != 1 {
			t.Fatalf("%d places held by one connection given back, want 1", n)
		}
		conn.Close()
		waitFor(t, "place freed", func() bool { return conns.Open() == 0 })
	})
	t.Run("given back, then idle too long", func(t *testing.T) {
		r, conns := limited(t, fakellm.New(fakellm.Options{}))
		readStream(t, r, "")
		waitFor(t, "place freed", func() bool { return conns.Open() == 0 })
	})
	t.Run("client hangs up during the stream", func(t *testing.T) {
		up := stalling{done: make(chan error, 1)}
		r, conns := limited(t, up)
		conn, _, resp := rawStream(t, r, "")
		if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "stream parked", func() bool { return r.gauge(r.p.m.parked) == 1 })
		if n := conns.Open(); n != 1 {
			t.Fatalf("%d places held by one detached stream, want 1", n)
		}
		conn.Close()
		r.cap.next(t)
		waitFor(t, "place freed", func() bool { return conns.Open() == 0 })
	})
}
