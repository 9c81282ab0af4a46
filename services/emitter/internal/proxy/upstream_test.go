package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// countConns starts srv counting the connections it accepts.
func countConns(srv *httptest.Server) (opened, closed *atomic.Int64) {
	opened, closed = new(atomic.Int64), new(atomic.Int64)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	srv.Start()
	return opened, closed
}

// TestUpstreamKeepAlive: sequential requests share one upstream connection; one the
// upstream closed while idle is noticed and replaced, and the request still succeeds.
func TestUpstreamKeepAlive(t *testing.T) {
	fake := httptest.NewUnstartedServer(fakellm.New(fakellm.Options{Tokens: 3}))
	conns, closed := countConns(fake)
	defer fake.Close()
	u, _ := ParseUpstream(fake.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	if !r.p.dialable[u] {
		t.Fatal("a plain-HTTP upstream does not go through the proxy's own client")
	}
	for i := range 20 {
		if via := call(t, r.proxy.URL, chatPath, chatBody(i%2 == 0, ""), nil); via.status != 200 {
			t.Fatalf("request %d: %d %v", i, via.status, via.err)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusOK {
			t.Fatalf("request %d: %s %s", i, ev.Status, ev.ErrorCode)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("20 sequential requests opened %d upstream connections", n)
	}
	fake.CloseClientConnections() // the upstream closes the idle connection, as on its idle timeout
	waitFor(t, "the upstream closes the idle connection", func() bool { return closed.Load() == 1 })
	if via := call(t, r.proxy.URL, chatPath, chatBody(true, ""), nil); via.status != 200 || via.err != nil {
		t.Fatalf("after the upstream closed the idle connection: %d %v", via.status, via.err)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusOK || conns.Load() != 2 {
		t.Fatalf("%s %s, %d connections", ev.Status, ev.ErrorCode, conns.Load())
	}
}

// TestUpstreamClosesAsItIsReused: an upstream that drops a kept-alive connection once the next
// request is on it, without answering. A request with an Idempotency-Key is sent again on a
// new connection; one without gets a 502 and an error event, as with http.Transport: the
// upstream read it and may have acted on it.
func TestUpstreamClosesAsItIsReused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	bodies := make(chan string, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					b, _ := io.ReadAll(req.Body)
					if i == 1 {
						return // the second request on a connection: drop it unanswered
					}
					bodies <- string(b)
					const out = `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(out), out)
				}
			}()
		}
	}()
	u, _ := ParseUpstream("http://" + ln.Addr().String())
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	idem := map[string]string{"Idempotency-Key": "k-1"}
	for i := range 3 {
		body := chatBody(false, fmt.Sprintf(`,"n":%d`, i))
		if via := call(t, r.proxy.URL, chatPath, body, idem); via.status != 200 || via.err != nil {
			t.Fatalf("request %d: %d %v %s", i, via.status, via.err, via.body)
		}
		if got := <-bodies; got != body {
			t.Fatalf("request %d: the upstream got %s", i, got)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusOK {
			t.Fatalf("request %d: %s %s", i, ev.Status, ev.ErrorCode)
		}
	}
	if via := call(t, r.proxy.URL, chatPath, chatBody(false, ""), nil); via.status != http.StatusBadGateway {
		t.Fatalf("without an Idempotency-Key: %d %v %s", via.status, via.err, via.body)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusError || ev.ErrorCode != CodeUpstreamUnreachable {
		t.Fatalf("without an Idempotency-Key: %s %s", ev.Status, ev.ErrorCode)
	}
}

// TestUpstreamFraming: a big body written in two pieces arrives whole; 1xx answers are skipped;
// Connection: close is honoured; the proxy frames the request itself.
func TestUpstreamFraming(t *testing.T) {
	type seen struct {
		body   []byte
		header http.Header
	}
	got := make(chan seen, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{b, r.Header.Clone()}
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	conns, _ := countConns(up)
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("word ", 40_000) + `"}]}`
	for i := range 2 {
		via := call(t, r.proxy.URL, chatPath, big, map[string]string{"Expect": "100-continue", "X-Custom": "a"})
		if via.status != 200 || !strings.Contains(string(via.body), `"hi"`) {
			t.Fatalf("request %d: %d %v %s", i, via.status, via.err, via.body)
		}
		s := <-got
		if !bytes.Equal(s.body, []byte(big)) || s.header.Get("X-Custom") != "a" || s.header.Get("Expect") != "" {
			t.Fatalf("request %d: the upstream got %d bytes, headers %v", i, len(s.body), s.header)
		}
		if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.HTTPStatus != 200 {
			t.Fatalf("request %d: %s %s %d", i, ev.Status, ev.ErrorCode, ev.HTTPStatus)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("Connection: close ignored: %d connections for 2 requests", n)
	}
}

// TestUpstreamAnswersEarly: an upstream that answers 413 before reading a big body, and stops
// reading: the client gets the 413, as it would directly.
func TestUpstreamAnswersEarly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const answer = `{"error":{"message":"too big","type":"invalid_request_error"}}`
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil { // the head only
					c.Close()
					return
				}
				fmt.Fprintf(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
				time.Sleep(200 * time.Millisecond) // the proxy's write fills the socket buffers
				c.Close()
			}()
		}
	}()
	u, _ := ParseUpstream("http://" + ln.Addr().String())
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u; c.MaxParseBytes = 64 << 20 })
	big := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("word ", 4<<20) + `"}]}`
	via := call(t, r.proxy.URL, chatPath, big, nil)
	if via.status != http.StatusRequestEntityTooLarge || string(via.body) != answer {
		t.Fatalf("client got %d %v %q", via.status, via.err, via.body)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusError || ev.ErrorCode != "413" {
		t.Fatalf("event %s %s", ev.Status, ev.ErrorCode)
	}
}

// TestRouteByDefaultAPI: api.anthropic.com as the default upstream is taken to serve
// Anthropic's API unless told otherwise, so a request that names no model and is not
// Anthropic's goes to the gpt route; any other host serves OpenAI's.
func TestRouteByDefaultAPI(t *testing.T) {
	parse := func(s string) *url.URL {
		u, err := ParseUpstream(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	ant, oai, vllm := parse("https://API.Anthropic.com"), parse("https://api.openai.com"), parse("http://vllm:8000")
	for _, tt := range []struct {
		name      string
		def       *url.URL
		api       string
		routes    []Route
		anthropic bool
		want      *url.URL
	}{
		{"Anthropic's host, OpenAI's request", ant, "", []Route{{"gpt-", oai}}, false, oai},
		{"Anthropic's host, Anthropic's request", ant, "", []Route{{"gpt-", oai}}, true, ant},
		{"Anthropic's host told it serves OpenAI's", ant, APIOpenAI, []Route{{"gpt-", oai}}, false, ant},
		{"a gateway told it serves Anthropic's", vllm, APIAnthropic, []Route{{"gpt-", oai}}, false, oai},
		{"an inference server beside OpenAI", vllm, "", []Route{{"gpt-", oai}}, false, vllm},
		{"an inference server beside Anthropic", vllm, "", []Route{{"claude-", ant}}, true, ant},
		{"no route of that API", ant, "", []Route{{"llama", vllm}}, false, ant},
		{"a narrower gpt route first", ant, "", []Route{{"gpt-oss-", vllm}, {"gpt-", oai}}, false, oai},
		{"a narrower claude route first", oai, "", []Route{{"claude-3-", vllm}, {"claude", ant}}, true, ant},
		// EMITTER_UPSTREAM_URL=none: a request naming no model goes to its API's route, or nowhere.
		{"no default, OpenAI's request to the gpt route", nil, "", []Route{{"gpt-", oai}, {"claude-", ant}}, false, oai},
		{"no default, Anthropic's request to the claude route", nil, "", []Route{{"gpt-", oai}, {"claude-", ant}}, true, ant},
		{"no default, no route of that API", nil, "", []Route{{"claude-", ant}}, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Upstream: tt.def, UpstreamAPI: tt.api, Routes: tt.routes}
			if got := c.route("", tt.anthropic); got != tt.want {
				if got == nil || tt.want == nil {
					t.Fatalf("went to %v, want %v", got, tt.want)
				}
				t.Fatalf("went to %s, want %s", got, tt.want)
			}
		})
	}
}
