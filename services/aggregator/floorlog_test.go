package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
)

// logBuffer keeps what the aggregator logs, to count its lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *logBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *logBuffer) count(s string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Count(c.buf.String(), s)
}

// TestFloorSaveFailureLoggedOnce: while the floor cannot be saved (the AGGREGATOR bucket
// gone), every flush fails to save it and its acked mark, and the log says so once each,
// not once a flush; once they are saved again, it says that too.
func TestFloorSaveFailureLoggedOnce(t *testing.T) {
	b := newBed(t)
	log := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	vars := b.env(envVars{"AGG_WINDOW": "1s", "AGG_LATENESS": "0s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "info",
		"AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false"})
	go func() { done <- run(ctx, vars.get, log) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	}()
	ev := func() events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: time.Now().UTC().Add(-time.Minute), Model: "m", Scene: "chat", Env: "prod",
			InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	b.publish(t, []events.RequestEvent{ev()})
	b.waitRows(t, 30*time.Second, 1, "SELECT sum(requests) FROM token_rollups")
	if err := b.js.DeleteKeyValue(context.Background(), pipeline.FloorBucket); err != nil {
		t.Fatal(err)
	}
	// Eight flushes, each of another event, each failing to save its floor.
	for i := range 8 {
		b.publish(t, []events.RequestEvent{ev()})
		b.waitRows(t, 10*time.Second, uint64(i+2), "SELECT sum(requests) FROM token_rollups")
	}
	for _, msg := range []string{"cannot save the floor;", "cannot save the acked mark;"} {
		if n := log.count(msg); n != 1 {
			t.Errorf("logged %q %d times over 8 flushes that could not save it, want once", msg, n)
		}
	}
	if _, err := bus.EnsureKeyValue(context.Background(), b.js, pipeline.FloorBucket, "", 1); err != nil {
		t.Fatal(err)
	}
	b.publish(t, []events.RequestEvent{ev()})
	b.waitRows(t, 10*time.Second, 10, "SELECT sum(requests) FROM token_rollups")
	deadline := time.Now().Add(10 * time.Second)
	for log.count("saving the floor again") != 1 || log.count("saving the acked mark again") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("no log line that the floor and the acked mark are saved again")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
