package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// lockedBuffer is a log destination the service and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestStopLogsWhatWasPublished: the emitter logs one line when it stops, with the events it
// measured and published in this run.
func TestStopLogsWhatWasPublished(t *testing.T) {
	ns := testbed.NATS(t)
	fake := httptest.NewServer(fakellm.New(fakellm.Options{Tokens: 3}))
	defer fake.Close()
	addr := freeAddr(t)
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, []string{"HTTP_ADDR=" + addr, "NATS_URL=" + ns.ClientURL(), "EMITTER_UPSTREAM_URL=" + fake.URL,
			"EMITTER_OTLP_HTTP_ADDR=off", "EMITTER_OTLP_GRPC_ADDR=off"}, &bytes.Buffer{}, &logs)
	}()
	base := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("emitter not ready in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 2 {
		resp, err := http.Post(base+"/v1/messages", "application/json", strings.NewReader(`{"model":"claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var stopped map[string]any
	for _, l := range logs.lines(t) {
		if l["msg"] == "stopped" {
			stopped = l
		}
	}
	if stopped == nil || stopped["service"] != "emitter" || stopped["events_emitted"] != 2.0 || stopped["published"] != 2.0 || stopped["publish_dropped"] != 0.0 {
		t.Fatalf("stop line %v, want one with 2 events emitted and published", stopped)
	}
}

// TestLogsHideUpstreamSecrets: the upstream URL the emitter logs at start has no password
// and no query.
func TestLogsHideUpstreamSecrets(t *testing.T) {
	ns := testbed.NATS(t)
	fake := httptest.NewServer(fakellm.New(fakellm.Options{Tokens: 3}))
	defer fake.Close()
	up := strings.Replace(fake.URL, "http://", "http://user:sk-secret@", 1) + "/v1?api_key=sk-secret"
	addr := freeAddr(t)
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, []string{"HTTP_ADDR=" + addr, "NATS_URL=" + ns.ClientURL(), "EMITTER_UPSTREAM_URL=" + up,
			"EMITTER_OTLP_HTTP_ADDR=off", "EMITTER_OTLP_GRPC_ADDR=off"}, &bytes.Buffer{}, &logs)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("emitter not ready in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var serving map[string]any
	for _, l := range logs.lines(t) {
		if l["msg"] == "serving" {
			serving = l
		}
	}
	logs.mu.Lock()
	all := logs.b.String()
	logs.mu.Unlock()
	if serving == nil || !strings.Contains(fmt.Sprint(serving["upstream"]), strings.TrimPrefix(fake.URL, "http://")) || strings.Contains(all, "sk-secret") {
		t.Fatalf("logs %s: want the upstream's host without its secrets", all)
	}
}

// TestLogsProxyOff: with EMITTER_UPSTREAM_URL=none the start log says the proxy is off, and
// the serving line's upstream is none.
func TestLogsProxyOff(t *testing.T) {
	ns := testbed.NATS(t)
	addr := freeAddr(t)
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, []string{"HTTP_ADDR=" + addr, "NATS_URL=" + ns.ClientURL(), "EMITTER_UPSTREAM_URL=none",
			"EMITTER_OTLP_HTTP_ADDR=off", "EMITTER_OTLP_GRPC_ADDR=off"}, &bytes.Buffer{}, &logs)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("emitter not ready in 10s")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var off, serving bool
	for _, l := range logs.lines(t) {
		msg, _ := l["msg"].(string)
		off = off || strings.HasPrefix(msg, "the proxy is off (EMITTER_UPSTREAM_URL=none)")
		serving = serving || msg == "serving" && l["upstream"] == "none"
	}
	if !off || !serving {
		t.Fatalf("start log does not say the proxy is off:\n%v", logs.lines(t))
	}
}
