package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"github.com/tokenscope/tokenscope/services/emitter/internal/nodetest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// capture is an emitter that keeps the events, after checking each against the contract.
type capture struct {
	t   testing.TB
	mu  sync.Mutex
	evs []events.RequestEvent
	ch  chan struct{}
}

func newCapture(t testing.TB) *capture { return &capture{t: t, ch: make(chan struct{}, 1024)} }

func (c *capture) Emit(ev *events.RequestEvent, now time.Time) error {
	if err := ev.ValidateAt(now); err != nil {
		c.t.Errorf("invalid event: %v: %+v", err, *ev)
		return err
	}
	c.mu.Lock()
	c.evs = append(c.evs, *ev)
	c.mu.Unlock()
	c.ch <- struct{}{}
	return nil
}

// next waits for the next event.
func (c *capture) next(t testing.TB) events.RequestEvent {
	t.Helper()
	select {
	case <-c.ch:
	case <-time.After(30 * time.Second): // a bound for a loaded machine; events come at once
		t.Fatal("no event in 30s")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ev := c.evs[0]
	c.evs = c.evs[1:]
	return ev
}

type rig struct {
	fake  *httptest.Server
	proxy *httptest.Server
	p     *Proxy
	cap   *capture
	reg   *prometheus.Registry
}

func newRig(t *testing.T, opts fakellm.Options, tweak func(*Config)) *rig {
	t.Helper()
	fake := httptest.NewServer(fakellm.New(opts))
	t.Cleanup(fake.Close)
	p, cap, reg := newTestProxy(t, fake.URL+"/v1", tweak)
	srv := serveProxy(t, p, nil, nil)
	return &rig{fake: fake, proxy: srv, p: p, cap: cap, reg: reg}
}

// serveProxy serves p as the emitter does: through its listener (streams relayed on its loop
// where the platform has one, long ones taken off net/http), each handler told its client's
// connection. wrap, if set, wraps the listener under the proxy's; configure, if set, changes
// the server before it starts. The server is closed, p drained and closed, when the test ends.
func serveProxy(t testing.TB, p *Proxy, wrap func(net.Listener) net.Listener, configure func(*http.Server)) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	p.Register(mux)
	srv := httptest.NewUnstartedServer(mux)
	ln := srv.Listener
	if wrap != nil {
		ln = wrap(ln)
	}
	srv.Listener = p.Listener(ln)
	srv.Config.ConnContext = p.ConnContext
	if configure != nil {
		configure(srv.Config)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Drain(ctx); err != nil {
			t.Errorf("drain: %v", err)
		}
		p.Close()
	})
	return srv
}

// newTestProxy returns a proxy to upstream with the tests' configuration (tweak may change
// it), capturing its events, and its metrics registry.
func newTestProxy(t testing.TB, upstream string, tweak func(*Config)) (*Proxy, *capture, *prometheus.Registry) {
	t.Helper()
	up, err := ParseUpstream(upstream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Upstream: up, UpstreamTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second,
		DefaultScene: "default", DefaultEnv: "test", MaxParseBytes: 1 << 20, MaxLabels: 10}
	if tweak != nil {
		tweak(&cfg)
	}
	cap := newCapture(t)
	reg := prometheus.NewRegistry()
	return New(cfg, cap, reg, slog.New(slog.NewTextHandler(io.Discard, nil))), cap, reg
}

// bothClients runs f with each of the proxy's upstream clients: its own (plain-HTTP upstreams,
// bodies in memory, as here) and http.Transport (TLS upstreams, HTTP proxies, bodies
// streamed through unread).
func bothClients(t *testing.T, f func(t *testing.T, transport bool)) {
	t.Run("own client", func(t *testing.T) { f(t, false) })
	t.Run("http.Transport", func(t *testing.T) { f(t, true) })
}

