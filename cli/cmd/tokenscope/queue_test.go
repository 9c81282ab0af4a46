package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/cli/internal/stack"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestQueueIncidentNamesQueueTime runs the whole stack as the demo does — the fake LLM as
// a fake engine (a batch of 24), gpuwatch scraping its /metrics, the aggregator, the alerter,
// the real NATS and ClickHouse — and a load burst beyond the batch 20 s in. The queue must
// show in engine_rollups, the TTFT alert of the proxied scene must fire and name queue time
// (not prefill time) in its engine cause, on the ALERTS stream and in the alerts table.
func TestQueueIncidentNamesQueueTime(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack for about two minutes; run without -short")
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
		done <- run(ctx, []string{"demo", "--any-port", "--dir", dir, "--bin", bin, "--build=false", "--plain", "--gpu", "synthetic",
			"--window", "5s", "--view", "1m", "--refresh", "5s", "--incident", "at=20s,for=90s,every=10m"}, os.Getenv, &out, &out)
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		cancel()
		<-done
		t.Fatalf(format+"\noutput:\n%s", append(args, out.String())...)
	}
	env := map[string]string{}
	for deadline := time.Now().Add(3 * time.Minute); env["NATS_URL"] == ""; {
		if b, err := os.ReadFile(filepath.Join(dir, "stack.env")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok {
					env[k] = v
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
	nc, err := nats.Connect(env["NATS_URL"])
	if err != nil {
		fail("cannot connect to the demo's NATS: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fail("%v", err)
	}
	db, err := chdb.Open(ctx, chdb.Config{Addr: env["CLICKHOUSE_ADDR"], DB: "tokenscope", User: "default", DialTimeout: 5 * time.Second})
	if err != nil {
		fail("cannot open the demo's ClickHouse: %v", err)
	}
	defer db.Close()

	// The alerts as they are published, from the stream's first message.
	var cons jetstream.Consumer
	for deadline := time.Now().Add(time.Minute); ; {
		if cons, err = js.OrderedConsumer(ctx, events.StreamAlerts, jetstream.OrderedConsumerConfig{}); err == nil {
			break
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) || time.Now().After(deadline) {
			fail("cannot read ALERTS: %v", err)
		}
		time.Sleep(time.Second)
	}
	var ttft *events.Alert
	var others []string
	for deadline := time.Now().Add(3 * time.Minute); ttft == nil; {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			fail("cannot fetch alerts: %v", err)
		}
		for m := range batch.Messages() {
			var a events.Alert
			if err := json.Unmarshal(m.Data(), &a); err != nil {
				fail("an alert that does not decode: %v", err)
			}
			if strings.HasPrefix(a.Rule, "ttft_p95") && a.State == events.AlertFiring && a.Labels["scene"] == "chat" && ttft == nil {
				ttft = &a
			} else {
				others = append(others, a.Rule+" "+a.State)
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the demo stopped: %v\noutput:\n%s", err, out.String())
		default:
		}
		if ttft == nil && time.Now().After(deadline) {
			fail("no TTFT alert on the chat scene within 3 minutes (other alerts: %v)", others)
		}
	}
	c := ttft.EngineCause
	if c == nil {
		fail("the TTFT alert has no engine cause: %+v", ttft)
	}
	if c.Cause != events.CauseQueueTime || c.QueueP95Ms <= c.PrefillP95Ms || c.QueueP95Ms-c.QueueRefMs < 1000 || c.Engine != "vllm" || c.Model != "llama-3.1-70b" {
		fail("the TTFT alert's cause is %+v: want queue time, grown by more than a second, above prefill time", c)
	}
	if !strings.Contains(ttft.Summary, "queue time grew") {
		fail("summary %q does not name queue time", ttft.Summary)
	}
	t.Logf("%s: %s", ttft.Rule, ttft.Summary)

	// The queue in engine_rollups, and the alert's row with its summary.
	var queueMax float64
	var rows uint64
	for deadline := time.Now().Add(time.Minute); ; {
		if err := db.Conn().QueryRow(ctx, "SELECT max(queue_depth_max) FROM engine_rollups WHERE model = 'llama-3.1-70b'").Scan(&queueMax); err != nil {
			fail("%v", err)
		}
		if err := db.Conn().QueryRow(ctx, "SELECT count() FROM alerts WHERE fingerprint = ? AND state = 'firing' AND position(summary, 'queue time grew') > 0",
			ttft.Fingerprint).Scan(&rows); err != nil && !strings.Contains(err.Error(), "doesn't exist") {
			fail("%v", err)
		}
		if queueMax >= 20 && rows > 0 {
			break
		}
		if time.Now().After(deadline) {
			fail("engine_rollups' deepest queue %v (want ≥ 20 waiting), %d alert rows naming queue time", queueMax, rows)
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(out.String(), "queue time grew (engine ") {
		fail("the demo's screen does not show the cause")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the demo did not stop cleanly: %v", err)
	}
}
