package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// TestConfigUpstreamNone: EMITTER_UPSTREAM_URL=none, in any case, turns the proxy off; a
// value that is no URL says so, and any other bad URL keeps its error.
func TestConfigUpstreamNone(t *testing.T) {
	for _, v := range []string{"none", "NONE", " None "} {
		cfg, err := parseConfig(map[string]string{"EMITTER_UPSTREAM_URL": v})
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if cfg.proxyConfig(nil).Upstream != nil {
			t.Fatalf("%q does not turn the proxy off", v)
		}
	}
	if _, err := parseConfig(map[string]string{"EMITTER_UPSTREAM_URL": "none", "EMITTER_UPSTREAMS": "claude-=https://api.anthropic.com"}); err != nil {
		t.Fatalf("none beside routes: %v", err)
	}
	for _, tt := range []struct{ name, key, value, want string }{
		{"off is not none", "EMITTER_UPSTREAM_URL", "off", "must be http:// or https:// with a host, or none (in any case) to turn the proxy off"},
		{"no scheme", "EMITTER_UPSTREAM_URL", "api.openai.com", "or none (in any case) to turn the proxy off"},
		{"another scheme", "EMITTER_UPSTREAM_URL", "ftp://up.example", `EMITTER_UPSTREAM_URL: upstream URL "ftp://up.example" must be http:// or https:// with a host`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig(map[string]string{tt.key: tt.value})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
			if strings.Contains(tt.value, "://") && strings.Contains(err.Error(), "none") {
				t.Fatalf("error %v mentions none for a URL", err)
			}
		})
	}
	_, err := parseConfig(map[string]string{"EMITTER_UPSTREAM_URL": "none", "EMITTER_UPSTREAM_API": "openai"})
	if err == nil || !strings.Contains(err.Error(), "EMITTER_UPSTREAM_API") {
		t.Fatalf("EMITTER_UPSTREAM_API beside none: %v", err)
	}
}

// refusedOff posts to a proxied path and checks the 503 and its error shape.
func refusedOff(t *testing.T, method, url, body string, anthropic bool) (message string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	return refusedOffReq(t, req, anthropic)
}