// viaTransport sends every upstream request through http.Transport.
func (r *rig) viaTransport() {
	for u := range r.p.dialable {
		r.p.dialable[u] = false
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func call(t testing.TB, base, path, body string, hdr map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-test")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

const (
	chatPath      = "/v1/chat/completions"
	complPath     = "/v1/completions"
	messagesPath  = "/v1/messages"
	responsesPath = "/v1/responses"
)

func chatBody(stream bool, extra string) string {
	s := `{"model":"gpt-4o","messages":[{"role":"user","content":"one two three four"}],"max_tokens":5`
	if stream {
		s += `,"stream":true`
	}
	return s + extra + "}"
}

func TestIdenticalBytesAndMeasurements(t *testing.T) {
	bothClients(t, testIdenticalBytesAndMeasurements)
}

func testIdenticalBytesAndMeasurements(t *testing.T, transport bool) {
	r := newRig(t, fakellm.Options{TTFT: 60 * time.Millisecond, TPOT: 2 * time.Millisecond}, nil)
	if transport {
		r.viaTransport()
	}
	tests := []struct {
		name, path, body string
		stream           bool
		provider         string
	}{
		{"openai chat stream, usage added and stripped", chatPath, chatBody(true, ""), true, "openai"},
		{"openai chat stream, client asked for usage", chatPath, chatBody(true, `,"stream_options":{"include_usage":true}`), true, "openai"},
		{"openai chat stream, stream_options without usage", chatPath, chatBody(true, `,"stream_options":{"include_obfuscation":false}`), true, "openai"},
		{"openai chat, not streamed", chatPath, chatBody(false, ""), false, "openai"},
		{"openai completions stream", complPath, `{"model":"gpt-3.5-turbo-instruct","prompt":"one two three four","max_tokens":5,"stream":true}`, true, "openai"},
		{"anthropic messages stream", messagesPath, `{"model":"claude-sonnet-4-5","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"one two three four"}]}`, true, "anthropic"},
		{"anthropic messages, not streamed", messagesPath, `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[{"role":"user","content":"one two three four"}]}`, false, "anthropic"},
		{"openai responses stream", responsesPath, `{"model":"gpt-5-mini","input":"one two three four","max_output_tokens":5,"stream":true}`, true, "openai"},
		{"openai responses, not streamed", responsesPath, `{"model":"gpt-5-mini","input":[{"role":"user","content":"one two three four"}],"max_output_tokens":5}`, false, "openai"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			direct := call(t, r.fake.URL, tt.path, tt.body, nil)
			via := call(t, r.proxy.URL, tt.path, tt.body, map[string]string{HeaderScene: "chat", HeaderTenant: "acme", HeaderConversation: "c-1", HeaderTurn: "3"})
			if direct.err != nil || via.err != nil {
				t.Fatalf("direct %v, via proxy %v", direct.err, via.err)
			}
			if via.status != direct.status || !bytes.Equal(via.body, direct.body) {
				t.Fatalf("via proxy %d:\n%s\ndirect %d:\n%s", via.status, via.body, direct.status, direct.body)
			}
			if ct := via.header.Get("Content-Type"); ct != direct.header.Get("Content-Type") {
				t.Fatalf("content type %q, want %q", ct, direct.header.Get("Content-Type"))
			}
			ev := r.cap.next(t)
			if ev.Status != events.StatusOK || ev.Stream != tt.stream || ev.Provider != tt.provider || ev.TokensEstimated {
				t.Fatalf("event %+v", ev)
			}
			if ev.InputTokens != 4 || ev.OutputTokens != 5 {
				t.Fatalf("tokens %d/%d, want 4/5 from the usage", ev.InputTokens, ev.OutputTokens)
			}
			if ev.Scene != "chat" || ev.Env != "test" || ev.Tenant != "acme" || ev.ConversationID != "c-1" || ev.Turn != 3 {
				t.Fatalf("labels %+v", ev)
			}
			if ev.Instance != strings.TrimPrefix(r.fake.URL, "http://") || ev.HTTPStatus != 200 {
				t.Fatalf("instance %q http %d", ev.Instance, ev.HTTPStatus)
			}
			// The fake sends its opening events at once and the first token after 60 ms.
			if ev.TTFTMs < 55 || ev.TotalMs < ev.TTFTMs {
				t.Fatalf("ttft %.1f total %.1f: TTFT must be the first content, not the first byte", ev.TTFTMs, ev.TotalMs)
			}
			if tt.stream && (ev.MaxITLMs <= 0 || ev.MaxITLMs > 50) {
				t.Fatalf("max ITL %.1f", ev.MaxITLMs)
			}
		})
	}
}

func TestStatuses(t *testing.T) { bothClients(t, testStatuses) }

func testStatuses(t *testing.T, transport bool) {
	r := newRig(t, fakellm.Options{TTFT: 10 * time.Millisecond, TPOT: time.Millisecond, Tokens: 8}, func(c *Config) {
		c.UpstreamTimeout = 300 * time.Millisecond
		c.IdleTimeout = 300 * time.Millisecond
	})
	if transport {
		r.viaTransport()
	}
	anth := `{"model":"claude-haiku","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi there"}]}`
	tests := []struct {
		name, path, body, mode string
		status                 events.Status
		code                   string
		httpStatus             int
		clientStatus           int
		sameBytes              bool // the client's bytes equal a direct call's
		clientErr              bool // the client sees a broken response
	}{
		{"500", chatPath, chatBody(true, ""), fakellm.ModeError, events.StatusError, "500", 500, 500, true, false},
		{"429 is rate limited", chatPath, chatBody(true, ""), fakellm.ModeRateLimit, events.StatusError, "429", 429, 429, true, false},
		{"anthropic 429", messagesPath, anth, fakellm.ModeRateLimit, events.StatusError, "429", 429, 429, true, false},
		{"openai SSE error event", chatPath, chatBody(true, ""), fakellm.ModeSSEError, events.StatusError, "server_error", 200, 200, true, false},
		{"anthropic SSE error event", messagesPath, anth, fakellm.ModeSSEError, events.StatusError, "overloaded_error", 200, 200, true, false},
		{"malformed SSE", chatPath, chatBody(true, ""), fakellm.ModeMalformed, events.StatusError, "malformed_sse", 200, 200, true, false},
		{"malformed body", chatPath, chatBody(false, ""), fakellm.ModeMalformed, events.StatusError, "malformed_body", 200, 200, true, false},
		{"gzip body", chatPath, chatBody(false, ""), fakellm.ModeGzip, events.StatusOK, "", 200, 200, true, false},
		{"gzip stream", messagesPath, anth, fakellm.ModeGzip, events.StatusOK, "", 200, 200, true, false},
		{"upstream disconnects mid-stream", chatPath, chatBody(true, ""), fakellm.ModeDisconnect, events.StatusError, "upstream_disconnect", 200, 200, false, true},
		{"stream stalls past the idle timeout", chatPath, chatBody(true, ""), fakellm.ModeStall, events.StatusTimeout, "stream_idle", 200, 200, false, true},
		{"upstream never answers", chatPath, chatBody(true, ""), fakellm.ModeSilent, events.StatusTimeout, "upstream_timeout", 0, 504, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := map[string]string{"X-Fakellm-Mode": tt.mode}
			via := call(t, r.proxy.URL, tt.path, tt.body, hdr)
			if tt.clientErr != (via.err != nil) {
				t.Fatalf("client error %v, want an error: %v", via.err, tt.clientErr)
			}
			if !tt.clientErr && via.status != tt.clientStatus {
				t.Fatalf("client status %d, want %d: %s", via.status, tt.clientStatus, via.body)
			}
			if tt.sameBytes {
				direct := call(t, r.fake.URL, tt.path, tt.body, hdr)
				if !bytes.Equal(direct.body, via.body) {
					t.Fatalf("via proxy:\n%q\ndirect:\n%q", via.body, direct.body)
				}
			}
			ev := r.cap.next(t)
			if ev.Status != tt.status || ev.ErrorCode != tt.code || ev.HTTPStatus != tt.httpStatus {
				t.Fatalf("event status %s %q http %d, want %s %q %d", ev.Status, ev.ErrorCode, ev.HTTPStatus, tt.status, tt.code, tt.httpStatus)
			}
			if tt.mode == fakellm.ModeGzip && (ev.OutputTokens < 5 || ev.TokensEstimated) {
				t.Fatalf("gzip: tokens %d estimated %v", ev.OutputTokens, ev.TokensEstimated)
			}
		})
	}
	if got := testutil.ToFloat64(r.p.m.rateLimited.WithLabelValues("openai")); got != 1 {
		t.Fatalf("rate_limited_total{openai} = %v, want 1", got)
	}
}

func TestClientHangsUp(t *testing.T) { bothClients(t, testClientHangsUp) }

func testClientHangsUp(t *testing.T, transport bool) {
	r := newRig(t, fakellm.Options{TTFT: 10 * time.Millisecond, TPOT: 20 * time.Millisecond, Tokens: 200}, nil)
	if transport {
		r.viaTransport()
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.proxy.URL+chatPath, strings.NewReader(chatBody(true, "")))
	req.Header.Set("X-Fakellm-Tokens", "200")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.p.m.streams); got != 1 {
		t.Fatalf("inflight_streams = %v during a stream", got)
	}
	cancel()
	resp.Body.Close()
	ev := r.cap.next(t)
	if ev.Status != events.StatusCanceled || ev.ErrorCode != CodeClientGone {
		t.Fatalf("event %s %q, want canceled", ev.Status, ev.ErrorCode)
	}
	if got := testutil.ToFloat64(r.p.m.streams); got != 0 {
		t.Fatalf("inflight_streams = %v after the stream", got)
	}
}

