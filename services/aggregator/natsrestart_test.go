package main

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestNATSRestartMidStream restarts nats-server (same store, same port) twice while the
// aggregator holds open windows and flushes: its consumer, its floor saves and its rollup
// publishes all fail for a while, and once NATS is back the totals are exact.
func TestNATSRestartMidStream(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "js")
	ns := testbed.StartNATS(t, dir, -1)
	port := ns.Addr().(*net.TCPAddr).Port
	url := ns.ClientURL()
	chCfg := testbed.ClickHouse(t)
	ctx := context.Background()
	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	b := &bed{natsURL: url, ch: chCfg, db: db, js: js, nc: nc}
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn",
		"AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false"}))
	ev := func(ts time.Time) events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: ts, Model: "m", Scene: "chat", Env: "prod",
			InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	published := 0
	burst := func(n int) {
		evs := make([]events.RequestEvent, n)
		now := time.Now().UTC()
		for i := range evs {
			evs[i] = ev(now.Add(-time.Duration(n-i) * time.Millisecond))
		}
		b.publish(t, evs)
		published += n
	}
	restart := func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		time.Sleep(2 * time.Second)
		ns = testbed.StartNATS(t, dir, port)
		deadline := time.Now().Add(15 * time.Second)
		for !nc.IsConnected() {
			if time.Now().After(deadline) {
				t.Fatal("the test's connection did not come back")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for round := range 3 {
		for range 5 {
			burst(2000)
			time.Sleep(300 * time.Millisecond)
		}
		if round < 2 {
			restart()
		}
	}
	want := uint64(published)
	b.waitRows(t, 60*time.Second, want, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, want, "SELECT count() FROM requests")
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != want {
		t.Fatalf("sum(requests) = %d, want %d", got, want)
	}
	if got := b.scalar(t, "SELECT count() FROM requests"); got != want {
		t.Fatalf("count() FROM requests = %d, want %d", got, want)
	}
}
