package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
)

func TestMain(m *testing.M) { testbed.Main(m) }

type traceRow struct {
	offset        time.Duration
	input, output int64
}

// readTrace reads the first limit rows of the Azure conversation trace, or skips the test
// when the trace is absent (fails under CI=true): call it before starting anything.
func readTrace(t testing.TB, limit int) []traceRow {
	t.Helper()
	f, err := os.Open(testbed.Trace(t, "AzureLLMInferenceTrace_conv.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	var rows []traceRow
	var first time.Time
	for sc.Scan() && len(rows) < limit {
		parts := strings.Split(sc.Text(), ",")
		ts, err := time.Parse("2006-01-02 15:04:05.9999999", parts[0])
		if err != nil {
			t.Fatalf("bad trace line %q: %v", sc.Text(), err)
		}
		if first.IsZero() {
			first = ts
		}
		in, _ := strconv.ParseInt(parts[1], 10, 64)
		out, _ := strconv.ParseInt(parts[2], 10, 64)
		rows = append(rows, traceRow{offset: ts.Sub(first), input: in, output: out})
	}
	return rows
}

// latencyModel gives each trace request latencies: TTFT grows with input tokens (prefill),
// TPOT is lognormal around 25 ms, with 1 % errors, 0.5 % timeouts and 0.3 % cancels.
func buildEvents(rows []traceRow, base time.Time, seed uint64) []events.RequestEvent {
	r := rand.New(rand.NewPCG(seed, seed+1))
	models := []string{"qwen2.5-72b-instruct", "llama-3.1-8b"}
	scenes := []string{"customer-service", "content-gen"}
	out := make([]events.RequestEvent, len(rows))
	for i, row := range rows {
		ttft := (40 + 0.12*float64(row.input)) * math.Exp(0.3*r.NormFloat64())
		tpot := 25 * math.Exp(0.25*r.NormFloat64())
		total := ttft + tpot*float64(max(row.output-1, 0))
		e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(row.offset).Truncate(time.Millisecond),
			Model: models[r.IntN(2)], Scene: scenes[r.IntN(2)], Env: "prod", InputTokens: row.input, OutputTokens: row.output,
			TTFTMs: math.Round(ttft*1000) / 1000, TotalMs: math.Round(total*1000) / 1000, Status: events.StatusOK, Stream: true}
		switch p := r.Float64(); {
		case p < 0.01:
			e.Status, e.OutputTokens, e.TTFTMs, e.TotalMs, e.HTTPStatus = events.StatusError, 0, 0, 30, 500
		case p < 0.015:
			e.Status = events.StatusTimeout
		case p < 0.018:
			e.Status = events.StatusCanceled
		}
		out[i] = e
	}
	return out
}

type envVars map[string]string

func (e envVars) get(k string) string { return e[k] }

// startAggregator runs the service in-process until the returned stop is called.
func startAggregator(t testing.TB, vars envVars) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, vars.get, testWriter{t}) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("aggregator: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

type bed struct {
	natsURL string
	ch      chdb.Config
	db      *chdb.DB
	js      jetstream.JetStream
	nc      *nats.Conn
}

func newBed(t testing.TB) *bed {
	t.Helper()
	srv := testbed.NATS(t)
	chCfg := testbed.ClickHouse(t)
	ctx := context.Background()
	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	return &bed{natsURL: srv.ClientURL(), ch: chCfg, db: db, js: js, nc: nc}
}

func (b *bed) env(extra envVars) envVars {
	e := envVars{"NATS_URL": b.natsURL, "CLICKHOUSE_ADDR": b.ch.Addr, "CLICKHOUSE_HTTP_ADDR": b.ch.HTTPAddr, "CLICKHOUSE_DB": b.ch.DB, "HTTP_ADDR": "127.0.0.1:0",
		"AGG_WINDOW": "15s", "AGG_LATENESS": "2s", "AGG_FLUSH_INTERVAL": "200ms", "AGG_LOG_LEVEL": "debug"}
	for k, v := range extra {
		e[k] = v
	}
	return e
}

func (b *bed) publish(t testing.TB, evs []events.RequestEvent) {
	t.Helper()
	publishAll(t, b.js, evs, func(e *events.RequestEvent) (string, string, []byte, error) {
		return events.RequestSubject(e.Env, e.Scene), e.EventID, events.AppendRequest(nil, e), nil
	})
}

// publishAll publishes each of msgs on JetStream as message says (subject, message id, if not
// empty, and data), a thousand acknowledgements awaited at a time, and waits for them all.
func publishAll[M any](t testing.TB, js jetstream.JetStream, msgs []M, message func(*M) (subject, id string, data []byte, err error)) {
	t.Helper()
	var futures []jetstream.PubAckFuture
	for i := range msgs {
		subject, id, data, err := message(&msgs[i])
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(subject)
		msg.Data = data
		if id != "" {
			msg.Header.Set(jetstream.MsgIDHeader, id)
		}
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == 1000 {
			waitAcks(t, futures)
			futures = futures[:0]
		}
	}
	waitAcks(t, futures)
}

func (b *bed) publishRaw(t testing.TB, subject string, data []byte) {
	t.Helper()
	if _, err := b.js.Publish(context.Background(), subject, data); err != nil {
		t.Fatal(err)
	}
}

func waitAcks(t testing.TB, fs []jetstream.PubAckFuture) {
	t.Helper()
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("publish ack timed out")
		}
	}
}