func TestUnreachableUpstream(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL, _ := url.Parse(dead.URL)
	dead.Close()
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = deadURL })
	via := call(t, r.proxy.URL, messagesPath, `{"model":"claude-x","max_tokens":3,"messages":[]}`, nil)
	if via.status != http.StatusBadGateway || !strings.Contains(string(via.body), `"type":"error"`) {
		t.Fatalf("client got %d %s", via.status, via.body)
	}
	ev := r.cap.next(t)
	if ev.Status != events.StatusError || ev.ErrorCode != CodeUpstreamUnreachable || ev.Model != "claude-x" || !ev.TokensEstimated {
		t.Fatalf("event %+v", ev)
	}
}

func TestHugeBodyPassesThrough(t *testing.T) {
	r := newRig(t, fakellm.Options{Tokens: 3}, func(c *Config) { c.MaxParseBytes = 4 << 10 })
	big := `{"model":"gpt-4o","max_tokens":3,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 20_000) + `"}]}`
	direct := call(t, r.fake.URL, chatPath, big, nil)
	via := call(t, r.proxy.URL, chatPath, big, nil)
	if via.status != 200 || !bytes.Equal(direct.body, via.body) {
		t.Fatalf("via proxy %d %q", via.status, via.body)
	}
	ev := r.cap.next(t)
	// Unparsed, the request's model is unknown, but the response's usage still counts.
	if ev.Status != events.StatusOK || ev.Model != unknownModel || ev.InputTokens != 20_000 || ev.OutputTokens != 3 {
		t.Fatalf("event %+v", ev)
	}
}

func TestRoutesAndPassthrough(t *testing.T) {
	other := httptest.NewServer(fakellm.New(fakellm.Options{Tokens: 2}))
	defer other.Close()
	otherURL, _ := ParseUpstream(other.URL)
	r := newRig(t, fakellm.Options{Tokens: 2}, func(c *Config) { c.Routes = []Route{{Prefix: "claude-", URL: otherURL}} })
	if via := call(t, r.proxy.URL, messagesPath, `{"model":"claude-opus","max_tokens":2,"messages":[{"role":"user","content":"a"}]}`, nil); via.status != 200 {
		t.Fatalf("status %d", via.status)
	}
	if ev := r.cap.next(t); ev.Instance != otherURL.Host {
		t.Fatalf("instance %q, want %q", ev.Instance, otherURL.Host)
	}
	resp, err := http.Get(r.proxy.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "fake-model") {
		t.Fatalf("/v1/models through the proxy: %d %s", resp.StatusCode, b)
	}
}

