package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
)

// outboxRow is one row of rollup_outbox: a consumer's flush of a stream, written at.
type outboxRow struct {
	consumer, stream string
	seq              uint64
	at               time.Time
}

// fillOutbox migrates the database and writes rows to rollup_outbox, and the acked marks
// (stream.consumer → flush_seq) to the AGGREGATOR bucket.
func fillOutbox(t *testing.T, b *bed, rows []outboxRow, marks map[string]uint64) {
	t.Helper()
	ctx := context.Background()
	if _, err := b.db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	batch, err := b.db.Conn().PrepareBatch(ctx, "INSERT INTO rollup_outbox (consumer, stream, flush_id, flush_seq, seq_through, msg_id, subject, data, written_at)")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		id := fmt.Sprintf("%s-%s-%d", r.consumer, r.stream, r.seq)
		if err := batch.Append(r.consumer, r.stream, id, r.seq, uint64(i+1), id+"-0", "rollup.tokens.prod.chat", "{}", r.at); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	kv, err := bus.EnsureKeyValue(ctx, b.js, pipeline.FloorBucket, "test", 1)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range marks {
		if _, err := kv.Put(ctx, k+".acked", []byte(strconv.FormatUint(v, 10))); err != nil {
			t.Fatal(err)
		}
	}
}

// outboxDays returns how many rows each daily partition of rollup_outbox holds.
func outboxDays(t *testing.T, b *bed) map[uint32]uint64 {
	t.Helper()
	rows, err := b.db.Conn().Query(context.Background(), "SELECT toYYYYMMDD(written_at) AS day, count() FROM rollup_outbox GROUP BY day")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uint32]uint64{}
	for rows.Next() {
		var day uint32
		var n uint64
		if err := rows.Scan(&day, &n); err != nil {
			t.Fatal(err)
		}
		out[day] = n
	}
	return out
}

// yyyymmdd returns the partition of rollup_outbox a row written at t goes to, in the
// server's time zone.
func yyyymmdd(t *testing.T, b *bed, at time.Time) uint32 {
	t.Helper()
	var day uint32
	if err := b.db.Conn().QueryRow(context.Background(), "SELECT toYYYYMMDD(toDateTime(?))", at.Unix()).Scan(&day); err != nil {
		t.Fatal(err)
	}
	return day
}

// TestOutboxSweep: a daily partition of rollup_outbox is dropped once every flush in it is at
// or below its consumer's acked mark and its newest row is a day old; one holding a flush
// JetStream has not acknowledged (above the mark, or of a consumer with no mark) is kept
// however old, and so is one written within the day. A sweep finding nothing to drop, or a
// partition another aggregator dropped meanwhile, is no error.
func TestOutboxSweep(t *testing.T) {
	b := newBed(t)
	now := time.Now().Truncate(time.Second)
	day := func(n int) time.Time { return now.AddDate(0, 0, -n) }
	fillOutbox(t, b, []outboxRow{
		{"agg-1", events.StreamEvents, 1, day(4)}, {"agg-1", events.StreamEvents, 2, day(4)}, {"agg-2", events.StreamGPU, 1, day(4)}, // acked
		{"agg-1", events.StreamEvents, 3, day(3)}, {"agg-2", events.StreamGPU, 2, day(3)}, // agg-2's flush 2 is not acked
		{"agg-3", events.StreamEvents, 1, day(2)},                  // no mark: not acked
		{"agg-1", events.StreamEvents, 4, now.Add(-2 * time.Hour)}, // acked, but recent
	}, map[string]uint64{events.StreamEvents + ".agg-1": 10, events.StreamGPU + ".agg-2": 1})
	sw, err := pipeline.NewOutboxSweeper(context.Background(), b.js, b.db.Conn(), 1, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := sw.Sweep(t.Context(), now)
	if err != nil || n != 1 {
		t.Fatalf("dropped %d partitions (%v), want 1", n, err)
	}
	days := outboxDays(t, b)
	if _, ok := days[yyyymmdd(t, b, day(4))]; ok || days[yyyymmdd(t, b, day(3))] != 2 || days[yyyymmdd(t, b, day(2))] != 1 || days[yyyymmdd(t, b, now.Add(-2*time.Hour))] == 0 {
		t.Fatalf("rows per day after the sweep: %v", days)
	}
	if n, err := sw.Sweep(t.Context(), now); err != nil || n != 0 {
		t.Fatalf("a second sweep dropped %d (%v)", n, err)
	}
	// agg-2 publishes its flush and saves its mark: that partition goes too. The partition
	// dropped already is dropped again without error, as by two aggregators at once.
	fillOutbox(t, b, nil, map[string]uint64{events.StreamGPU + ".agg-2": 2})
	if n, err := sw.Sweep(t.Context(), now); err != nil || n != 1 {
		t.Fatalf("dropped %d partitions (%v) once agg-2 acknowledged, want 1", n, err)
	}
	if _, ok := outboxDays(t, b)[yyyymmdd(t, b, day(3))]; ok {
		t.Fatal("the partition of acknowledged flushes is still there")
	}
	if err := b.db.Conn().Exec(t.Context(), "ALTER TABLE rollup_outbox DROP PARTITION "+strconv.Itoa(int(yyyymmdd(t, b, day(4))))); err != nil {
		t.Fatalf("dropping a partition that is gone: %v", err)
	}
}

// TestAggregatorSweepsOutbox: a running aggregator drops, at start, rollup_outbox's old
// partitions of acknowledged flushes: on 18.16, which has no TTL, nothing else would.
func TestAggregatorSweepsOutbox(t *testing.T) {
	b := newBed(t)
	old := time.Now().AddDate(0, 0, -3)
	fillOutbox(t, b, []outboxRow{{"agg-s", events.StreamEvents, 1, old}, {"agg-s", events.StreamEvents, 2, old}},
		map[string]uint64{events.StreamEvents + ".agg-s": 2})
	startAggregator(t, b.env(envVars{"AGG_CONSUMER": "agg-s", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false", "AGG_LOG_LEVEL": "warn"}))
	for deadline := time.Now().Add(30 * time.Second); b.scalar(t, "SELECT count() FROM rollup_outbox") != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("rollup_outbox holds %v 30 s after the start", outboxDays(t, b))
		}
	}
}
