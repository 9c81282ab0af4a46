package proxy

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestDrainCutsWhatNetHTTPHolds: the requests still open when the shutdown grace runs out get
// their events before Drain returns, as the streams taken off net/http do (TestDrainDetached),
// whatever holds them: net/http's Shutdown gives up on its own handlers then, and the
// publisher stops after Drain, so an event that came later would be lost. Here a gzip stream
// (which never leaves net/http) and a request whose upstream has not answered yet.
func TestDrainCutsWhatNetHTTPHolds(t *testing.T) { bothClients(t, testDrainCutsWhatNetHTTPHolds) }

func testDrainCutsWhatNetHTTPHolds(t *testing.T, transport bool) {
	for _, tc := range []struct {
		name   string
		stream bool
		status int // the client's
	}{{"gzip stream", true, http.StatusOK}, {"waiting for its answer", false, http.StatusServiceUnavailable}} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{}, 1)
			ended := make(chan struct{}, 1)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				got <- struct{}{}
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
					w.Header().Set("Content-Encoding", "gzip")
					zw := gzip.NewWriter(w)
					_, _ = io.WriteString(zw, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
					_ = zw.Flush()
					_ = http.NewResponseController(w).Flush()
				}
				select {
				case <-r.Context().Done():
					ended <- struct{}{}
				case <-time.After(20 * time.Second): // a broken proxy must not hang the test
				}
			}))
			t.Cleanup(up.Close)
			p, cap, _ := newTestProxy(t, up.URL, func(c *Config) { c.UpstreamTimeout, c.IdleTimeout = time.Minute, time.Minute })
			if transport {
				for u := range p.dialable {
					p.dialable[u] = false
				}
			}
			srv := serveProxy(t, p, nil, nil)
			type answer struct {
				status int
				err    error // reading the body
			}
			status := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+chatPath, strings.NewReader(chatBody(tc.stream, "")))
				req.Header.Set("Accept-Encoding", "gzip")
				resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
				if err != nil {
					status <- answer{err: err}
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status <- answer{resp.StatusCode, err}
			}()
			<-got
			if tc.stream {
				waitFor(t, "stream open", func() bool { return testutil.ToFloat64(p.m.streams) == 1 })
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if err := srv.Config.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("shutdown: %v, want the deadline (the request held)", err)
			}
			if err := p.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("drain: %v, want the deadline", err)
			}
			cap.mu.Lock()
			evs := append([]events.RequestEvent(nil), cap.evs...)
			cap.mu.Unlock()
			if len(evs) != 1 || evs[0].Status != events.StatusError || evs[0].ErrorCode != CodeShutdown {
				t.Fatalf("events when Drain returned: %+v, want one, error %s", evs, CodeShutdown)
			}
			select {
			case <-ended:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream request did not end")
			}
			// The stream breaks off, as any cut stream does; a request not answered yet gets 503.
			if a := <-status; a.status != tc.status || (a.err == nil) != !tc.stream {
				t.Fatalf("client got %d, %v; want %d, the body cut short %v", a.status, a.err, tc.status, tc.stream)
			}
		})
	}
}

// TestDrainUnblocksAStalledClient: a stream whose client stopped reading, the proxy blocked
// writing to it, gets its event before Drain returns too: the cut ends the write.
func TestDrainUnblocksAStalledClient(t *testing.T) {
	var written atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		ev := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 16<<10) + "\"}}]}\n\n"
		rc := http.NewResponseController(w)
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, ev); err != nil || rc.Flush() != nil {
				return
			}
			written.Add(int64(len(ev)))
		}
	}))
	t.Cleanup(up.Close)
	p, cap, _ := newTestProxy(t, up.URL, func(c *Config) { c.UpstreamTimeout, c.IdleTimeout = time.Minute, time.Minute })
	// Served without the proxy's listener: the stream stays with net/http.
	mux := http.NewServeMux()
	p.Register(mux)
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnContext = p.ConnContext
	srv.Start()
	t.Cleanup(func() { srv.Close(); p.Close() })
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := chatBody(true, "")
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(body), body)
	// The client reads nothing: the upstream's writes stop once every buffer between is full.
	for last := int64(-1); ; time.Sleep(300 * time.Millisecond) {
		n := written.Load()
		if n > 0 && n == last {
			break
		}
		last = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := srv.Config.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown: %v, want the deadline (the stream held)", err)
	}
	if err := p.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain: %v, want the deadline", err)
	}
	cap.mu.Lock()
	evs := append([]events.RequestEvent(nil), cap.evs...)
	cap.mu.Unlock()
	if len(evs) != 1 || evs[0].Status != events.StatusError || evs[0].ErrorCode != CodeShutdown {
		t.Fatalf("events when Drain returned: %d, want one, error %s", len(evs), CodeShutdown)
	}
}
