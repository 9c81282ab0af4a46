package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
)

// rollupKind is one kind of rollup as published and stored: its subjects' prefix, its table,
// and the count each row and message carries (requests, samples).
type rollupKind struct{ prefix, table, count string }

var (
	tokenRollups = rollupKind{"rollup.tokens.", "token_rollups", "requests"}
	gpuRollups   = rollupKind{"rollup.gpu.", "gpu_rollups", "samples"}
)

// rollupsOnStream reads ROLLUPS and returns how many times each rollup of kind k is on it by
// message id, the sum of their counts (each id counted once), and, in stream order, the
// window rollups that came after a watermark of consumer covering their window and the
// watermarks of consumer that did not move forward.
func rollupsOnStream(t *testing.T, b *bed, consumer string, k rollupKind) (ids map[string]int, count uint64, outOfOrder []string) {
	t.Helper()
	ids = map[string]int{}
	var covered time.Time
	for _, m := range b.rollupsStream(t) {
		switch {
		case m.subject == events.WatermarkSubject(consumer):
			var w events.Watermark
			if err := json.Unmarshal(m.data, &w); err != nil {
				t.Fatalf("watermark %d: %v", m.seq, err)
			}
			if !w.Through.After(covered) {
				outOfOrder = append(outOfOrder, fmt.Sprintf("seq %d: a watermark through %s after one through %s", m.seq, w.Through, covered))
				continue
			}
			covered = w.Through
		case strings.HasPrefix(m.subject, k.prefix):
			var r struct {
				WindowStart   time.Time `json:"window_start"`
				WindowSeconds int       `json:"window_seconds"`
				Kind          string    `json:"kind"`
			}
			var counts map[string]any
			if err := json.Unmarshal(m.data, &r); err != nil {
				t.Fatalf("rollup %d: %v", m.seq, err)
			}
			if err := json.Unmarshal(m.data, &counts); err != nil {
				t.Fatalf("rollup %d: %v", m.seq, err)
			}
			if ids[m.id]++; ids[m.id] == 1 {
				n, _ := counts[k.count].(float64)
				count += uint64(n)
			}
			if end := r.WindowStart.Add(time.Duration(r.WindowSeconds) * time.Second); r.Kind == events.KindWindow && !end.After(covered) {
				outOfOrder = append(outOfOrder, fmt.Sprintf("seq %d (window ending %s) after a watermark through %s", m.seq, end, covered))
			}
		}
	}
	return ids, count, outOfOrder
}

// checkRollupsPublished waits until every token rollup stored in ClickHouse is on ROLLUPS,
// then checks each is there exactly once by message id, that the totals agree with want, and
// that no window rollup comes after a watermark that covers its window.
func checkRollupsPublished(t *testing.T, b *bed, consumer string, want uint64) {
	t.Helper()
	checkPublished(t, b, consumer, tokenRollups, want)
}

// checkPublished is checkRollupsPublished for rollups of kind k, checking the order against
// the watermark too: no window rollup after a watermark covering it, and no watermark that
// does not move forward, across restarts and kills.
func checkPublished(t *testing.T, b *bed, consumer string, k rollupKind, want uint64) {
	t.Helper()
	stored := b.scalar(t, "SELECT count() FROM "+k.table)
	var ids map[string]int
	var count uint64
	var outOfOrder []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ids, count, outOfOrder = rollupsOnStream(t, b, consumer, k)
		if uint64(len(ids)) >= stored || time.Now().After(deadline) {
			break
		}
	}
	if uint64(len(ids)) != stored || count != want {
		t.Fatalf("%d rollups on ROLLUPS under %s with %s %d; %s stores %d with %d", len(ids), k.prefix, k.count, count, k.table, stored, want)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("rollup %s is on ROLLUPS %d times", id, n)
		}
	}
	if len(outOfOrder) > 0 {
		t.Errorf("%d window rollups or watermarks out of order, first %s", len(outOfOrder), outOfOrder[0])
	}
	// Every stored flush's message ids are the ones on the stream.
	rows, err := b.db.Conn().Query(t.Context(), "SELECT flush_id, count() FROM "+k.table+" GROUP BY flush_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n uint64
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if n := ids[fmt.Sprintf("%s-%d", id, i)]; n != 1 {
				t.Fatalf("rollup %d of stored flush %s is on ROLLUPS %d times, want once", i, id, n)
			}
		}
	}
}