func TestLabelHeadersNotForwarded(t *testing.T) {
	seen := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	call(t, r.proxy.URL, chatPath, chatBody(false, ""), map[string]string{HeaderScene: "s", "Accept-Encoding": "gzip"})
	h := <-seen
	if h.Get(HeaderScene) != "" || h.Get("Authorization") != "Bearer sk-test" || h.Get("Accept-Encoding") != "gzip" {
		t.Fatalf("upstream saw %v", h)
	}
	r.cap.next(t)
}

func TestWithUsage(t *testing.T) {
	f := func(in string, want string, added bool) {
		t.Helper()
		info, ok := readRequest([]byte(in))
		if !ok {
			t.Fatalf("readRequest(%s): not a JSON object", in)
		}
		got, ok := withUsage([]byte(in), info.StreamOptions)
		if string(got) != want || ok != added {
			t.Fatalf("withUsage(%s) = %s %v, want %s %v", in, got, ok, want, added)
		}
		if ok && !json.Valid(got) {
			t.Fatalf("withUsage(%s) = %s: not JSON", in, got)
		}
	}
	f(`{"stream":true}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true)
	f(`{"stream":true} `+"\n", `{"stream":true,"stream_options":{"include_usage":true}} `+"\n", true)
	f(`{"stream":true,"stream_options":{"include_usage":true}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, false)
	f(`{"stream":true,"stream_options":{"include_usage": true }}`, `{"stream":true,"stream_options":{"include_usage": true }}`, false)
	f(`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true)
	f(`{"stream":true,"stream_options":{"include_usage":null,"x":1}}`, `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`, true)
	f(`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true)
	f(`{"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`, true)
	f(`{"stream":true,"stream_options":{ }}`, `{"stream":true,"stream_options":{ "include_usage":true}}`, true)
	// Another option is kept where it is, with its spacing; the member goes last.
	f(`{"stream_options": {"include_obfuscation": false} ,"stream":true}`, `{"stream_options": {"include_obfuscation": false,"include_usage":true} ,"stream":true}`, true)
	// A duplicate: the upstream keeps the last one, so that is the one changed.
	f(`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"a":1}}`, `{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"a":1,"include_usage":true}}`, true)
	// Look-alikes inside strings and nested objects are not the member.
	f(`{"messages":[{"content":"\\\"stream_options\":{}"},{"stream_options":{"include_usage":false}}],"stream":true,"stream_options":{"z":"}\""}}`,
		`{"messages":[{"content":"\\\"stream_options\":{}"},{"stream_options":{"include_usage":false}}],"stream":true,"stream_options":{"z":"}\"","include_usage":true}}`, true)
	// An escaped name is the same name to a JSON decoder.
	f(`{"stream":true,"stream\u005foptions":{"a":[1,{"b":2}]}}`, `{"stream":true,"stream\u005foptions":{"a":[1,{"b":2}],"include_usage":true}}`, true)
	// Names are exact: another spelling is another member, and usage is still to be asked for.
	f(`{"stream":true,"Stream_Options":{"include_usage":false}}`, `{"stream":true,"Stream_Options":{"include_usage":false},"stream_options":{"include_usage":true}}`, true)
	f(`{"stream":true,"stream_options":{"Include_Usage":true}}`, `{"stream":true,"stream_options":{"Include_Usage":true,"include_usage":true}}`, true)
	// Not an object: the upstream rejects it; nothing to add.
	f(`{"stream":true,"stream_options":"yes"}`, `{"stream":true,"stream_options":"yes"}`, false)
}

// TestForwardedBodyIsTheClients checks that the upstream receives the client's body byte for
// byte, with only include_usage spliced in: key order, spacing, escapes and numbers as sent.
func TestForwardedBodyIsTheClients(t *testing.T) { bothClients(t, testForwardedBodyIsTheClients) }

func testForwardedBodyIsTheClients(t *testing.T, transport bool) {
	seen := make(chan []byte, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- b
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	if transport {
		r.viaTransport()
	}
	const msgs = `"messages": [ {"role":"user", "content":"<b>&amp; caf\u00e9 \"q\" 1e3"} ], "temperature": 1.0e0, "z":{"b":1,"a":2}`
	tests := []struct{ name, body, want string }{
		{"no stream_options", `{"model":"gpt-4o", "stream": true, ` + msgs + `}`,
			`{"model":"gpt-4o", "stream": true, ` + msgs + `,"stream_options":{"include_usage":true}}`},
		{"stream_options without include_usage", `{"stream_options": {"include_obfuscation": false}, "model":"gpt-4o", "stream": true, ` + msgs + "}\n",
			`{"stream_options": {"include_obfuscation": false,"include_usage":true}, "model":"gpt-4o", "stream": true, ` + msgs + "}\n"},
		{"include_usage false", `{"model":"gpt-4o","stream":true,"stream_options":{ "include_usage" : false },` + msgs + `}`,
			`{"model":"gpt-4o","stream":true,"stream_options":{ "include_usage" : true },` + msgs + `}`},
		{"stream_options null", `{"model":"gpt-4o","stream":true,"stream_options":null,` + msgs + `}`,
			`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"usage asked for", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`,
			`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"not streamed", `{"model":"gpt-4o", ` + msgs + `}`, `{"model":"gpt-4o", ` + msgs + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if via := call(t, r.proxy.URL, chatPath, tt.body, nil); via.err != nil || via.status != 200 {
				t.Fatalf("status %d %v", via.status, via.err)
			}
			if got := <-seen; string(got) != tt.want {
				t.Fatalf("upstream got\n%s\nwant\n%s", got, tt.want)
			}
			r.cap.next(t)
		})
	}
}

// FuzzWithUsage checks that a spliced body is still JSON and asks for usage, whatever the
// client's body looks like.
func FuzzWithUsage(f *testing.F) {
	for _, s := range []string{`{"stream":true}`, `{"stream_options":{ },"a":[{"b":"}"}]}`, `{"stream_options":null}`,
		`{"stream_options":{"include_usage":false,"x":"\"{"}}`, `{"stream_options":{"a":1},"stream_options":{}}`, `{"stream_options":[]}`,
		`{"stream_options":null,"STREAM_OPTIONS":{}}`, `{"stream_options":{"include_usage":false,"INCLUDE_USAGE":true}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		info, ok := readRequest([]byte(in))
		if !ok {
			return
		}
		out, added := withUsage([]byte(in), info.StreamOptions)
		if !added {
			if string(out) != in {
				t.Fatalf("changed without adding: %s -> %s", in, out)
			}
			return
		}
		// Read back as the upstream reads it: exact names, the last duplicate winning.
		got, ok := readRequest(out)
		if !ok {
			t.Fatalf("%s -> %s: not a JSON object", in, out)
		}
		vs, ve, ok := memberValue(got.StreamOptions, "include_usage")
		if !ok || string(got.StreamOptions[vs:ve]) != "true" {
			t.Fatalf("%s -> %s: stream_options %s", in, out, got.StreamOptions)
		}
	})
}

// TestTimeoutAsTheHeadersArrive makes the upstream answer right at the upstream timeout, many
// times, and checks that each request has one outcome: the client gets the whole response and
// the event says ok, or the client gets a 504 and the event says timeout. Never a 200 cut
// short, never a timeout event for a response the client got, never a stream_idle.
func TestTimeoutAsTheHeadersArrive(t *testing.T) { bothClients(t, testTimeoutAsTheHeadersArrive) }

func testTimeoutAsTheHeadersArrive(t *testing.T, transport bool) {
	const timeout = 20 * time.Millisecond
	const sse = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		d, _ := time.ParseDuration(r.Header.Get("X-Delay"))
		time.Sleep(d)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		// The body comes a little after the headers: a request the timeout cancels after
		// its headers arrived would lose it.
		time.Sleep(time.Millisecond)
		_, _ = io.WriteString(w, sse)
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u; c.UpstreamTimeout = timeout; c.IdleTimeout = time.Second })
	if transport {
		r.viaTransport()
	}
	const n, parallel = 400, 16
	got := make([]reply, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			// Around the timeout, in 50 µs steps.
			delay := timeout - 3*time.Millisecond + time.Duration(i%80)*50*time.Microsecond
			got[i] = call(t, r.proxy.URL, chatPath, chatBody(true, `,"stream_options":{"include_usage":true}`),
				map[string]string{"X-Delay": delay.String(), HeaderConversation: strconv.Itoa(i)})
		}()
	}
	wg.Wait()
	evs := map[int]events.RequestEvent{}
	for range n {
		ev := r.cap.next(t)
		i, _ := strconv.Atoi(ev.ConversationID)
		evs[i] = ev
	}
	var answered, timedOut int
	for i, c := range got {
		ev := evs[i]
		switch {
		case c.err == nil && c.status == 200 && string(c.body) == sse && ev.Status == events.StatusOK && ev.HTTPStatus == 200:
			answered++
		case c.err == nil && c.status == http.StatusGatewayTimeout && ev.Status == events.StatusTimeout && ev.ErrorCode == CodeUpstreamTimeout && ev.HTTPStatus == 0:
			timedOut++
		default:
			t.Errorf("request %d: client got %d %v %q; event %s %q http %d", i, c.status, c.err, c.body, ev.Status, ev.ErrorCode, ev.HTTPStatus)
		}
	}
	t.Logf("%d answered, %d timed out", answered, timedOut)
}

// TestSlowClientIsNotAnIdleUpstream has the client stop reading, its socket full, for longer
// than the idle timeout while the upstream has more to send: the stream is not the upstream's
// stall, and ends ok.
func TestSlowClientIsNotAnIdleUpstream(t *testing.T) {
	bothClients(t, testSlowClientIsNotAnIdleUpstream)
}

func testSlowClientIsNotAnIdleUpstream(t *testing.T, transport bool) {
	chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 4000) + "\"}}]}\n\n"
	const chunks = 1000 // 4 MB: more than the sockets to the client buffer, so the proxy's writes block
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range chunks {
			_, _ = io.WriteString(w, chunk)
		}
		_, _ = fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", chunks)
	}))
	defer up.Close()
	// The idle timeout is well over what a loaded machine may hold up a goroutine: the
	// upstream here never falls silent, only the client stops reading.
	const idle = 3 * time.Second
	p, cap, _ := newTestProxy(t, up.URL, func(c *Config) { c.IdleTimeout = idle })
	if transport {
		for u := range p.dialable {
			p.dialable[u] = false
		}
	}
	toClient := make(chan *net.TCPConn, 1)
	srv := serveProxy(t, p, func(ln net.Listener) net.Listener { return acceptedConns{ln, 64 << 10, toClient} }, nil)
	resp, err := http.Post(srv.URL+chatPath, "application/json", strings.NewReader(chatBody(true, `,"stream_options":{"include_usage":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	// The client reads no more: once the proxy's socket to it is full and the client's
	// kernel takes no more bytes either, the proxy's writes wait, and the client keeps them
	// waiting past the idle timeout. The client's kernel may still take a few bytes as it
	// compacts its buffer, letting a write through and the proxy read on: a pause counts
	// only if no byte went through in all of it.
	proxySide := <-toClient
	stalled := func() bool {
		if !sendBufferFull(t, proxySide) {
			return false
		}
		acked := bytesAcked(t, proxySide)
		time.Sleep(200 * time.Millisecond)
		return bytesAcked(t, proxySide) == acked
	}
	paused := false
	for range 4 {
		waitFor(t, "the proxy's socket to the client fills and stalls", stalled)
		acked := bytesAcked(t, proxySide)
		time.Sleep(idle + time.Second)
		if paused = bytesAcked(t, proxySide) == acked; paused {
			break
		}
	}
	if !paused {
		t.Fatal("the proxy's socket to the client kept taking bytes while the client read none")
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n < chunks*int64(len(chunk))-1024 {
		t.Fatalf("read %d bytes after the pause: %v", n, err)
	}
	if ev := cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != chunks {
		t.Fatalf("event %s %q, %d tokens", ev.Status, ev.ErrorCode, ev.OutputTokens)
	}
}

// acceptedConns sets the send buffer of each connection it accepts, so that it fills soon,
// and hands it to conns too, if there is room.
type acceptedConns struct {
	net.Listener
	sendBuffer int
	conns      chan<- *net.TCPConn
}

func (l acceptedConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && err == nil {
		_ = tc.SetWriteBuffer(l.sendBuffer)
		select {
		case l.conns <- tc:
		default:
		}
	}
	return c, err
}

func gunzipAll(t testing.TB, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v: %q", err, b)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("cannot gunzip: %v", err)
	}
	return out
}

// TestGzipStreams: a gzip stream the proxy must strip its usage chunk from reaches the client
// decoded, with exactly the content a direct call decodes to; one it need not edit passes
// through compressed, byte for byte. Either way it is measured: TTFT and usage.
func TestGzipStreams(t *testing.T) { bothClients(t, testGzipStreams) }

func testGzipStreams(t *testing.T, transport bool) {
	r := newRig(t, fakellm.Options{TTFT: 60 * time.Millisecond, TPOT: 2 * time.Millisecond}, nil)
	if transport {
		r.viaTransport()
	}
	anth := `{"model":"claude-sonnet-4-5","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"one two three four"}]}`
	tests := []struct {
		name, path, body string
		decoded          bool // the proxy decodes it for the client
	}{
		{"openai chat, usage added and stripped", chatPath, chatBody(true, ""), true},
		{"openai chat, stream_options without usage", chatPath, chatBody(true, `,"stream_options":{"include_obfuscation":false}`), true},
		{"openai completions, usage added and stripped", complPath, `{"model":"gpt-3.5-turbo-instruct","prompt":"one two three four","max_tokens":5,"stream":true}`, true},
		{"openai chat, client asked for usage", chatPath, chatBody(true, `,"stream_options":{"include_usage":true}`), false},
		{"anthropic messages", messagesPath, anth, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := map[string]string{"X-Fakellm-Mode": fakellm.ModeGzip, "Accept-Encoding": "gzip, br"}
			direct := call(t, r.fake.URL, tt.path, tt.body, hdr)
			via := call(t, r.proxy.URL, tt.path, tt.body, hdr)
			if direct.err != nil || via.err != nil || via.status != 200 {
				t.Fatalf("direct %v, via proxy %d %v", direct.err, via.status, via.err)
			}
			if direct.header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("the fake did not gzip: %v", direct.header)
			}
			if tt.decoded {
				if enc := via.header.Get("Content-Encoding"); enc != "" || via.header.Get("Content-Length") != "" {
					t.Fatalf("decoded stream sent with Content-Encoding %q, Content-Length %q", enc, via.header.Get("Content-Length"))
				}
				if want := gunzipAll(t, direct.body); !bytes.Equal(via.body, want) {
					t.Fatalf("via proxy:\n%s\ndirect, decoded:\n%s", via.body, want)
				}
				if bytes.Contains(via.body, []byte(`"usage"`)) {
					t.Fatalf("the usage chunk the proxy asked for reached the client:\n%s", via.body)
				}
			} else if via.header.Get("Content-Encoding") != "gzip" || !bytes.Equal(via.body, direct.body) {
				t.Fatalf("via proxy (%q):\n%q\ndirect:\n%q", via.header.Get("Content-Encoding"), via.body, direct.body)
			}
			ev := r.cap.next(t)
			if ev.Status != events.StatusOK || !ev.Stream || ev.TokensEstimated || ev.InputTokens != 4 || ev.OutputTokens != 5 {
				t.Fatalf("event %+v", ev)
			}
			if ev.TTFTMs < 55 || ev.TotalMs < ev.TTFTMs || ev.MaxITLMs <= 0 {
				t.Fatalf("ttft %.1f total %.1f max ITL %.1f: not measured on the decoded stream", ev.TTFTMs, ev.TotalMs, ev.MaxITLMs)
			}
		})
	}
}

// TestGzipStreamWithCurl: curl --compressed prints the same through the proxy as directly, for
// a gzip stream the proxy decodes to strip its usage chunk.
func TestGzipStreamWithCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl is required under CI")
		}
		t.Skip("curl not found")
	}
	r := newRig(t, fakellm.Options{TPOT: time.Millisecond}, nil)
	curl := func(base string) []byte {
		t.Helper()
		out, err := exec.Command("curl", "-sS", "-N", "--fail-with-body", "--compressed", base+chatPath,
			"-H", "X-Fakellm-Mode: gzip", "-H", "Authorization: Bearer sk-x", "-d", chatBody(true, "")).Output()
		if err != nil {
			t.Fatalf("curl %s: %v\n%s", base, err, out)
		}
		return out
	}
	direct, via := curl(r.fake.URL), curl(r.proxy.URL)
	if !bytes.Equal(direct, via) || !bytes.HasSuffix(via, []byte("data: [DONE]\n\n")) {
		t.Fatalf("curl via proxy:\n%s\ndirect:\n%s", via, direct)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.TokensEstimated {
		t.Fatalf("event %+v", ev)
	}
}