func refusedOffReq(t *testing.T, req *http.Request, anthropic bool) (message string) {
	t.Helper()
	method, url := req.Method, req.URL
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Type  string
		Error struct{ Type, Message, Code string }
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(b, &e) != nil ||
		!strings.Contains(e.Error.Message, "EMITTER_UPSTREAM_URL=none") {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	if anthropic && (e.Type != "error" || e.Error.Type != "api_error") || !anthropic && e.Error.Code != "proxy_off" {
		t.Fatalf("%s %s: not in its API's error shape: %s", method, url, b)
	}
	// The OpenAI and Anthropic SDKs retry every 5xx unless told not to: the proxy stays off
	// however often they ask.
	if got := resp.Header.Get("X-Should-Retry"); got != "false" {
		t.Fatalf("%s %s: X-Should-Retry %q, want false", method, url, got)
	}
	return e.Error.Message
}

func ingestFive(t *testing.T, base string) {
	t.Helper()
	var nd strings.Builder
	ts := time.Now().UTC().Format(events.TimeLayout)
	for i := range 5 {
		fmt.Fprintf(&nd, `{"v":1,"event_id":"ev-%d","ts":%q,"model":"m","scene":"s","env":"e","input_tokens":1,"output_tokens":1,"ttft_ms":1,"total_ms":2,"status":"ok"}`+"\n", i, ts)
	}
	resp, err := http.Post(base+"/v1/events", "application/x-ndjson", strings.NewReader(nd.String()))
	if err != nil {
		t.Fatal(err)
	}
	var a struct{ Accepted int }
	_ = json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || a.Accepted != 5 {
		t.Fatalf("ingest %d accepted %d", resp.StatusCode, a.Accepted)
	}
}

// TestServeProxyOff: with EMITTER_UPSTREAM_URL=none the emitter is ready with no upstream
// (serveRig waits for /readyz), every proxied route answers 503 in its API's error shape
// and publishes nothing, and the ingest stores what it is given.
func TestServeProxyOff(t *testing.T) {
	base, js, stop := serveRig(t, "EMITTER_UPSTREAM_URL=none")
	defer stop()
	refusedOff(t, http.MethodPost, base+"/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[]}`, false)
	refusedOff(t, http.MethodPost, base+"/v1/responses", `{"model":"gpt-4o","input":"hi"}`, false)
	refusedOff(t, http.MethodPost, base+"/v1/messages", `{"model":"claude-sonnet-4","max_tokens":4,"messages":[]}`, true)
	refusedOff(t, http.MethodGet, base+"/v1/models", "", false)
	ingestFive(t, base)
	waitMsgs(t, js, 5)
	if n := metric(t, base, "emitter_events_emitted_total"); n != 0 {
		t.Fatalf("the refused requests published %v events", n)
	}
	if n := metric(t, base, `emitter_proxy_refused_total{reason="proxy_off"}`); n != 4 {
		t.Fatalf("emitter_proxy_refused_total{reason=\"proxy_off\"} = %v, want 4", n)
	}
}

// TestServeProxyOffWithRoutes: EMITTER_UPSTREAM_URL=none beside EMITTER_UPSTREAMS proxies
// the models the routes name, and answers 503 for the others.
func TestServeProxyOffWithRoutes(t *testing.T) {
	fake := httptest.NewServer(fakellm.New(fakellm.Options{TTFT: time.Millisecond, Tokens: 4}))
	defer fake.Close()
	base, js, stop := serveRig(t, "EMITTER_UPSTREAM_URL=none", "EMITTER_UPSTREAMS=gpt-="+fake.URL)
	defer stop()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"gpt-4o","max_tokens":4,"messages":[{"role":"user","content":"a"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("routed model: %d %s", resp.StatusCode, b)
	}
	// The OpenAI SDK's model list goes to the gpt- route.
	resp, err = http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models: %d", resp.StatusCode)
	}
	// The answer names what no route took: the model, or the API of a request naming none.
	if msg := refusedOff(t, http.MethodPost, base+"/v1/chat/completions", `{"model":"llama-3","messages":[]}`, false); !strings.Contains(msg, `"llama-3"`) {
		t.Fatalf("the refusal does not name the model: %s", msg)
	}
	// The model is the client's bytes: the answer stays JSON (refusedOff decodes it), and short.
	if msg := refusedOff(t, http.MethodPost, base+"/v1/chat/completions", `{"model":"x\u0000\"\u00ff`+strings.Repeat("y", 4096)+`","messages":[]}`, false); len(msg) > 400 {
		t.Fatalf("the refusal quotes %d bytes", len(msg))
	}
	refusedOff(t, http.MethodPost, base+"/v1/messages", `{"model":"claude-sonnet-4","max_tokens":4,"messages":[]}`, true)
	// Anthropic's model list: no claude- route. The passthrough counts what it forwards only.
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	if msg := refusedOffReq(t, req, true); !strings.Contains(msg, "names no model") || !strings.Contains(msg, "claude-") {
		t.Fatalf("the refusal of a request naming no model does not say which route it wanted: %s", msg)
	}
	if n := metric(t, base, "emitter_proxy_passthrough_total"); n != 1 {
		t.Fatalf("emitter_proxy_passthrough_total = %v, want 1 (the gpt- route's model list)", n)
	}
	waitMsgs(t, js, 1) // the routed request's event only
	if n := metric(t, base, `emitter_proxy_refused_total{reason="proxy_off"}`); n != 4 {
		t.Fatalf("emitter_proxy_refused_total{reason=\"proxy_off\"} = %v, want 4", n)
	}
}

// TestServeProxyOffBodies: a refused request's body is left to net/http, which never holds
// it: a small one is discarded and the connection serves the next request, a large one
// (declared or chunked) gets its 503 before the emitter closes the connection.
func TestServeProxyOffBodies(t *testing.T) {
	base, _, stop := serveRig(t, "EMITTER_UPSTREAM_URL=none")
	defer stop()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(body io.Reader, length int64) (status int, reused bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", body)
		req.ContentLength = length
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused }}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%d bytes: %v", length, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, reused
	}
	small := `{"model":"gpt-4o","messages":[]}`
	for i := range 3 {
		status, reused := post(strings.NewReader(small), int64(len(small)))
		if status != http.StatusServiceUnavailable || i > 0 && !reused {
			t.Fatalf("small body %d: %d, connection reused %v", i, status, reused)
		}
	}
	big := bytes.Repeat([]byte("x"), 8<<20)
	if status, _ := post(bytes.NewReader(big), int64(len(big))); status != http.StatusServiceUnavailable {
		t.Fatalf("8 MiB body: %d", status)
	}
	if status, _ := post(io.MultiReader(bytes.NewReader(big)), -1); status != http.StatusServiceUnavailable {
		t.Fatalf("8 MiB chunked body: %d", status)
	}
	if n := metric(t, base, `emitter_proxy_refused_total{reason="proxy_off"}`); n != 5 {
		t.Fatalf("emitter_proxy_refused_total{reason=\"proxy_off\"} = %v, want 5", n)
	}
}

// TestOfficialSDKsProxyOff: the OpenAI and Anthropic SDKs, with their default retries, get
// the proxy-off 503 as an API error on their first request and do not ask again.
func TestOfficialSDKsProxyOff(t *testing.T) {
	needNode(t)
	base, _, stop := serveRig(t, "EMITTER_UPSTREAM_URL=none")
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "proxyoff.mjs", base)
	cmd.Dir = sdkDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node proxyoff.mjs: %v\n%s", err, stderr.String())
	}
	var got struct{ OpenAI, Anthropic struct{ Status int } }
	if err := json.Unmarshal(out, &got); err != nil || got.OpenAI.Status != http.StatusServiceUnavailable || got.Anthropic.Status != http.StatusServiceUnavailable ||
		!strings.Contains(string(out), `"code":"proxy_off"`) || !strings.Contains(string(out), `"code":"api_error"`) {
		t.Fatalf("the SDKs saw %s", out)
	}
	if n := metric(t, base, `emitter_proxy_refused_total{reason="proxy_off"}`); n != 2 {
		t.Fatalf("the SDKs sent %v requests, want 2: they retried a refusal (%s)", n, out)
	}
}