func (b *bed) scalar(t testing.TB, q string, args ...any) uint64 {
	t.Helper()
	var n uint64
	if err := b.db.Conn().QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// waitRows polls until q returns want, failing after timeout.
func (b *bed) waitRows(t testing.TB, timeout time.Duration, want uint64, q string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var got uint64
		_ = b.db.Conn().QueryRow(context.Background(), q).Scan(&got)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d after %s, want %d", q, got, timeout, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type rollupKey struct {
	start                time.Time
	scene, model, bucket string
}

type expected struct {
	requests, ok, errors, timeouts, canceled, in, out uint64
	ttft, total                                       []float64
}

// TestTraceThroughAggregator sends 6,000 events built from the real conversation trace
// through the aggregator: every rollup's counts match exactly, and its percentiles match
// the exact ones within tolerance (they are exact below the digest's compression).
func TestTraceThroughAggregator(t *testing.T) {
	rows := readTrace(t, 6000)
	b := newBed(t)
	base := time.Now().UTC().Add(-rows[len(rows)-1].offset - 20*time.Second).Truncate(15 * time.Second)
	evs := buildEvents(rows, base, 1)
	startAggregator(t, b.env(nil))
	b.publish(t, evs)
	b.waitRows(t, 60*time.Second, uint64(len(evs)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, uint64(len(evs)), "SELECT count() FROM requests")

	buckets := events.DefaultBucketBounds()
	want := map[rollupKey]*expected{}
	for _, e := range evs {
		k := rollupKey{e.TS.Truncate(15 * time.Second), e.Scene, e.Model, buckets.Label(buckets.Index(e.InputTokens))}
		x := want[k]
		if x == nil {
			x = &expected{}
			want[k] = x
		}
		x.requests++
		x.in += uint64(e.InputTokens)
		x.out += uint64(e.OutputTokens)
		switch e.Status {
		case events.StatusOK:
			x.ok++
			x.total = append(x.total, e.TotalMs)
		case events.StatusError:
			x.errors++
		case events.StatusTimeout:
			x.timeouts++
		case events.StatusCanceled:
			x.canceled++
		}
		if e.Status == events.StatusOK || e.OutputTokens > 0 {
			x.ttft = append(x.ttft, e.TTFTMs)
		}
	}
	rs, err := b.db.Conn().Query(context.Background(), `SELECT window_start, scene, model, bucket,
		sum(requests), sum(ok), sum(errors), sum(timeouts), sum(canceled), sum(input_tokens), sum(output_tokens),
		any(ttft_p50), any(ttft_p99), any(total_p95), count()
		FROM token_rollups GROUP BY window_start, scene, model, bucket`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	seen := 0
	for rs.Next() {
		var k rollupKey
		var reqs, ok, errs, tos, canc, in, out, n uint64
		var p50, p99, tp95 float64
		if err := rs.Scan(&k.start, &k.scene, &k.model, &k.bucket, &reqs, &ok, &errs, &tos, &canc, &in, &out, &p50, &p99, &tp95, &n); err != nil {
			t.Fatal(err)
		}
		k.start = k.start.UTC()
		x := want[k]
		if x == nil {
			t.Fatalf("unexpected rollup %+v", k)
		}
		seen++
		if reqs != x.requests || ok != x.ok || errs != x.errors || tos != x.timeouts || canc != x.canceled || in != x.in || out != x.out {
			t.Fatalf("%+v: got requests %d ok %d errors %d timeouts %d canceled %d in %d out %d; want %+v", k, reqs, ok, errs, tos, canc, in, out, x)
		}
		if n != 1 {
			continue // percentiles of a window split over rows are checked in SQL by the cookbook test
		}
		slices.Sort(x.ttft)
		slices.Sort(x.total)
		check := func(name string, got float64, xs []float64, q float64) {
			if len(xs) == 0 {
				return
			}
			if w := nearestRank(xs, q); math.Abs(got-w) > 0.01*w+1e-9 {
				t.Errorf("%+v %s: %v, exact %v", k, name, got, w)
			}
		}
		check("ttft p50", p50, x.ttft, 0.5)
		check("ttft p99", p99, x.ttft, 0.99)
		check("total p95", tp95, x.total, 0.95)
	}
	if seen != len(want) {
		t.Fatalf("%d rollup keys in ClickHouse, want %d", seen, len(want))
	}
}

func nearestRank(sorted []float64, q float64) float64 {
	idx := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(idx, 0)]
}

// TestInvalidLateAndSeriesOverflow: invalid events are dead-lettered with their reason and
// never stall the good ones beside them; a late event lands in a correction row; series past
// AGG_MAX_SERIES fold into "other"; totals stay exact.
func TestInvalidLateAndSeriesOverflow(t *testing.T) {
	b := newBed(t)
	dead, err := b.nc.SubscribeSync(events.SubjectInvalid)
	if err != nil {
		t.Fatal(err)
	}
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_MAX_SERIES": "5"}))
	now := time.Now().UTC()
	mk := func(model string, at time.Time) events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: at, Model: model, Scene: "chat", Env: "prod",
			InputTokens: 100, OutputTokens: 10, TTFTMs: 100, TotalMs: 400, Status: events.StatusOK}
	}
	var good []events.RequestEvent
	for i := range 20 {
		good = append(good, mk(fmt.Sprint("model-", i), now))
	}
	b.publish(t, good[:10])
	b.publishRaw(t, "llm.req.prod.chat", []byte(`{"v":1,"event_id":"bad-ttft","ts":"`+events.FormatTS(now)+`","model":"m","scene":"chat","env":"prod","input_tokens":1,"output_tokens":1,"ttft_ms":500,"total_ms":100,"status":"ok"}`))
	b.publishRaw(t, "llm.req.prod.chat", []byte(`not json at all`))
	// A version this aggregator does not know, with fields named otherwise.
	b.publishRaw(t, "llm.req.prod.chat", []byte(`{"v":2,"event_id":"v2","ts":"`+events.FormatTS(now)+`","model":"m","scene":"chat","env":"prod","tokens":{"input":1,"output":1},"ttft_ms":1,"total_ms":2,"status":"ok"}`))
	// Control bytes escape to six bytes each: this dead letter would be over the payload limit.
	huge := []byte(`{"v":1,"model":"` + strings.Repeat("\x01", int(b.nc.MaxPayload()/5)) + `"}`)
	b.publishRaw(t, "llm.req.prod.chat", huge)
	b.publish(t, good[10:])
	b.waitRows(t, 30*time.Second, 20, "SELECT sum(requests) FROM token_rollups")
	var reasons []string
	truncated := 0
	for range 4 {
		m, err := dead.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("dead letters %v, then: %v", reasons, err)
		}
		var dl struct {
			Reason, Error string
			StreamSeq     uint64 `json:"stream_seq"`
			Data          string
			DataTruncated bool `json:"data_truncated"`
			DataBytes     int  `json:"data_bytes"`
		}
		if err := json.Unmarshal(m.Data, &dl); err != nil {
			t.Fatal(err)
		}
		if dl.DataTruncated {
			truncated++
			if dl.Reason != "malformed" || dl.DataBytes != len(huge) || !strings.HasPrefix(string(huge), dl.Data) || len(m.Data) > int(b.nc.MaxPayload()) || len(m.Data) < int(b.nc.MaxPayload())-100 {
				t.Fatalf("truncated dead letter: reason %q, %d data bytes of %d, %d bytes in all (limit %d)", dl.Reason, len(dl.Data), dl.DataBytes, len(m.Data), b.nc.MaxPayload())
			}
		}
		reasons = append(reasons, dl.Reason)
	}
	slices.Sort(reasons)
	if strings.Join(reasons, ",") != "malformed,malformed,ttft_above_total,unsupported_version" || truncated != 1 {
		t.Fatalf("dead-letter reasons %v, %d truncated", reasons, truncated)
	}
	if n := b.scalar(t, "SELECT sum(requests) FROM token_rollups WHERE model = 'other'"); n != 15 {
		t.Fatalf("%d requests folded into other, want 15 (20 models, 5 series allowed)", n)
	}
	// The window is written; an event for it now arrives late and is corrected, not lost.
	late := mk("model-0", now)
	b.publish(t, []events.RequestEvent{late})
	b.waitRows(t, 30*time.Second, 1, "SELECT sum(late) FROM token_rollups WHERE kind = 'correction'")
	if n := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); n != 21 {
		t.Fatalf("total %d, want 21", n)
	}
}

