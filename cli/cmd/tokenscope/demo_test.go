package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/report"
	"github.com/tokenscope/tokenscope/cli/internal/stack"
	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// TestDemo starts the whole demo stack on free ports for about half a minute: rows from
// both loads and from the fake engine (through gpuwatch) must land in ClickHouse, the
// table and the engine view must render them, the business view must show conversations,
// their turns and completion, satisfaction, quality and cost, and cancelling (Ctrl-C)
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
	deadline = time.Now().Add(90 * time.Second)
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
		// The business layer: both scenes' users hold conversations that end with an
		// outcome (support: on its last request; chat, behind the proxy: task_completed
		// posted to /v1/feedback), both models are priced, and the business view answers.
		var chatConvs, chatTasks, unpriced uint64
		q("SELECT uniqExact(conversation_id) FROM requests WHERE scene = 'chat' AND provider = 'openai' AND conversation_id != '' AND turn > 0", &chatConvs)
		q("SELECT count() FROM feedback WHERE scene = 'chat' AND name = 'task_completed' AND conversation_id != ''", &chatTasks)
		q("SELECT sum(unpriced) FROM token_rollups WHERE scene IN ('chat', 'support')", &unpriced)
		missing := businessMissing(ctx, chAddr)
		if chat > 0 && support > 0 && reqs > 0 && gpu > 0 && engineSpans && verdicts > 0 && eng > 0 && strings.Contains(o, "TTFT p50") && strings.Contains(o, "queue p95") &&
			strings.Contains(o, "llama-3.1-70b") && strings.Contains(o, "qwen2.5-72b") && chatConvs > 0 && chatTasks > 0 && unpriced == 0 && missing == "" {
			break
		}
		if time.Now().After(deadline) {
			fail("after 90 s: chat %d, support %d requests in token_rollups, %d proxied requests, %d GPU rollups, engine spans %v, %d support verdicts, %d engine rollups, "+
				"%d chat conversations, %d chat task_completed verdicts, %d unpriced requests; business view: %s",
				chat, support, reqs, gpu, engineSpans, verdicts, eng, chatConvs, chatTasks, unpriced, missing)
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

// businessMissing runs `tokenscope report --business` on the demo's ClickHouse and says
// which of its sections lack figures: conversations with turns and a completion rate,
// thumbs and quality scores, cost per conversation; "" when none does.
func businessMissing(ctx context.Context, chAddr string) string {
	env := map[string]string{"CLICKHOUSE_ADDR": chAddr, "CLICKHOUSE_DB": "tokenscope"}
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"report", "--business", "--last", "10m", "--json"}, func(k string) string { return env[k] }, &out, &errOut); err != nil {
		return fmt.Sprintf("report --business: %v %s", err, errOut.String())
	}
	var b report.Business
	if err := json.Unmarshal(out.Bytes(), &b); err != nil {
		return fmt.Sprintf("report --business --json: %v", err)
	}
	rows := map[string][]map[string]any{}
	for _, s := range b.Sections {
		rows[s.Query] = s.Rows
	}
	num := func(r map[string]any, k string) float64 {
		f, _ := r[k].(float64)
		return f
	}
	var missing []string
	if c := rows["conversations.sql"]; len(c) != 1 || num(c[0], "conversations") == 0 || num(c[0], "avg_turns") < 1.5 ||
		num(c[0], "completed") == 0 || num(c[0], "abandoned") == 0 || !(num(c[0], "completion_rate") > 0) {
		missing = append(missing, fmt.Sprintf("conversations %v", c))
	}
	var thumbs, quality bool
	for _, r := range rows["quality_by_scene_model.sql"] {
		thumbs = thumbs || num(r, "thumbs") > 0
		quality = quality || num(r, "quality_scores") > 0
	}
	if !thumbs || !quality {
		missing = append(missing, fmt.Sprintf("satisfaction and quality %v", rows["quality_by_scene_model.sql"]))
	}
	costs := map[string]bool{}
	for _, r := range rows["cost_per_satisfied_conversation.sql"] {
		if num(r, "cost_per_conversation") > 0 && num(r, "rated_conversations") > 0 {
			costs[fmt.Sprint(r["scene"])] = true
		}
	}
	if !costs["chat"] || !costs["support"] {
		missing = append(missing, fmt.Sprintf("cost per conversation %v", rows["cost_per_satisfied_conversation.sql"]))
	}
	return strings.Join(missing, "; ")
}
