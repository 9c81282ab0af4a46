package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/stack"
	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// TestDemo starts the whole demo stack on free ports for about half a minute: rows from
// both loads and from the fake engine (through gpuwatch) must land in ClickHouse, the
// table and the engine view must render them, and cancelling (Ctrl-C)
// must stop every child in reverse order.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo smoke test starts the whole stack for ~30 s; run without -short")
	}
	if _, err := stack.ClickHouseCommand(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	bin := services(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"demo", "--any-port", "--dir", dir, "--bin", bin, "--build=false", "--plain",
			"--window", "2s", "--view", "2m", "--refresh", "1s", "--speed", "2"}, os.Getenv, &out, &out)
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		cancel()
		<-done
		t.Fatalf(format+"\noutput:\n%s", append(args, out.String())...)
	}

	var chAddr, emitterURL string
	deadline := time.Now().Add(3 * time.Minute)
	for chAddr == "" {
		if b, err := os.ReadFile(filepath.Join(dir, "stack.env")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "CLICKHOUSE_ADDR="); ok {
					chAddr = v
				}
				if v, ok := strings.CutPrefix(l, "EMITTER_URL="); ok {
					emitterURL = v
				}
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the demo stopped while starting: %v\noutput:\n%s", err, out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			fail("the demo did not start within 3 minutes")
		}
	}
	db, err := chdb.Open(ctx, chdb.Config{Addr: chAddr, DB: "tokenscope", User: "default", DialTimeout: 5 * time.Second})
	if err != nil {
		fail("cannot open the demo's ClickHouse: %v", err)
	}
	defer db.Close()

	// Both scenes must reach token_rollups (through the aggregator), the proxied one must
	// reach requests too, GPU rollups must come from gpuwatch, and the support scene's
	// simulated users' verdicts must reach feedback.
	deadline = time.Now().Add(60 * time.Second)
	for {
		var chat, support, reqs, gpu, verdicts, eng uint64
		q := func(sql string, dst *uint64) {
			if err := db.Conn().QueryRow(ctx, sql).Scan(dst); err != nil && !strings.Contains(err.Error(), "doesn't exist") {
				fail("%s: %v", sql, err)
			}
		}
		q("SELECT sum(requests) FROM token_rollups WHERE scene = 'chat' AND env = 'demo'", &chat)
		q("SELECT sum(requests) FROM token_rollups WHERE scene = 'support'", &support)
		q("SELECT count() FROM requests WHERE scene = 'chat' AND provider = 'openai'", &reqs)
		q("SELECT count() FROM gpu_rollups", &gpu)
		q("SELECT count() FROM feedback WHERE scene = 'support' AND name = 'thumbs'", &verdicts)
		q("SELECT count() FROM engine_rollups WHERE model = 'llama-3.1-70b' AND up_samples > 0", &eng)
		o := out.String()
		// The fake LLM's llm_request spans reach the emitter's OTLP receiver.
		var engineSpans bool
		if resp, err := http.Get(emitterURL + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			engineSpans = strings.Contains(string(b), `emitter_otlp_spans_accepted_total{layer="engine"}`) &&
				!strings.Contains(string(b), `emitter_otlp_spans_accepted_total{layer="engine"} 0`+"\n")
		}
		if chat > 0 && support > 0 && reqs > 0 && gpu > 0 && engineSpans && verdicts > 0 && eng > 0 && strings.Contains(o, "TTFT p50") && strings.Contains(o, "queue p95") &&
			strings.Contains(o, "llama-3.1-70b") && strings.Contains(o, "qwen2.5-72b") {
			break
		}
		if time.Now().After(deadline) {
			fail("after 60 s: chat %d, support %d requests in token_rollups, %d proxied requests, %d GPU rollups, engine spans %v, %d support verdicts, %d engine rollups",
				chat, support, reqs, gpu, engineSpans, verdicts, eng)
		}
		select {
		case err := <-done:
			t.Fatalf("the demo stopped on its own: %v\noutput:\n%s", err, out.String())
		case <-time.After(time.Second):
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the demo did not stop cleanly: %v\noutput:\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the demo did not stop within 2 minutes\noutput:\n%s", out.String())
	}
	o := out.String()
	order := []string{"stopped replay-support", "stopped replay-chat", "stopped emitter", "stopped gpuwatch", "stopped fakellm",
		"stopped alerter", "stopped aggregator", "stopped ClickHouse", "stopped NATS", "logs: " + filepath.Join(dir, "logs")}
	at := 0
	for _, s := range order {
		i := strings.Index(o[at:], s)
		if i < 0 {
			t.Fatalf("%q missing or out of order in:\n%s", s, o)
		}
		at += i
	}
	for _, n := range []string{"aggregator", "alerter", "emitter", "gpuwatch", "fakellm"} {
		if _, err := os.Stat(filepath.Join(dir, "logs", n+".log")); err != nil {
			t.Fatalf("no log for %s: %v", n, err)
		}
	}
}
