package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestStalledWriteShows hangs ClickHouse (SIGSTOP) with a flush in flight and the default
// 5-minute write timeout: within seconds the stall is in /readyz and in
// aggregator_write_stalled_seconds, the buffered gauge keeps following the events that go on
// arriving, and once ClickHouse answers again the totals are exact.
func TestStalledWriteShows(t *testing.T) {
	if testing.Short() {
		t.Skip("hangs ClickHouse for about 15 s")
	}
	b := newBed(t)
	srv := testbed.Server(t)
	if err := srv.Pause(); err != nil {
		t.Skipf("cannot pause this ClickHouse: %v", err)
	}
	srv.Resume()
	addr := freeAddr(t)
	startAggregator(t, b.env(envVars{"HTTP_ADDR": addr, "AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "200ms", "AGG_GPU": "false"}))
	ev := func(ts time.Time) events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: ts, Model: "m", Scene: "chat", Env: "prod",
			InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	old := time.Now().UTC().Add(-time.Minute)
	batch := func(n int) []events.RequestEvent {
		evs := make([]events.RequestEvent, n)
		for i := range evs {
			evs[i] = ev(old.Add(time.Duration(i) * time.Millisecond))
		}
		return evs
	}
	b.publish(t, batch(100))
	b.waitRows(t, 30*time.Second, 100, "SELECT count() FROM requests")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	b.publish(t, batch(100)) // the flush of these hangs

	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	buffered := func() float64 { return metricValue(addr, "aggregator_buffered", `stream="tokens"`) }
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := readyz()
		stalled := metricValue(addr, "aggregator_write_stalled_seconds", `stream="tokens"`)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "clickhouse_writes") && stalled >= 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s into the stall: /readyz %d %s, write_stalled_seconds %.1f (want 503 naming clickhouse_writes, ≥ 10)", code, body, stalled)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The flush is stuck: what arrives now waits in memory, and the gauge follows it.
	before := buffered()
	for settled := false; !settled; {
		time.Sleep(1500 * time.Millisecond) // the gauges are read every second
		now := buffered()
		settled, before = now == before, now
	}
	b.publish(t, batch(300))
	deadline = time.Now().Add(15 * time.Second)
	for buffered() != before+300 {
		if time.Now().After(deadline) {
			t.Fatalf("buffered %.0f after 300 more events during the stall, want %.0f: the gauge is not live", buffered(), before+300)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	b.waitRows(t, time.Minute, 500, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 500, "SELECT count() FROM requests")
	deadline = time.Now().Add(15 * time.Second)
	for metricValue(addr, "aggregator_write_stalled_seconds", `stream="tokens"`) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("write_stalled_seconds stays above 0 after the write finished")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
