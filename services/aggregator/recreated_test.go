package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
)

// TestRecreatedStreamStopsTheStart: once LLM_EVENTS is deleted and made again (a NATS
// store lost, a stream removed by hand), its positions start again at 1, and the floor and
// the ledger this AGG_CONSUMER left would take its new messages for stored ones: the new
// events would wait for a position the stream reached long ago, or be left out of
// requests. The start stops with an error that says so; started under a new AGG_CONSUMER
// the aggregator counts every new event.
func TestRecreatedStreamStopsTheStart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dropFloor bool // the AGGREGATOR bucket is lost with the stream
	}{
		{"floor kept", false},
		{"floor lost", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t)
			vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms",
				"AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false"})
			ev := func(ts time.Time) events.RequestEvent {
				return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: ts, Model: "m", Scene: "chat", Env: "prod",
					InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
			}
			batch := func(n int, at time.Time) []events.RequestEvent {
				var evs []events.RequestEvent
				for i := range n {
					evs = append(evs, ev(at.Add(time.Duration(i)*time.Millisecond)))
				}
				return evs
			}
			b.publish(t, batch(50, time.Now().UTC().Add(-2*time.Minute)))
			stop := startAggregator(t, vars)
			b.waitRows(t, 30*time.Second, 50, "SELECT sum(requests) FROM token_rollups")
			b.waitRows(t, 30*time.Second, 50, "SELECT count() FROM requests")
			stop()

			ctx := context.Background()
			if err := b.js.DeleteStream(ctx, events.StreamEvents); err != nil {
				t.Fatal(err)
			}
			if tc.dropFloor {
				if err := b.js.DeleteKeyValue(ctx, pipeline.FloorBucket); err != nil {
					t.Fatal(err)
				}
			}
			if err := bus.EnsureStreams(ctx, b.js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}, events.StreamEvents); err != nil {
				t.Fatal(err)
			}
			b.publish(t, batch(10, time.Now().UTC().Add(-time.Minute)))

			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			err := run(rctx, vars.get, testWriter{t})
			if err == nil || !strings.Contains(err.Error(), "AGG_CONSUMER") {
				t.Fatalf("start on the recreated stream: %v; want an error naming AGG_CONSUMER", err)
			}
			t.Log(err)

			vars["AGG_CONSUMER"] = "aggregator-2"
			startAggregator(t, vars)
			b.waitRows(t, 30*time.Second, 60, "SELECT sum(requests) FROM token_rollups")
			b.waitRows(t, 30*time.Second, 60, "SELECT count() FROM requests")
		})
	}
}

// TestRecreatedStreamShowsWhileRunning: a stream made again under a running aggregator
// would have its new messages wait, unread, for a position the old one had reached, with no
// error and no lag to show it: within seconds /readyz fails and says what to do, and the
// log says it once.
func TestRecreatedStreamShowsWhileRunning(t *testing.T) {
	b := newBed(t)
	addr := freeAddr(t)
	startAggregator(t, b.env(envVars{"HTTP_ADDR": addr, "AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms",
		"AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false"}))
	var evs []events.RequestEvent
	for i := range 50 {
		evs = append(evs, events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: time.Now().UTC().Add(-time.Minute + time.Duration(i)*time.Millisecond),
			Model: "m", Scene: "chat", Env: "prod", InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK})
	}
	b.publish(t, evs)
	b.waitRows(t, 30*time.Second, 50, "SELECT sum(requests) FROM token_rollups")
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz = %d %s before the stream was made again", code, body)
	}
	ctx := context.Background()
	if err := b.js.DeleteStream(ctx, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, b.js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	b.publish(t, evs[:10])
	deadline := time.Now().Add(25 * time.Second)
	for {
		code, body := readyz()
		if code == http.StatusServiceUnavailable && strings.Contains(body, "AGG_CONSUMER") {
			t.Log(body)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %s 25 s after the stream was made again; want 503 saying so", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
