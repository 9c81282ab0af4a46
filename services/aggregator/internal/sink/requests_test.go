package sink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func openDB(t testing.TB) (*chdb.DB, chdb.Config) {
	t.Helper()
	ctx := context.Background()
	cfg := testbed.ClickHouse(t)
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	return db, cfg
}

func sampleEvent() events.RequestEvent {
	return events.RequestEvent{
		TS: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), EventID: "0190f0e0-0000-7000-8000-000000000000",
		Env: "prod", Scene: "chat", Model: "llama-3-70b", Instance: "gpu-node-01", Tenant: "acme", Provider: "vllm",
		Status: events.StatusOK, ConversationID: "0190f0e0-0000-7000-8000-000000000001", Turn: 3, Outcome: events.OutcomeCompleted,
		InputTokens: 1200, OutputTokens: 301, CachedInputTokens: 512, TTFTMs: 250.5, TotalMs: 5250.5, MaxITLMs: 40.25, QueueMs: 3,
		Stream: true, HTTPStatus: 200,
	}
}

// TestRequestsRoundTrip writes events through the HTTP interface and reads every column
// back through the native protocol.
func TestRequestsRoundTrip(t *testing.T) {
	db, w := openWriter(t, "agg-a")
	ctx := context.Background()
	r := w.NewBuffer()
	ev := sampleEvent()
	r.Add(&ev, "500-2000", 0.0125, 41)
	ev2 := sampleEvent()
	ev2.EventID, ev2.Status, ev2.ErrorCode, ev2.HTTPStatus = strings.Repeat("x", 200), events.StatusError, "upstream_500", 500
	ev2.OutputTokens, ev2.TokensEstimated, ev2.Model = 0, true, "模型-ü" // no TPOT; a long and a non-ASCII string
	r.Add(&ev2, "500-2000", 0, 42)
	if lo, hi := r.SeqRange(); r.Len() != 2 || lo != 41 || hi != 42 {
		t.Fatalf("Len %d, SeqRange %d..%d", r.Len(), lo, hi)
	}
	if err := w.Write(ctx, r, "roundtrip-1"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Conn().Query(ctx, "SELECT toUnixTimestamp(ts), event_id, env, scene, model, instance, tenant, provider, bucket, input_tokens, output_tokens, cached_input_tokens, tokens_estimated, ttft_ms, total_ms, tpot_ms, max_itl_ms, queue_ms, status, error_code, http_status, stream, conversation_id, turn, outcome, cost_usd, consumer, stream_seq FROM requests ORDER BY stream_seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var (
			ts                                                uint32
			id, env, scene, model, inst, tenant, prov, bucket string
			in, out, cached, turn                             uint32
			est, stream                                       uint8
			ttft, total, itl, queue, cost                     float64
			tpot                                              *float64
			status, code, conv, outcome, consumer             string
			httpStatus                                        uint16
			seq                                               uint64
		)
		if err := rows.Scan(&ts, &id, &env, &scene, &model, &inst, &tenant, &prov, &bucket, &in, &out, &cached, &est, &ttft, &total, &tpot, &itl, &queue, &status, &code, &httpStatus, &stream, &conv, &turn, &outcome, &cost, &consumer, &seq); err != nil {
			t.Fatal(err)
		}
		tp := "NULL"
		if tpot != nil {
			tp = strconv.FormatFloat(*tpot, 'f', -1, 64)
		}
		got = append(got, strings.Join([]string{strconv.Itoa(int(ts)), id, env, scene, model, inst, tenant, prov, bucket,
			strconv.Itoa(int(in)), strconv.Itoa(int(out)), strconv.Itoa(int(cached)), strconv.Itoa(int(est)),
			strconv.FormatFloat(ttft, 'f', -1, 64), strconv.FormatFloat(total, 'f', -1, 64), tp, strconv.FormatFloat(itl, 'f', -1, 64), strconv.FormatFloat(queue, 'f', -1, 64),
			status, code, strconv.Itoa(int(httpStatus)), strconv.Itoa(int(stream)), conv, strconv.Itoa(int(turn)), outcome,
			strconv.FormatFloat(cost, 'f', -1, 64), consumer, strconv.FormatUint(seq, 10)}, "|"))
	}
	tpot, _ := ev.TPOT()
	want := []string{
		"1796040000|0190f0e0-0000-7000-8000-000000000000|prod|chat|llama-3-70b|gpu-node-01|acme|vllm|500-2000|1200|301|512|0|250.5|5250.5|" + strconv.FormatFloat(tpot, 'f', -1, 64) + "|40.25|3|ok||200|1|0190f0e0-0000-7000-8000-000000000001|3|completed|0.0125|agg-a|41",
		"1796040000|" + strings.Repeat("x", 200) + "|prod|chat|模型-ü|gpu-node-01|acme|vllm|500-2000|1200|0|512|1|250.5|5250.5|NULL|40.25|3|error|upstream_500|500|1|0190f0e0-0000-7000-8000-000000000001|3|completed|0|agg-a|42",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d rows: %q", len(got), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
	if math.IsNaN(tpot) {
		t.Fatal("the sample event has no TPOT")
	}
}

// TestRequestsManyBlocks writes batches spanning several blocks, twice through the same
// buffer, and finds every row.
func TestRequestsManyBlocks(t *testing.T) {
	db, w := openWriter(t, "agg-a")
	ctx := context.Background()
	r := w.NewBuffer()
	ev := sampleEvent()
	const rows = 20_000
	var seq uint64
	for round := range 2 {
		for range rows {
			seq++
			r.Add(&ev, "500-2000", 0.001, seq)
		}
		if r.Bytes() < 3*blockSize {
			t.Fatalf("%d bytes: the test needs several blocks", r.Bytes())
		}
		if err := w.Write(ctx, r, "blocks-"+strconv.Itoa(round)); err != nil {
			t.Fatal(err)
		}
		r.Reset()
		if r.Len() != 0 || r.Bytes() != 0 {
			t.Fatalf("after Reset: %d events, %d bytes", r.Len(), r.Bytes())
		}
	}
	var n, sum uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count(), sum(stream_seq) FROM requests").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != 2*rows || sum != seq*(seq+1)/2 {
		t.Fatalf("requests holds %d rows summing to %d, want %d and %d", n, sum, 2*rows, seq*(seq+1)/2)
	}
}