// TestAcceptEncodingNarrowed: for a stream it must edit, the proxy lets the upstream choose
// only an encoding it can decode; other requests keep the client's Accept-Encoding.
func TestAcceptEncodingNarrowed(t *testing.T) { bothClients(t, testAcceptEncodingNarrowed) }

func testAcceptEncodingNarrowed(t *testing.T, transport bool) {
	seen := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- strings.Join(r.Header.Values("Accept-Encoding"), "|")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	if transport {
		r.viaTransport()
	}
	f := func(body, acceptEncoding, want string) {
		t.Helper()
		hdr := map[string]string{"Accept-Encoding": acceptEncoding}
		if acceptEncoding == "" {
			hdr = nil // none sent: any coding would do, by RFC 9110
		}
		call(t, r.proxy.URL, chatPath, body, hdr)
		if got := <-seen; got != want {
			t.Fatalf("Accept-Encoding %q went upstream as %q, want %q", acceptEncoding, got, want)
		}
		r.cap.next(t)
	}
	f(chatBody(true, ""), "br, gzip;q=0.5, zstd", "gzip")
	f(chatBody(true, ""), "br, zstd", "identity")
	f(chatBody(true, ""), "gzip;q=0, br", "identity")
	f(chatBody(true, ""), "", "identity")
	f(chatBody(true, `,"stream_options":{"include_usage":true}`), "br, zstd", "br, zstd")
	f(chatBody(false, ""), "br", "br")
}