// TestFreshness sends live traffic (ts = now) for a few windows and checks each window is in
// ClickHouse within lateness + 2 s of its end (the goal allows window + lateness + 2 s).
func TestFreshness(t *testing.T) {
	b := newBed(t)
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms"}))
	seen := map[time.Time]time.Duration{}
	stopAt := time.Now().Add(9 * time.Second)
	for time.Now().Before(stopAt) {
		now := time.Now().UTC()
		e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: now.Add(-100 * time.Millisecond), Model: "m", Scene: "chat", Env: "prod",
			InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
		b.publish(t, []events.RequestEvent{e})
		rows, err := b.db.Conn().Query(context.Background(), "SELECT DISTINCT window_start FROM token_rollups")
		if err != nil { // the aggregator is still creating its tables
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for rows.Next() {
			var ws time.Time
			if err := rows.Scan(&ws); err != nil {
				t.Fatal(err)
			}
			if _, ok := seen[ws.UTC()]; !ok {
				seen[ws.UTC()] = time.Since(ws.Add(2 * time.Second))
			}
		}
		rows.Close()
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) < 2 {
		t.Fatalf("only %d windows written in 9 s", len(seen))
	}
	for ws, d := range seen {
		t.Logf("window %s in ClickHouse %.2fs after its end", ws.Format("15:04:05"), d.Seconds())
		if d > 3*time.Second { // lateness 1 s + 2 s
			t.Errorf("window %s written %.2fs after its end, over lateness + 2 s", ws.Format("15:04:05"), d.Seconds())
		}
	}
}

// TestPartitions runs two aggregators on disjoint AGG_FILTERs of one stream, each with its own
// consumer: together they count every event once.
func TestPartitions(t *testing.T) {
	b := newBed(t)
	startAggregator(t, b.env(envVars{"AGG_CONSUMER": "agg-prod", "AGG_FILTER": "llm.req.prod.>", "AGG_WINDOW": "2s", "AGG_LATENESS": "1s"}))
	startAggregator(t, b.env(envVars{"AGG_CONSUMER": "agg-staging", "AGG_FILTER": "llm.req.staging.>", "AGG_GPU": "false", "AGG_WINDOW": "2s", "AGG_LATENESS": "1s"}))
	now := time.Now().UTC().Add(-time.Minute)
	var evs []events.RequestEvent
	for i := range 3000 {
		env := []string{"prod", "staging"}[i%3%2]
		evs = append(evs, events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: now.Add(time.Duration(i) * 10 * time.Millisecond),
			Model: "m", Scene: "chat", Env: env, InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK})
	}
	b.publish(t, evs)
	b.waitRows(t, time.Minute, 3000, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, 3000, "SELECT count() FROM requests")
	if n := b.scalar(t, "SELECT sum(requests) FROM token_rollups WHERE env = 'prod' AND consumer = 'agg-prod'"); n != 2000 {
		t.Fatalf("prod partition counted %d, want 2000", n)
	}
	if n := b.scalar(t, "SELECT sum(requests) FROM token_rollups WHERE env = 'staging' AND consumer = 'agg-staging'"); n != 1000 {
		t.Fatalf("staging partition counted %d, want 1000", n)
	}
}

