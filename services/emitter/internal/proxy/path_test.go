package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// lineRecorder is an upstream that records the request line of each request as it came on
// the wire, and answers it with a small chat completion.
type lineRecorder struct {
	url   string
	lines chan string
}

func newLineRecorder(t *testing.T, basePath string) *lineRecorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	rec := &lineRecorder{url: "http://" + ln.Addr().String() + basePath, lines: make(chan string, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				rec.lines <- strings.TrimSuffix(line, "\r\n")
				// The rest of the head and the body, so that the proxy's writes all land.
				for {
					h, err := br.ReadString('\n')
					if err != nil || h == "\r\n" {
						break
					}
				}
				_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				_, _ = io.Copy(io.Discard, br)
				body := `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	return rec
}

// rawRequest sends method and target, as bytes, to the proxy on a new connection, and reads
// the answer.
func rawRequest(t *testing.T, addr, method, target, body string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, target, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPathsCannotEscape: a path that an upstream could resolve or split otherwise than the
// proxy routes it (dot segments, escaped or not; encoded slashes or backslashes) is refused
// with 400 and counted, whatever the method, and nothing reaches the upstream; any other path
// reaches it as the client escaped it, under the upstream's base path, and a measured one is
// measured.
func TestPathsCannotEscape(t *testing.T) {
	chat := chatBody(false, "")
	for _, tc := range []struct {
		name, base, method, target, body string
		wantLine                         string // the upstream's request line; "" for a refusal
		wantReason                       string
		wantEvent                        bool
	}{
		{name: "escaped dot dot", method: "GET", target: "/v1/%2e%2e/metrics", wantReason: refusedDotSegment},
		{name: "escaped dot dot, upper case", method: "DELETE", target: "/v1/files/%2E%2E", wantReason: refusedDotSegment},
		{name: "escaped dot", method: "GET", target: "/v1/%2e/models", wantReason: refusedDotSegment},
		{name: "dot dot then a parameter", method: "GET", target: "/v1/..;/metrics", wantReason: refusedDotSegment},
		{name: "dot dot and an escaped slash", method: "GET", target: "/v1/..%2fmetrics", wantReason: refusedEncodedSlash},
		{name: "escaped backslash", method: "GET", target: "/v1/a%5c..%5cmetrics", wantReason: refusedEncodedSlash},
		{name: "out of the base path", base: "/tenant-a/v1", method: "GET", target: "/v1/%2e%2e/%2e%2e/tenant-b/v1/models", wantReason: refusedDotSegment},
		{name: "out of the base path, deleting", base: "/tenant-a/v1", method: "DELETE", target: "/v1/%2e%2e/%2e%2e/tenant-b/v1/files/f", wantReason: refusedDotSegment},
		{name: "measured endpoint, escaped slash", method: "POST", target: "/v1/chat%2Fcompletions", body: chat, wantReason: refusedEncodedSlash},
		{name: "measured endpoint, escaped trailing slash", method: "POST", target: "/v1/messages%2F", body: chat, wantReason: refusedEncodedSlash},

		{name: "under the base path", base: "/tenant-a/v1", method: "GET", target: "/v1/models?after=%2F..", wantLine: "GET /tenant-a/v1/models?after=%2F.. HTTP/1.1"},
		{name: "the upstream URL's query", base: "/deploy?api-version=2024-10-21", method: "GET", target: "/v1/models", wantLine: "GET /deploy/v1/models?api-version=2024-10-21 HTTP/1.1"},
		{name: "the upstream URL's query, then the client's", base: "/deploy?api-version=2024-10-21", method: "POST", target: "/v1/chat/completions?x=1", body: chat,
			wantLine: "POST /deploy/v1/chat/completions?api-version=2024-10-21&x=1 HTTP/1.1", wantEvent: true},
		{name: "escapes kept as sent", method: "GET", target: "/v1/files/%41b%20c", wantLine: "GET /v1/files/%41b%20c HTTP/1.1"},
		{name: "dots inside a segment", method: "DELETE", target: "/v1/files/a..b", wantLine: "DELETE /v1/files/a..b HTTP/1.1"},
		{name: "measured endpoint, trailing slash", method: "POST", target: "/v1/chat/completions/", body: chat, wantLine: "POST /v1/chat/completions/ HTTP/1.1", wantEvent: true},
		{name: "measured endpoint, escaped letter", method: "POST", target: "/v1/chat/%63ompletions", body: chat, wantLine: "POST /v1/chat/%63ompletions HTTP/1.1", wantEvent: true},
		{name: "measured endpoint", base: "/tenant-a/v1", method: "POST", target: "/v1/chat/completions", body: chat, wantLine: "POST /tenant-a/v1/chat/completions HTTP/1.1", wantEvent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newLineRecorder(t, tc.base)
			p, cap, _ := newTestProxy(t, up.url, nil)
			srv := serveProxy(t, p, nil, nil)
			status, body := rawRequest(t, srv.Listener.Addr().String(), tc.method, tc.target, tc.body)
			if tc.wantLine == "" {
				if status != http.StatusBadRequest || !strings.Contains(body, "the request path has") {
					t.Fatalf("%s %s: %d %s, want 400 naming the path's problem", tc.method, tc.target, status, body)
				}
				if n := testutil.ToFloat64(p.m.refused.WithLabelValues(tc.wantReason)); n != 1 {
					t.Fatalf("refused{reason=%q} = %v, want 1", tc.wantReason, n)
				}
				select {
				case line := <-up.lines:
					t.Fatalf("the upstream got %q", line)
				case <-time.After(50 * time.Millisecond):
				}
				return
			}
			if status != http.StatusOK {
				t.Fatalf("%s %s: %d %s", tc.method, tc.target, status, body)
			}
			if line := <-up.lines; line != tc.wantLine {
				t.Fatalf("the upstream got %q, want %q", line, tc.wantLine)
			}
			if tc.wantEvent {
				if ev := cap.next(t); ev.Model != "gpt-4o" || ev.OutputTokens != 1 {
					t.Fatalf("event %+v", ev)
				}
			} else if n := testutil.ToFloat64(p.m.passthrough); n != 1 {
				t.Fatalf("passthrough = %v, want 1", n)
			}
		})
	}
}

func TestPathProblem(t *testing.T) {
	f := func(escaped, want string) {
		t.Helper()
		if got, _ := pathProblem(escaped); got != want {
			t.Fatalf("pathProblem(%q) = %q, want %q", escaped, got, want)
		}
	}
	f("/v1/models", "")
	f("/v1/models/", "")
	f("/v1/files/a.b", "")
	f("/v1/files/...", "")
	f("/v1/files/%2e%2e%2e", "")
	f("/v1/models/gpt%3A4", "")
	f("/v1/.", refusedDotSegment)
	f("/v1/..", refusedDotSegment)
	f("/v1/%2E", refusedDotSegment)
	f("/v1/.%2e/x", refusedDotSegment)
	f("/v1/..;x=1/x", refusedDotSegment)
	f("/v1/%2e%2e%3b/x", refusedDotSegment)
	f("/v1/a%2Fb", refusedEncodedSlash)
	f("/v1/a%2fb", refusedEncodedSlash)
	f("/v1/a%5Cb", refusedEncodedSlash)
	f("/v1/a%zz", refusedEncodedSlash)
}