// TestCorruptGzip: a body that says gzip and is not. Passed through, the client gets every
// byte; decoded to strip the usage chunk, the client's connection breaks as the upstream's
// would. The event says malformed_gzip.
func TestCorruptGzip(t *testing.T) { bothClients(t, testCorruptGzip) }

func testCorruptGzip(t *testing.T, transport bool) {
	var good bytes.Buffer
	zw := gzip.NewWriter(&good)
	_, _ = io.WriteString(zw, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
	_ = zw.Flush()
	bad := append(append([]byte{}, good.Bytes()...), []byte("this is not deflate data at all, not at all")...)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(bad)
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	if transport {
		r.viaTransport()
	}

	via := call(t, r.proxy.URL, chatPath, chatBody(true, `,"stream_options":{"include_usage":true}`), nil)
	if via.err != nil || !bytes.Equal(via.body, bad) {
		t.Fatalf("passed through: %v %q", via.err, via.body)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusError || ev.ErrorCode != CodeMalformedGzip {
		t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
	}
	via = call(t, r.proxy.URL, chatPath, chatBody(true, ""), nil)
	if via.err == nil {
		t.Fatalf("decoded: the client saw a whole response: %q", via.body)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusError || ev.ErrorCode != CodeMalformedGzip {
		t.Fatalf("event %s %q", ev.Status, ev.ErrorCode)
	}
}

// sdkDir holds the Node project that drives the proxy with the official SDKs (shared with
// the emitter's own SDK tests).
const sdkDir = "../../testdata/sdk"

func needNode(t *testing.T) { nodetest.Need(t, sdkDir) }

// TestGzipStreamWithOpenAISDK: the OpenAI SDK, not asking for usage, yields the same chunks
// through the proxy as directly when the upstream gzips its stream.
func TestGzipStreamWithOpenAISDK(t *testing.T) {
	needNode(t)
	r := newRig(t, fakellm.Options{TPOT: time.Millisecond}, nil)
	run := func(base string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", "gzip_stream.mjs", base)
		cmd.Dir = sdkDir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node gzip_stream.mjs %s: %v\n%s", base, err, stderr.String())
		}
		return out
	}
	direct, via := run(r.fake.URL), run(r.proxy.URL)
	if !bytes.Equal(direct, via) {
		t.Fatalf("the SDK saw different chunks through the proxy:\nvia    %s\ndirect %s", via, direct)
	}
	if bytes.Contains(via, []byte(`"usage":{`)) || !bytes.Contains(via, []byte(`"content":"`)) {
		t.Fatalf("chunks %s", via)
	}
	if ev := r.cap.next(t); ev.Status != events.StatusOK || ev.TokensEstimated || ev.OutputTokens != 6 {
		t.Fatalf("event %+v", ev)
	}
}

// TestModelListsWithSDKs: the OpenAI and Anthropic SDKs list models through a proxy whose
// routes send one provider's models to one upstream and the rest to the other, either way
// round, and each SDK gets its own provider's list, its key going to that provider only.
func TestModelListsWithSDKs(t *testing.T) {
	needNode(t)
	keys := make(chan string, 16)
	upstream := func(name, body string) *url.URL {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			keys <- name + " " + r.Header.Get("Authorization") + "|" + r.Header.Get("X-Api-Key")
			w.Header().Set("Content-Type", "application/json")
			answer := body
			if strings.HasPrefix(r.URL.Path, "/v1/models/") {
				answer = `{"type":"model","id":"` + strings.TrimPrefix(r.URL.Path, "/v1/models/") + `","display_name":"x","created_at":"2025-01-01T00:00:00Z"}`
			}
			_, _ = io.WriteString(w, answer)
		}))
		t.Cleanup(up.Close)
		u, _ := ParseUpstream(up.URL)
		return u
	}
	openai := upstream("openai", `{"object":"list","data":[{"id":"gpt-4o","object":"model","created":1700000000,"owned_by":"openai"}]}`)
	anthropic := upstream("anthropic", `{"data":[{"type":"model","id":"claude-sonnet-4-5","display_name":"Claude Sonnet 4.5","created_at":"2025-09-29T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-5","last_id":"claude-sonnet-4-5"}`)
	for _, cf := range []struct {
		name     string
		upstream *url.URL
		routes   []Route
	}{
		{"OpenAI by default, claude- routed", openai, []Route{{Prefix: "claude-", URL: anthropic}}},
		{"Anthropic by default, gpt- routed", anthropic, []Route{{Prefix: "gpt-", URL: openai}}},
	} {
		t.Run(cf.name, func(t *testing.T) {
			r := newRig(t, fakellm.Options{}, func(c *Config) {
				c.Upstream, c.Routes = cf.upstream, cf.routes
				if cf.upstream == anthropic {
					c.UpstreamAPI = APIAnthropic // what api.anthropic.com is taken for
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "node", "models.mjs", r.proxy.URL)
			cmd.Dir = sdkDir
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("node models.mjs: %v\n%s", err, stderr.String())
			}
			if want := `{"openai":["gpt-4o"],"anthropic":["claude-sonnet-4-5"],"anthropic_one":"claude-sonnet-4-5"}`; strings.TrimSpace(string(out)) != want {
				t.Fatalf("the SDKs listed %s, want %s", out, want)
			}
			for n := 0; n < 3; n++ {
				k := <-keys
				if name, key, _ := strings.Cut(k, " "); !strings.Contains(key, map[string]string{"openai": "sk-openai-test", "anthropic": "sk-ant-test"}[name]) {
					t.Fatalf("an upstream got another provider's key: %s", k)
				}
			}
		})
	}
}

