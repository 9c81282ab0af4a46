package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// TestBodiesShareAMemoryBudget: request bodies held in memory until their upstream answers
// share EMITTER_MAX_PARSE_MEMORY. A body that does not fit beside those held is forwarded
// unread, byte for byte, and counted; once the upstream has answered the memory is back.
func TestBodiesShareAMemoryBudget(t *testing.T) {
	bothClients(t, func(t *testing.T, transport bool) {
		fake := fakellm.New(fakellm.Options{Tokens: 2})
		hold := make(chan struct{})
		holding := make(chan struct{}, 1)
		got := make(chan []byte, 4)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			got <- body
			if r.Header.Get("X-Test-Hold") != "" {
				holding <- struct{}{}
				<-hold
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			fake.ServeHTTP(w, r)
		}))
		defer up.Close()
		p, cap, _ := newTestProxy(t, up.URL+"/v1", func(c *Config) { c.MaxParseBytes = 32 << 10; c.Budget = reqbody.NewBudget(40<<10, nil) })
		r := &rig{proxy: serveProxy(t, p, nil, nil), p: p, cap: cap}
		if transport {
			r.viaTransport()
		}
		body := `{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("w", 30<<10) + `"}]}`

		first := make(chan reply, 1)
		go func() { first <- call(t, r.proxy.URL, chatPath, body, map[string]string{"X-Test-Hold": "1"}) }()
		<-holding // the first body is held: the upstream has not answered
		<-got
		if held := p.cfg.Budget.Held(); held < 30<<10 {
			t.Fatalf("%d bytes held while a 30 KiB body waits for its upstream", held)
		}

		// No room beside it: forwarded unread, whole.
		if via := call(t, r.proxy.URL, chatPath, body, nil); via.status != 200 {
			t.Fatalf("second: %d %v", via.status, via.err)
		}
		if sent := <-got; string(sent) != body {
			t.Fatalf("the upstream got %d bytes, want the client's %d", len(sent), len(body))
		}
		if ev := cap.next(t); ev.Model != unknownModel || ev.Status != events.StatusOK {
			t.Fatalf("second event %+v", ev)
		}
		if n, refused := testutil.ToFloat64(p.m.unparsed.WithLabelValues(unparsedMemory)), testutil.ToFloat64(p.refused); n != 1 || refused != 1 {
			t.Fatalf("unparsed{memory} = %v, request_bodies_refused{route=\"proxy\"} = %v, want 1", n, refused)
		}

		close(hold)
		if via := <-first; via.status != 200 {
			t.Fatalf("first: %d %v", via.status, via.err)
		}
		if ev := cap.next(t); ev.Model != "gpt-4o" {
			t.Fatalf("first event %+v", ev)
		}
		if held := p.cfg.Budget.Held(); held != 0 {
			t.Fatalf("%d bytes held once every upstream answered", held)
		}
		// The memory is back: the next body is read.
		if via := call(t, r.proxy.URL, chatPath, body, nil); via.status != 200 {
			t.Fatalf("third: %d %v", via.status, via.err)
		}
		<-got
		if ev := cap.next(t); ev.Model != "gpt-4o" {
			t.Fatalf("third event %+v", ev)
		}
		if n := testutil.ToFloat64(p.m.unparsed.WithLabelValues(unparsedMemory)); n != 1 {
			t.Fatalf("unparsed{memory} = %v, want still 1", n)
		}
	})
}

