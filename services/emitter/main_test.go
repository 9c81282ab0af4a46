package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/proxy"
)

func TestConfig(t *testing.T) {
	cfg, err := parseConfig(map[string]string{})
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	// Measured (make bench-linger): at 100–500 events/s nats-server spends 1.7–1.9× the CPU
	// per event with 5 ms than with 20 ms, and the emitter 1.05–1.16× its own.
	if cfg.PublishLinger != 20*time.Millisecond {
		t.Errorf("EMITTER_PUBLISH_LINGER defaults to %s, want 20ms", cfg.PublishLinger)
	}
	tests := []struct {
		name, key, value, want string
	}{
		{"bad upstream", "EMITTER_UPSTREAM_URL", "ftp://x", "EMITTER_UPSTREAM_URL"},
		{"bad routes", "EMITTER_UPSTREAMS", "claude-", "EMITTER_UPSTREAMS"},
		{"unknown upstream API", "EMITTER_UPSTREAM_API", "gemini", "EMITTER_UPSTREAM_API"},
		{"zero timeout", "EMITTER_UPSTREAM_TIMEOUT", "0s", "EMITTER_UPSTREAM_TIMEOUT"},
		{"negative idle", "EMITTER_STREAM_IDLE_TIMEOUT", "-1s", "EMITTER_STREAM_IDLE_TIMEOUT"},
		{"not a duration", "EMITTER_STREAM_IDLE_TIMEOUT", "soon", "EMITTER_STREAM_IDLE_TIMEOUT"},
		{"zero client idle", "EMITTER_CLIENT_IDLE_TIMEOUT", "0s", "EMITTER_CLIENT_IDLE_TIMEOUT"},
		{"no connections", "EMITTER_MAX_CONNECTIONS", "0", "EMITTER_MAX_CONNECTIONS"},
		{"parse memory under one body", "EMITTER_MAX_PARSE_MEMORY", "4096", "EMITTER_MAX_PARSE_MEMORY"},
		{"tiny ingest", "EMITTER_INGEST_MAX_BYTES", "10", "EMITTER_INGEST_MAX_BYTES"},
		{"ingest body over parse memory", "EMITTER_INGEST_MAX_BYTES", "1073741824", "EMITTER_MAX_PARSE_MEMORY=536870912 must be at least EMITTER_INGEST_MAX_BYTES"},
		{"OTLP request over parse memory", "EMITTER_OTLP_MAX_BYTES", "300000000", "EMITTER_MAX_PARSE_MEMORY=536870912 must be at least twice EMITTER_OTLP_MAX_BYTES"},
		{"tiny SSE event limit", "EMITTER_MAX_SSE_EVENT_BYTES", "100", "EMITTER_MAX_SSE_EVENT_BYTES"},
		{"no buffer", "EMITTER_PUBLISH_BUFFER", "0", "EMITTER_PUBLISH_BUFFER"},
		{"tiny buffer bytes", "EMITTER_PUBLISH_BUFFER_BYTES", "1000", "EMITTER_PUBLISH_BUFFER_BYTES"},
		{"probes on HTTP_ADDR", "EMITTER_PROBE_ADDR", "127.0.0.1:8080", "EMITTER_PROBE_ADDR"},
		{"negative linger", "EMITTER_PUBLISH_LINGER", "-1ms", "EMITTER_PUBLISH_LINGER"},
		{"long linger", "EMITTER_PUBLISH_LINGER", "2s", "EMITTER_PUBLISH_LINGER"},
		{"bad NATS", "NATS_URL", "::", "NATS_URL"},
		{"not a number", "NATS_STREAM_MAX_BYTES", "lots", "NATS_STREAM_MAX_BYTES"},
		{"bad log level", "LOG_LEVEL", "loud", "LOG_LEVEL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig(map[string]string{tt.key: tt.value})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v does not name %s", err, tt.want)
			}
		})
	}
}

// upstreams maps a rig's proxy address to its fake LLM's.
var upstreams sync.Map