// TestClientLeavesAfterTheTerminalEvent: a client that hangs up once it has read the
// stream's terminal event ([DONE], message_stop), before the upstream ends the body, as one
// that stops reading at [DONE] does, got the whole answer: its event is ok, with the usage
// reported, on net/http and detached alike. One that hangs up before it is canceled.
func TestClientLeavesAfterTheTerminalEvent(t *testing.T) {
	bothClients(t, testClientLeavesAfterTheTerminalEvent)
}

func testClientLeavesAfterTheTerminalEvent(t *testing.T, transport bool) {
	const (
		chat = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
		anthropic = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		s := chat
		if r.URL.Path == messagesPath {
			s = anthropic
		}
		first, rest, _ := strings.Cut(s, "\n\n")
		_, _ = io.WriteString(w, first+"\n\n")
		_ = rc.Flush()
		if d, err := time.ParseDuration(r.Header.Get("X-Test-Wait")); err == nil {
			time.Sleep(d) // past the detach: the proxy relays the stream itself
		}
		_, _ = io.WriteString(w, rest)
		_ = rc.Flush()
		select { // the body's end comes later, or never: the client is gone by then
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream, _ = ParseUpstream(up.URL) })
	if transport {
		r.viaTransport()
	}
	for _, tt := range []struct {
		name, path, body, stop string
		wait                   time.Duration
		want                   events.Status
	}{
		{"chat", chatPath, chatBody(true, ""), "data: [DONE]", 0, events.StatusOK},
		{"chat, detached", chatPath, chatBody(true, ""), "data: [DONE]", time.Second, events.StatusOK},
		{"messages", messagesPath, `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":5,"messages":[]}`, `data: {"type":"message_stop"}`, 0, events.StatusOK},
		{"messages, detached", messagesPath, `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":5,"messages":[]}`, `data: {"type":"message_stop"}`, time.Second, events.StatusOK},
		{"before the terminal event", chatPath, chatBody(true, ""), `data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}`, 300 * time.Millisecond, events.StatusCanceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, r.proxy.URL+tt.path, strings.NewReader(tt.body))
			req.Header.Set("X-Test-Wait", tt.wait.String())
			tr := &http.Transport{DisableCompression: true}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && sc.Text() != tt.stop {
			}
			resp.Body.Close() // the rest unread: the connection is closed
			ev := r.cap.next(t)
			if ev.Status != tt.want {
				t.Fatalf("event %s %q, want %s", ev.Status, ev.ErrorCode, tt.want)
			}
			if tt.want == events.StatusOK && (ev.InputTokens != 9 || ev.OutputTokens != 1 || ev.TokensEstimated || !ev.Stream) {
				t.Fatalf("tokens %d/%d estimated %v stream %v, want 9/1 as reported", ev.InputTokens, ev.OutputTokens, ev.TokensEstimated, ev.Stream)
			}
		})
	}
}