// spreadEvents returns n valid events over 50 scenes and 4 models, from start on, 5 ms apart:
// many rollups per flush.
func spreadEvents(n int, start time.Time) []events.RequestEvent {
	evs := make([]events.RequestEvent, n)
	for i := range evs {
		evs[i] = events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: start.Add(time.Duration(i) * 5 * time.Millisecond),
			Model: fmt.Sprint("m", i%4), Scene: fmt.Sprint("s", i%50), Env: "prod", InputTokens: int64(10 + i%100), OutputTokens: int64(5 + i%7),
			TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	return evs
}

// TestTinyPublishBuffer runs the aggregator with a rollup publisher that holds two messages:
// every flush of hundreds of rollups waits for room instead of dropping, so every stored
// rollup is on ROLLUPS once, and no watermark comes ahead of a rollup it covers.
func TestTinyPublishBuffer(t *testing.T) {
	b := newBed(t)
	startAggregator(t, b.env(envVars{"AGG_CONSUMER": "agg-a", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_PUBLISH_BUFFER": "2", "AGG_LOG_LEVEL": "warn"}))
	const n = 4000
	evs := spreadEvents(n, time.Now().UTC().Add(-30*time.Second))
	b.publish(t, evs)
	b.waitRows(t, time.Minute, n, "SELECT sum(requests) FROM token_rollups")
	if rows := b.scalar(t, "SELECT count() FROM token_rollups"); rows < 1000 {
		t.Fatalf("only %d rollups stored: the test wants many per flush", rows)
	}
	checkRollupsPublished(t, b, "agg-a", n)
}

// TestRestartPublishesNothingTwice stops the aggregator while a window is open, so flushes
// already published lie above the floor, and starts it again after the stream's duplicate
// window has passed: no rollup JetStream acknowledged is published again, since the acked
// mark, not the floor, says which flushes the restart owes ROLLUPS.
func TestRestartPublishesNothingTwice(t *testing.T) {
	b := newBed(t)
	vars := b.env(envVars{"AGG_CONSUMER": "agg-r", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn", "NATS_STREAM_DUPLICATE_WINDOW": "1s"})
	sent := 0
	live := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			evs := spreadEvents(20, time.Now().UTC().Add(-100*time.Millisecond))
			for i := range evs {
				evs[i].TS = evs[0].TS
			}
			b.publish(t, evs)
			sent += len(evs)
		}
	}
	stop := startAggregator(t, vars)
	live(5 * time.Second)
	stop() // windows still open: the floor stays below flushes already published
	time.Sleep(2 * time.Second)
	startAggregator(t, vars)
	live(2 * time.Second)
	b.waitRows(t, time.Minute, uint64(sent), "SELECT sum(requests) FROM token_rollups")
	checkRollupsPublished(t, b, "agg-r", uint64(sent))
}

// TestStalledPublishShows takes ROLLUPS off the rollup subjects while the aggregator runs: the
// stored flush waits for its acks, the stall shows in /readyz and in
// aggregator_publish_stalled_seconds, no watermark and no floor passes the held rollups, and
// once ROLLUPS takes them again every stored rollup is on it once.
func TestStalledPublishShows(t *testing.T) {
	if testing.Short() {
		t.Skip("holds the rollups for about 12 s")
	}
	b := newBed(t)
	addr := freeAddr(t)
	startAggregator(t, b.env(envVars{"HTTP_ADDR": addr, "AGG_CONSUMER": "agg-s", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"}))
	ctx := t.Context()
	start := time.Now().UTC().Add(-90 * time.Second)
	b.publish(t, spreadEvents(1000, start))
	b.waitRows(t, time.Minute, 1000, "SELECT sum(requests) FROM token_rollups")
	checkRollupsPublished(t, b, "agg-s", 1000)
	// Everything is stored and published: the floor reaches the last event.
	evStream, err := b.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := evStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	floor := float64(info.State.LastSeq)
	for deadline := time.Now().Add(15 * time.Second); metricValue(addr, "aggregator_ack_floor", `stream="tokens"`) != floor; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the floor is %v, want %v", metricValue(addr, "aggregator_ack_floor", `stream="tokens"`), floor)
		}
	}

	restore := b.divertStream(t, events.StreamRollups)
	b.publish(t, spreadEvents(1000, start.Add(10*time.Second)))
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		var code int
		var body []byte
		if err == nil {
			code = resp.StatusCode
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		stalled := metricValue(addr, "aggregator_publish_stalled_seconds", `stream="tokens"`)
		if code == http.StatusServiceUnavailable && strings.Contains(string(body), "JetStream's acks") && stalled >= 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s into the stall: /readyz %d %s, publish_stalled_seconds %.1f (want 503 naming the acks, ≥ 10)", code, body, stalled)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if stored := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); stored <= 1000 {
		t.Fatalf("%d requests stored: no flush is waiting for its acks", stored)
	}
	if now := metricValue(addr, "aggregator_ack_floor", `stream="tokens"`); now != floor {
		t.Fatalf("the floor moved from %v to %v past rollups JetStream does not hold", floor, now)
	}
	restore()
	b.waitRows(t, time.Minute, 2000, "SELECT sum(requests) FROM token_rollups")
	checkRollupsPublished(t, b, "agg-s", 2000)
	for deadline := time.Now().Add(15 * time.Second); metricValue(addr, "aggregator_publish_stalled_seconds", `stream="tokens"`) != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("publish_stalled_seconds stays above 0 after the acks came")
		}
	}
}

// TestRollupsTwicePastTheDuplicateWindow: the one case that publishes rollups twice. The
// acked mark cannot be saved (the AGGREGATOR bucket takes no writes) while flushes are stored
// and JetStream acknowledges their rollups; the aggregator stops and starts again past the
// stream's duplicate window, and publishes those flushes' rollups again, which JetStream,
// no longer remembering their ids, stores a second time. Each copy has the message id and
// the data of the first, so a reader that counts a rollup once per Nats-Msg-Id (the
// alerter) counts it once; ClickHouse, where nothing is written again, holds the totals
// exactly once.
func TestRollupsTwicePastTheDuplicateWindow(t *testing.T) {
	b := newBed(t)
	vars := b.env(envVars{"AGG_CONSUMER": "agg-d", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn", "NATS_STREAM_DUPLICATE_WINDOW": "1s"})
	stop := startAggregator(t, vars)
	start := time.Now().UTC().Add(-90 * time.Second)
	b.publish(t, spreadEvents(1000, start))
	b.waitRows(t, time.Minute, 1000, "SELECT sum(requests) FROM token_rollups")

	restore := b.divertStream(t, "KV_"+pipeline.FloorBucket)
	b.publish(t, spreadEvents(1000, start.Add(10*time.Second)))
	b.waitRows(t, time.Minute, 2000, "SELECT sum(requests) FROM token_rollups")
	stored := b.scalar(t, "SELECT count() FROM token_rollups")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ids, _, _ := rollupsOnStream(t, b, "agg-d", tokenRollups); uint64(len(ids)) == stored {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stored rollups are not all on ROLLUPS")
		}
	}
	stop()
	restore()
	time.Sleep(1500 * time.Millisecond) // past the duplicate window
	startAggregator(t, vars)

	var copies map[string][][]byte
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		copies = map[string][][]byte{}
		for _, m := range b.rollupsStream(t) {
			if strings.HasPrefix(m.subject, tokenRollups.prefix) {
				copies[m.id] = append(copies[m.id], m.data)
			}
		}
		twice := 0
		for _, c := range copies {
			if len(c) > 1 {
				twice++
			}
		}
		if twice > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no rollup published again after the restart: the test did not reach the case")
		}
	}
	time.Sleep(time.Second)
	if n := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); n != 2000 {
		t.Errorf("sum(requests) = %d in ClickHouse, want 2000", n)
	}
	if n := b.scalar(t, "SELECT count() FROM token_rollups"); n != stored {
		t.Errorf("%d rollup rows after the restart, %d before: stored again", n, stored)
	}
	var requests uint64
	twice := 0
	for id, c := range copies {
		for _, d := range c[1:] {
			if !bytes.Equal(d, c[0]) {
				t.Fatalf("rollup %s published again with other data:\n%s\n%s", id, c[0], d)
			}
		}
		if len(c) > 1 {
			twice++
		}
		var r events.TokenRollup
		if err := json.Unmarshal(c[0], &r); err != nil {
			t.Fatal(err)
		}
		requests += r.Requests
	}
	if uint64(len(copies)) != stored || requests != 2000 {
		t.Errorf("%d rollups by id on ROLLUPS with %d requests; ClickHouse stores %d with 2000", len(copies), requests, stored)
	}
	t.Logf("%d of %d rollups on ROLLUPS twice, under the same id and data", twice, len(copies))
}

// divertStream moves stream's subjects elsewhere, so that JetStream refuses what is
// published on them (no responders), until restore, which the test's end also calls.
func (b *bed) divertStream(t *testing.T, stream string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	held := cfg
	held.Subjects = []string{"held." + strings.ToLower(stream)}
	if _, err := b.js.UpdateStream(ctx, held); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
				t.Errorf("cannot give %s its subjects back: %v", stream, err)
			}
		})
	}
	t.Cleanup(restore)
	return restore
}