func fakeUpstream(t testing.TB, base string) string {
	t.Helper()
	u, ok := upstreams.Load(base)
	if !ok {
		t.Fatalf("no fake upstream for %s", base)
	}
	return u.(string)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serveRig starts the whole service against an in-process NATS and a fake LLM.
func serveRig(t testing.TB, extra ...string) (base string, js jetstream.JetStream, stop func()) {
	t.Helper()
	return serveRigWith(t, fakellm.Options{TTFT: 5 * time.Millisecond, Tokens: 4}, extra...)
}

func serveRigWith(t testing.TB, opts fakellm.Options, extra ...string) (base string, js jetstream.JetStream, stop func()) {
	t.Helper()
	ns := testbed.NATS(t)
	fake := httptest.NewServer(fakellm.New(opts))
	t.Cleanup(fake.Close)
	addr := freeAddr(t)
	upstreams.Store("http://"+addr, fake.URL)
	environ := append([]string{"HTTP_ADDR=" + addr, "NATS_URL=" + ns.ClientURL(), "EMITTER_UPSTREAM_URL=" + fake.URL,
		"EMITTER_DEFAULT_ENV=test", "LOG_LEVEL=warn", "EMITTER_OTLP_HTTP_ADDR=off", "EMITTER_OTLP_GRPC_ADDR=off"}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, environ, io.Discard, io.Discard) }()
	base = "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not ready in 10s: %v (run: %v)", err, <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}
	nc, js := connectJS(t, ns.ClientURL())
	t.Cleanup(nc.Close)
	return base, js, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}
}

func connectJS(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func waitMsgs(t testing.TB, js jetstream.JetStream, want uint64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute) // a bound for a loaded machine: 100,000 events take it a minute
	for {
		s, err := js.Stream(context.Background(), events.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == want {
			return
		}
		if info.State.Msgs > want || time.Now().After(deadline) {
			t.Fatalf("%s holds %d messages, want %d", events.StreamEvents, info.State.Msgs, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestServeProxyAndIngestIntoJetStream(t *testing.T) {
	base, js, stop := serveRig(t, "EMITTER_INGEST_TOKEN=tok")

	// A streamed request through the proxy, with labels.
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a b c"}]}`))
	req.Header.Set(proxyScene, "support")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) || bytes.Contains(body, []byte(`"usage"`)) {
		t.Fatalf("proxied answer %d:\n%s", resp.StatusCode, body)
	}
	waitMsgs(t, js, 1)
	msg, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := msg.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var ev events.RequestEvent
	if err := events.UnmarshalRequest(raw.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if raw.Subject != "llm.req.test.support" || raw.Header.Get(jetstream.MsgIDHeader) != ev.EventID ||
		ev.Status != events.StatusOK || ev.InputTokens != 3 || ev.OutputTokens != 4 || ev.TokensEstimated {
		t.Fatalf("stored %s %v %+v", raw.Subject, raw.Header, ev)
	}

	// Ingest: the same batch twice; JetStream drops the duplicates by event id.
	var nd strings.Builder
	ts := time.Now().UTC().Format(events.TimeLayout)
	for i := range 5 {
		fmt.Fprintf(&nd, `{"v":1,"event_id":"ev-%d","ts":%q,"model":"m","scene":"s","env":"e","input_tokens":1,"output_tokens":1,"ttft_ms":1,"total_ms":2,"status":"ok"}`+"\n", i, ts)
	}
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(nd.String()))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var a struct{ Accepted int }
		_ = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || a.Accepted != 5 { // answered once stored
			t.Fatalf("ingest %d accepted %d", resp.StatusCode, a.Accepted)
		}
	}
	waitMsgs(t, js, 6)

	// The metrics show the proxy's and the publisher's counters. The second batch's
	// duplicate acks may still be on their way once the stream holds six messages.
	wants := []string{"emitter_proxy_inflight_streams 0", `emitter_proxy_rate_limited_total{provider="openai"} 0`,
		"emitter_published_duplicate_total 5", "emitter_ingest_events_accepted_total 10",
		// Every body is answered: the budget they share holds nothing.
		"emitter_request_body_bytes_held 0", `emitter_request_bodies_refused_total{route="otlp_grpc"} 0`}
	var missing []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mresp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		mb, _ := io.ReadAll(mresp.Body)
		mresp.Body.Close()
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(string(mb), want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range missing {
		t.Errorf("/metrics lacks %q", want)
	}
	stop()
}

const proxyScene = "X-Tokenscope-Scene"

// metric reads one unlabelled metric from the emitter's /metrics; -1 when it is not there.
func metric(t testing.TB, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// TestShutdownDrainsDetachedStreams: at SIGTERM (run's context ending), a stream the proxy took
// off net/http (internal/proxy, detach.go) is not cut: it is waited for within the grace, and
// its event is published.
func TestShutdownDrainsDetachedStreams(t *testing.T) {
	base, js, stop := serveRigWith(t, fakellm.Options{TTFT: 5 * time.Millisecond, TPOT: 100 * time.Millisecond, Tokens: 20},
		"EMITTER_SHUTDOWN_GRACE=10s")
	got := make(chan string, 1)
	go func() {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4o","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"a b c"}]}`))
		if err != nil {
			got <- err.Error()
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(b)
	}()
	for deadline := time.Now().Add(10 * time.Second); metric(t, base, "emitter_proxy_detached_streams") != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream was not detached")
		}
	}
	stop()
	select {
	case body := <-got:
		if !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("the client got %q", body)
		}
	case <-time.After(200 * time.Millisecond):
		t.Fatal("run returned before the stream ended")
	}
	waitMsgs(t, js, 1)
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var ev events.RequestEvent
	if err := events.UnmarshalRequest(raw.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Status != events.StatusOK || ev.OutputTokens != 20 {
		t.Fatalf("event %s %q, %d tokens", ev.Status, ev.ErrorCode, ev.OutputTokens)
	}
}

// TestShutdownPublishesWhatNetHTTPHolds: a stream still open when the shutdown grace runs
// out, one that never left net/http (gzip), is cut and its event published before run
// returns, not lost with the publisher stopped.
func TestShutdownPublishesWhatNetHTTPHolds(t *testing.T) {
	base, js, stop := serveRigWith(t, fakellm.Options{TTFT: 5 * time.Millisecond, TPOT: 200 * time.Millisecond, Tokens: 100},
		"EMITTER_SHUTDOWN_GRACE=300ms")
	started := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"a b c"}]}`))
		req.Header.Set("X-Fakellm-Mode", fakellm.ModeGzip)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
		started <- err
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	stop()
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	var raw *jetstream.RawStreamMsg
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if raw, err = s.GetMsg(context.Background(), 1); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event published: %v", err)
		}
	}
	var ev events.RequestEvent
	if err := events.UnmarshalRequest(raw.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Status != events.StatusError || ev.ErrorCode != proxy.CodeShutdown {
		t.Fatalf("event %s %q, want error %s", ev.Status, ev.ErrorCode, proxy.CodeShutdown)
	}
}