// TestBodyBudgetReleasedOnEveryPath: a body whose client breaks off, one over the parse limit
// and one whose upstream cannot be reached all give their memory back.
func TestBodyBudgetReleasedOnEveryPath(t *testing.T) {
	r := newRig(t, fakellm.Options{Tokens: 2}, func(c *Config) { c.MaxParseBytes = 4 << 10 })
	// Over the parse limit, with and without a length.
	big := `{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("w", 8<<10) + `"}]}`
	if via := call(t, r.proxy.URL, chatPath, big, nil); via.status != 200 {
		t.Fatalf("big: %d", via.status)
	}
	r.cap.next(t)
	req, _ := http.NewRequest(http.MethodPost, r.proxy.URL+chatPath, io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.cap.next(t)
	if n := testutil.ToFloat64(r.p.m.unparsed.WithLabelValues(unparsedTooLarge)); n != 2 {
		t.Fatalf("unparsed{too_large} = %v, want 2", n)
	}
	// A client that breaks off in its body.
	conn, err := net.Dial("tcp", r.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"model\":", chatPath)
	time.Sleep(50 * time.Millisecond)
	conn.Close()
	waitFor(t, "the broken body's memory back", func() bool { return r.p.cfg.Budget.Held() == 0 })
	// An upstream that is gone.
	r.fake.Close()
	if via := call(t, r.proxy.URL, chatPath, chatBody(false, ""), nil); via.status != http.StatusBadGateway {
		t.Fatalf("upstream gone: %d", via.status)
	}
	r.cap.next(t)
	if held := r.p.cfg.Budget.Held(); held != 0 {
		t.Fatalf("%d bytes still held", held)
	}
}

// TestStalledBodyAnswered408: a client that stops sending the body the proxy reads before it
// goes upstream (a measured request's, a routed passthrough's), or a chunked body that never
// ends, is answered 408 once nothing of it has arrived for the idle timeout, and gives its
// memory back to the budget the proxy shares with ingest and OTLP; nothing went upstream, so
// no event is published. A body that keeps arriving, however slowly, goes upstream whole, one
// over the parse limit too, for longer than the idle timeout in all.
func TestStalledBodyAnswered408(t *testing.T) {
	const idle = 300 * time.Millisecond
	budget := reqbody.NewBudget(64<<20, nil)
	r := newRig(t, fakellm.Options{Tokens: 2}, func(c *Config) { c.Budget, c.BodyIdle, c.MaxParseBytes = budget, idle, 4<<10 })
	body := chatBody(false, "")
	big := `{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("w", 8<<10) + `"}]}`
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
	for _, tc := range []struct {
		name   string
		head   string
		pieces []string
		want   int
	}{
		{"stops sending", fmt.Sprintf("Content-Length: %d\r\n", len(body)), []string{body[:10]}, http.StatusRequestTimeout},
		{"chunked, never ends", "Transfer-Encoding: chunked\r\n", []string{fmt.Sprintf("%x\r\n%s\r\n", len(body), body)}, http.StatusRequestTimeout},
		{"slow but steady", fmt.Sprintf("Content-Length: %d\r\n", len(body)), []string{body[:10], body[10:20], body[20:30], body[30:]}, http.StatusOK},
		{"over the limit, slow but steady", fmt.Sprintf("Content-Length: %d\r\n", len(big)),
			[]string{big[:10], big[10:5000], big[5000:6000], big[6000:7000], big[7000:]}, http.StatusOK},
		{"chunked, over the limit, slow but steady", "Transfer-Encoding: chunked\r\n",
			[]string{chunk(big[:5000]), chunk(big[5000:6000]), chunk(big[6000:7000]), chunk(big[7000:]) + "0\r\n\r\n"}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", r.proxy.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n", chatPath, tc.head)
			for _, p := range tc.pieces {
				time.Sleep(idle / 3)
				if _, err := io.WriteString(c, p); err != nil {
					t.Fatal(err)
				}
			}
			_ = c.SetReadDeadline(time.Now().Add(idle + 5*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v (held %d)", err, budget.Held())
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want || (tc.want == http.StatusRequestTimeout && !resp.Close) {
				t.Fatalf("status %d (connection closed: %v), want %d", resp.StatusCode, resp.Close, tc.want)
			}
			if tc.want == http.StatusOK {
				if ev := r.cap.next(t); ev.Status != events.StatusOK {
					t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
				}
			}
			for i := 0; budget.Held() != 0 && i < 100; i++ {
				time.Sleep(10 * time.Millisecond)
			}
			if budget.Held() != 0 {
				t.Fatalf("%d bytes of the budget still held", budget.Held())
			}
		})
	}
	if n := len(r.cap.ch); n != 0 {
		t.Fatalf("%d events more than the requests that went upstream", n)
	}
}