// TestRequestWriterErrors: a table whose columns differ, and a server refusing the insert,
// are errors that say what is wrong.
func TestRequestWriterErrors(t *testing.T) {
	db, cfg := openDB(t)
	ctx := context.Background()

	bad := cfg
	bad.Password = "wrong"
	w, err := NewRequestWriter(ctx, db.Conn(), bad, "agg-a")
	if err != nil {
		t.Fatal(err)
	}
	r := w.NewBuffer()
	ev := sampleEvent()
	r.Add(&ev, "500-2000", 0, 1)
	err = w.Write(ctx, r, "refused-1")
	if err == nil || !strings.Contains(err.Error(), "cannot insert 1 rows into requests: ClickHouse answered") {
		t.Fatalf("wrong password: got %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("the error shows the password: %v", err)
	}

	unreachable := cfg
	unreachable.HTTPAddr = "127.0.0.1:1"
	if _, err := NewRequestWriter(ctx, db.Conn(), unreachable, "agg-a"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || !strings.Contains(err.Error(), "CLICKHOUSE_HTTP_ADDR") {
		t.Fatalf("unreachable server: got %v", err)
	}
	native := cfg
	native.HTTPAddr = cfg.Addr // the native port does not speak HTTP
	if _, err := NewRequestWriter(ctx, db.Conn(), native, "agg-a"); err == nil || !strings.Contains(err.Error(), "CLICKHOUSE_HTTP_ADDR") {
		t.Fatalf("native port: got %v", err)
	}

	if err := db.Conn().Exec(ctx, "ALTER TABLE requests MODIFY COLUMN turn UInt64"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewRequestWriter(ctx, db.Conn(), cfg, "agg-a"); err == nil || !strings.Contains(err.Error(), "requests.turn is UInt64") {
		t.Fatalf("changed column: got %v", err)
	}
	if err := db.Conn().Exec(ctx, "ALTER TABLE requests DROP COLUMN turn"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewRequestWriter(ctx, db.Conn(), cfg, "agg-a"); err == nil || !strings.Contains(err.Error(), "no column turn") {
		t.Fatalf("missing column: got %v", err)
	}
}

// BenchmarkWriteRequests measures one 64k-row insert into requests: encoding the events
// (add), the insert as the client waits for it (send), and the ClickHouse server's CPU per
// row, read from /proc.
//
//	go test -run '^$' -bench WriteRequests -benchtime 10x ./internal/sink
func BenchmarkWriteRequests(b *testing.B) {
	_, w := openWriter(b, "bench")
	ctx := context.Background()
	r := w.NewBuffer()
	ev := sampleEvent()
	rows := 1 << 16
	if v, err := strconv.Atoi(os.Getenv("BENCH_ROWS")); err == nil && v > 0 {
		rows = v
	}
	var tAdd, tSend time.Duration
	srv := testbed.Server(b)
	cpu0, cpuOK := srv.CPU()
	i := 0
	for b.Loop() {
		t0 := time.Now()
		for j := range rows {
			r.Add(&ev, "500-2000", 0.001, uint64(j))
		}
		t1 := time.Now()
		i++
		if err := w.Write(ctx, r, "bench-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		tSend += time.Since(t1)
		tAdd += t1.Sub(t0)
		r.Reset()
	}
	n := float64(b.N * rows)
	b.ReportMetric(float64(tAdd.Nanoseconds())/n, "add_ns/row")
	b.ReportMetric(float64(tSend.Nanoseconds())/n, "send_ns/row")
	if cpu1, ok := srv.CPU(); ok && cpuOK {
		b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/n, "server_cpu_ns/row")
	}
}

// openWriter opens a migrated database and a request writer for consumer on it.
func openWriter(t testing.TB, consumer string) (*chdb.DB, *RequestWriter) {
	t.Helper()
	db, cfg := openDB(t)
	w, err := NewRequestWriter(context.Background(), db.Conn(), cfg, consumer)
	if err != nil {
		t.Fatal(err)
	}
	return db, w
}

// TestRequestsDrop removes the rows of stored positions from a buffer of several blocks
// and leaves exactly the bytes a buffer of the other rows holds, with both encodings of ts.
func TestRequestsDrop(t *testing.T) {
	for _, millis := range []bool{false, true} {
		t.Run("tsMillis="+strconv.FormatBool(millis), func(t *testing.T) {
			newBuf := func() *Requests {
				return &Requests{tsMillis: millis, consumer: appendString(nil, "agg-a"), blocks: &blockPool{}}
			}
			all, kept := newBuf(), newBuf()
			var stored []uint64
			for seq := uint64(1); seq <= 20_000; seq++ {
				ev := sampleEvent()
				if seq%7 == 0 {
					ev.EventID, ev.OutputTokens = strings.Repeat("é", 150), 0 // a length past one byte; no TPOT
				}
				if seq%5 == 0 {
					ev.Scores = []events.Score{{Name: "quality", Value: 0.5}, {Name: "task_completed", Value: 1}}[:seq%2+1]
				}
				all.Add(&ev, "500-2000", 0.001, seq)
				if seq%3 == 0 || seq == 1 || seq == 20_000 {
					stored = append(stored, seq)
				} else {
					kept.Add(&ev, "500-2000", 0.001, seq)
				}
			}
			if all.Bytes() < 3*blockSize {
				t.Fatalf("%d bytes: the test needs several blocks", all.Bytes())
			}
			if n := all.Drop(stored); n != len(stored) {
				t.Fatalf("Drop removed %d rows, want %d", n, len(stored))
			}
			lo, hi := all.SeqRange()
			wlo, whi := kept.SeqRange()
			if all.Len() != kept.Len() || all.Bytes() != kept.Bytes() || lo != wlo || hi != whi {
				t.Fatalf("after Drop: %d rows, %d bytes, %d..%d; want %d, %d, %d..%d", all.Len(), all.Bytes(), lo, hi, kept.Len(), kept.Bytes(), wlo, whi)
			}
			got, _ := io.ReadAll(all.body())
			want, _ := io.ReadAll(kept.body())
			if !bytes.Equal(got, want) {
				t.Fatal("the rows left differ from the rows kept")
			}
			if n := all.Drop([]uint64{2, 4}); n != 2 || all.Len() != kept.Len()-2 {
				t.Fatalf("a second Drop removed %d rows, left %d", n, all.Len())
			}
		})
	}
}

// TestRequestsLayerColumns stores each event's layer (an event without one is the
// gateway's), trace id and engine time split.
func TestRequestsLayerColumns(t *testing.T) {
	db, w := openWriter(t, "agg-a")
	ctx := context.Background()
	r := w.NewBuffer()
	gw := sampleEvent()
	gw.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	r.Add(&gw, "500-2000", 0, 1)
	eng := gw
	eng.Layer, eng.QueueMs, eng.PrefillMs, eng.DecodeMs = events.LayerEngine, 12.5, 180.25, 4800
	r.Add(&eng, "500-2000", 0, 2)
	app := gw
	app.Layer, app.TraceID = events.LayerApp, ""
	r.Add(&app, "500-2000", 0, 3)
	if err := w.Write(ctx, r, "layers-1"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Conn().Query(ctx, "SELECT concat(layer, '|', trace_id, '|', toString(queue_ms), '|', toString(prefill_ms), '|', toString(decode_ms)) FROM requests ORDER BY stream_seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	want := []string{
		"gateway|4bf92f3577b34da6a3ce929d0e0e4736|3|0|0",
		"engine|4bf92f3577b34da6a3ce929d0e0e4736|12.5|180.25|4800",
		"app||3|0|0",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestRequestsScoreColumns stores each event's inline scores as two arrays of one length,
// the columns after them intact, and none for an event without scores.
func TestRequestsScoreColumns(t *testing.T) {
	db, w := openWriter(t, "agg-a")
	ctx := context.Background()
	r := w.NewBuffer()
	plain := sampleEvent()
	r.Add(&plain, "500-2000", 0.5, 1)
	scored := sampleEvent()
	scored.Scores = []events.Score{{Name: "quality", Value: 0.82}, {Name: "task_completed", Value: 1}, {Name: "thumbs", Value: -1}}
	r.Add(&scored, "500-2000", 0.25, 2)
	if err := w.Write(ctx, r, "scores-1"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Conn().Query(ctx, "SELECT score_names, score_values, cost_usd, consumer, stream_seq FROM requests ORDER BY stream_seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var (
			names    []string
			values   []float64
			cost     float64
			consumer string
			seq      uint64
		)
		if err := rows.Scan(&names, &values, &cost, &consumer, &seq); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintln(names, values, cost, consumer, seq))
	}
	want := []string{"[] [] 0.5 agg-a 1\n", "[quality task_completed thumbs] [0.82 1 -1] 0.25 agg-a 2\n"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