// TestConfigErrorsHideSecrets: an upstream URL's password or query (where an API key may
// be) never appears in the error that names the variable.
func TestConfigErrorsHideSecrets(t *testing.T) {
	tests := []struct{ name, key, value string }{
		{"bad scheme", "EMITTER_UPSTREAM_URL", "ftp://user:sk-secret@host/?key=sk-secret"},
		{"does not parse", "EMITTER_UPSTREAM_URL", "https://user:sk-secret@host:port%zz"},
		{"no host", "EMITTER_UPSTREAM_URL", "https:///v1?api_key=sk-secret"},
		{"bad route", "EMITTER_UPSTREAMS", "claude-=ftp://user:sk-secret@host"},
		{"route that does not parse", "EMITTER_UPSTREAMS", "claude-=https://u:sk-secret@h:1%zz"},
		{"a token as the user", "EMITTER_UPSTREAM_URL", "ftp://sk-secret@host/v1"},
		{"a token in a query that does not parse", "EMITTER_UPSTREAM_URL", "https://h:port/v1?token=sk-secret"},
		{"no scheme", "EMITTER_UPSTREAM_URL", "user:sk-secret@host"},
		{"the @host left out", "EMITTER_UPSTREAM_URL", "https://apikey:sk-secret"},
		{"a route with the @host left out", "EMITTER_UPSTREAMS", "claude-=https://apikey:sk-secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig(map[string]string{tt.key: tt.value})
			if err == nil || !strings.Contains(err.Error(), tt.key) || strings.Contains(err.Error(), "sk-secret") {
				t.Fatalf("error %v: want one naming %s without the secret", err, tt.key)
			}
		})
	}
}