// TestFloorFollowsStoredWindows: the replay floor in the AGGREGATOR bucket reaches every event
// once its windows are stored, stays below a window still open at shutdown, and a restart
// replays that window from it: each event counted once.
func TestFloorFollowsStoredWindows(t *testing.T) {
	b := newBed(t)
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_STORE_REQUESTS": "false", "AGG_GPU": "false"})
	ev := func(ts time.Time) events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: ts, Model: "m", Scene: "chat", Env: "prod",
			InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	floor := func() uint64 {
		kv, err := b.js.KeyValue(context.Background(), pipeline.FloorBucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(context.Background(), events.StreamEvents+".aggregator")
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseUint(string(e.Value()), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// 100 events of a minute ago: their windows close at the first flush.
	old := time.Now().UTC().Add(-time.Minute)
	var evs []events.RequestEvent
	for i := range 100 {
		evs = append(evs, ev(old.Add(time.Duration(i)*time.Millisecond)))
	}
	b.publish(t, evs)
	stop := startAggregator(t, vars)
	b.waitRows(t, 30*time.Second, 100, "SELECT sum(requests) FROM token_rollups")
	deadline := time.Now().Add(5 * time.Second)
	for floor() != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("floor %d, want 100 once every window is stored", floor())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// 10 events of now: their window stays open for 3 s; stop before it closes.
	evs = evs[:0]
	for range 10 {
		evs = append(evs, ev(time.Now().UTC()))
	}
	b.publish(t, evs)
	time.Sleep(500 * time.Millisecond)
	stop()
	if got := floor(); got != 100 {
		t.Fatalf("floor %d after a shutdown holding an open window of events 101-110, want 100", got)
	}
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 100 {
		t.Fatalf("%d requests stored before the open window closed, want 100", got)
	}
	startAggregator(t, vars)
	b.waitRows(t, 30*time.Second, 110, "SELECT sum(requests) FROM token_rollups")
	deadline = time.Now().Add(5 * time.Second)
	for floor() != 110 {
		if time.Now().After(deadline) {
			t.Fatalf("floor %d after the replayed window was stored, want 110", floor())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 110 {
		t.Fatalf("sum(requests) = %d, want 110", got)
	}
}
