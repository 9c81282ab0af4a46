package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
)

func (b *bed) publishEngine(t testing.TB, ss []events.EngineSample) {
	t.Helper()
	publishAll(t, b.js, ss, func(s *events.EngineSample) (string, string, []byte, error) {
		data, err := events.MarshalEngineSample(s)
		return events.EngineSampleSubject(s.Host), "", data, err
	})
}

func fp(v float64) *float64 { return &v }

var engineLe = []float64{0.01, 0.05, 0.1, 0.5, 1, 5}

// engineSamples makes n samples of engines on hosts h0..h(hosts-1), one per 10 ms from
// base, each with known counter and histogram deltas: sample i has i%7 generation tokens
// and one queue-time observation in bucket i%7.
func engineSamples(base time.Time, n, hosts int) []events.EngineSample {
	out := make([]events.EngineSample, 0, n)
	for i := range n {
		counts := make([]float64, len(engineLe)+1)
		counts[i%7] = 1
		out = append(out, events.EngineSample{V: 1, TS: base.Add(time.Duration(i) * 10 * time.Millisecond),
			Host: "h" + string(rune('0'+i%hosts)), Engine: events.EngineVLLM, Name: "vllm", Model: "qwen2.5-7b", Up: true,
			DeltaSeconds: fp(1), Waiting: fp(float64(i % 5)), Running: fp(4), KVCacheUsage: fp(0.5),
			PrefixCacheQueries: fp(10), PrefixCacheHits: fp(float64(i % 3)), Preemptions: fp(float64(i % 2)),
			PromptTokens: fp(100), GenerationTokens: fp(float64(i % 7)),
			QueueTime: &events.HistogramDelta{Le: engineLe, Counts: counts, Sum: 0.02, Count: 1}})
	}
	return out
}

// TestEngineThroughAggregator sends engine samples over several windows, with a failed
// scrape and invalid ones among them: engine_rollups hold every valid sample once, bucket
// counts merge in SQL, each rollup is published only once it is stored, the invalid ones are
// dead-lettered with their reason, and a sample for a written window is corrected, not lost.
func TestEngineThroughAggregator(t *testing.T) {
	b := newBed(t)
	dead, err := b.nc.SubscribeSync(events.SubjectInvalid)
	if err != nil {
		t.Fatal(err)
	}
	published, err := b.nc.SubscribeSync(events.SubjectEngineRollupAll)
	if err != nil {
		t.Fatal(err)
	}
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s"}))
	base := time.Now().UTC().Add(-30 * time.Second).Truncate(2 * time.Second)
	const n = 600 // 6 s: three windows, two hosts
	ss := engineSamples(base, n, 2)
	// Invalid samples and a failed scrape first, then the valid ones in time order, so that
	// no window closes before all of its samples are in.
	b.publishRaw(t, "engine.sample.h0", []byte(`{"v":1,"ts":"`+events.FormatTS(base)+`","host":"h0","engine":"vllm","name":"vllm","up":true,"prefix_cache_queries":1,"prefix_cache_hits":2}`))
	b.publishRaw(t, "engine.sample.h0", []byte(`{"v":1,"ts":`))
	b.publishRaw(t, "engine.sample.h0", []byte(`{"v":1,"ts":"`+events.FormatTS(base)+`","host":"h0","engine":"vllm","name":"vllm","up":true,"queue_time_seconds":{"le":[1,0.5],"counts":[0,0,0],"sum":0,"count":0}}`))
	b.publishEngine(t, []events.EngineSample{{V: 1, TS: base.Add(time.Second), Host: "h0", Engine: events.EngineVLLM, Name: "vllm", Up: false, Error: "connect"}})
	b.publishEngine(t, ss)

	b.waitRows(t, 30*time.Second, n+1, "SELECT sum(samples) FROM engine_rollups")
	var wantGen, wantHits float64
	wantBuckets := make([]float64, len(engineLe)+1)
	for _, s := range ss {
		wantGen += *s.GenerationTokens
		wantHits += *s.PrefixCacheHits
		for i, c := range s.QueueTime.Counts {
			wantBuckets[i] += c
		}
	}
	var gen, hits, queries float64
	var down, rows uint64
	var buckets []float64
	if err := b.db.Conn().QueryRow(context.Background(), `SELECT sum(generation_tokens), sum(prefix_cache_hits), sum(prefix_cache_queries),
		sum(down_samples), count(), sumForEach(queue_time_counts) FROM engine_rollups WHERE model != ''`).Scan(&gen, &hits, &queries, &down, &rows, &buckets); err != nil {
		t.Fatal(err)
	}
	if gen != wantGen || hits != wantHits || queries != 10*n || down != 0 || rows != 6 || !slices.Equal(buckets, wantBuckets) {
		t.Fatalf("generation %v (want %v), hits %v (want %v), queries %v, down %d, %d rows (want 6), buckets %v (want %v)",
			gen, wantGen, hits, wantHits, queries, down, rows, buckets, wantBuckets)
	}
	if d := b.scalar(t, "SELECT sum(down_samples) FROM engine_rollups WHERE model = '' AND host = 'h0'"); d != 1 {
		t.Fatalf("%d down samples, want 1", d)
	}

	// Each published rollup was in ClickHouse when it arrived.
	seen := 0
	for seen < 7 {
		m, err := published.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d rollups published, then: %v", seen, err)
		}
		var r events.EngineRollup
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		if m.Subject != events.EngineRollupSubject(r.Host) {
			t.Fatalf("rollup of %s on %s", r.Host, m.Subject)
		}
		if c := b.scalar(t, "SELECT count() FROM engine_rollups WHERE window_start = ? AND host = ? AND model = ?", r.WindowStart, r.Host, r.Model); c == 0 {
			t.Fatalf("rollup %s %s %s published before it was stored", r.WindowStart, r.Host, r.Model)
		}
		if r.Model != "" && (r.QueueTime.Count == 0 || r.QueueTime.P95 <= 0 || r.QueueTime.P95 > 5) {
			t.Fatalf("published queue time %+v", r.QueueTime)
		}
		seen++
	}

	var reasons []string
	for range 3 {
		m, err := dead.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("dead letters %v, then: %v", reasons, err)
		}
		var dl struct {
			Reason, Stream string
		}
		if err := json.Unmarshal(m.Data, &dl); err != nil {
			t.Fatal(err)
		}
		if dl.Stream != events.StreamEngine {
			t.Fatalf("dead letter from stream %q", dl.Stream)
		}
		reasons = append(reasons, dl.Reason)
	}
	slices.Sort(reasons)
	if strings.Join(reasons, ",") != "malformed,out_of_range,out_of_range" {
		t.Fatalf("dead-letter reasons %v", reasons)
	}

	// The first window is written: a sample for it now is a correction that adds.
	late := engineSamples(base, 1, 1)
	b.publishEngine(t, late)
	b.waitRows(t, 30*time.Second, 1, "SELECT sum(samples) FROM engine_rollups WHERE kind = 'correction'")
	if s := b.scalar(t, "SELECT sum(samples) FROM engine_rollups"); s != n+2 {
		t.Fatalf("%d samples in all, want %d", s, n+2)
	}
}

// TestEngineCrashExactlyOnce SIGKILLs the aggregator at random points while engine samples
// are published, restarting it each time: the totals in engine_rollups equal the samples
// published exactly, bucket by bucket, with plain sum() and no FINAL.
func TestEngineCrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the aggregator repeatedly")
	}
	b := newBed(t)
	bin := buildBinary(t)
	const n = 20_000
	// 20k samples over 40 s of event time, 8 hosts, ending a minute ago: 20 two-second windows.
	base := time.Now().UTC().Add(-100 * time.Second).Truncate(2 * time.Second)
	ss := engineSamples(base, n, 8)
	for i := range ss {
		ss[i].TS = base.Add(time.Duration(i) * 2 * time.Millisecond)
	}
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn", "AGG_STORE_REQUESTS": "false"})
	publishedAll := make(chan struct{})
	go func() {
		defer close(publishedAll)
		for i := 0; i < n; i += 500 {
			b.publishEngine(t, ss[i:min(i+500, n)])
			time.Sleep(150 * time.Millisecond) // about 6 s in all, so the kills land mid-run
		}
	}()
	killWhilePublishing(t, bin, vars, publishedAll, 5, 500*time.Millisecond, 1200*time.Millisecond, 7)
	b.waitRows(t, 2*time.Minute, n, "SELECT sum(samples) FROM engine_rollups")
	var wantGen float64
	wantBuckets := make([]float64, len(engineLe)+1)
	for _, s := range ss {
		wantGen += *s.GenerationTokens
		wantBuckets[slices.Index(s.QueueTime.Counts, 1)]++
	}
	check := func() {
		t.Helper()
		var gen float64
		var samples uint64
		var buckets []float64
		if err := b.db.Conn().QueryRow(context.Background(), "SELECT sum(samples), sum(generation_tokens), sumForEach(queue_time_counts) FROM engine_rollups").Scan(&samples, &gen, &buckets); err != nil {
			t.Fatal(err)
		}
		if samples != n || gen != wantGen || !slices.Equal(buckets, wantBuckets) {
			t.Fatalf("samples %d (want %d), generation tokens %v (want %v), buckets %v (want %v)", samples, n, gen, wantGen, buckets, wantBuckets)
		}
	}
	check()
	time.Sleep(time.Second) // and nothing more arrives later
	check()
}

// TestEngineEfficiencyQuery runs schemas/clickhouse/queries/engine_efficiency.sql over known
// engine and GPU rows, corrections among them, on 18.16 and on a current ClickHouse: the
// engines' tokens/s ÷ the host's sample-weighted GPU utilisation, and tokens per joule.
func TestEngineEfficiencyQuery(t *testing.T) {
	b := newBed(t)
	ctx := context.Background()
	if _, err := b.db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	w0 := time.Now().UTC().Add(-time.Hour).Truncate(time.Minute)
	w1 := w0.Add(15 * time.Second)
	eng := func(at time.Time, kind, host, model string, gen, prompt float64) events.EngineRollup {
		return events.EngineRollup{V: 1, WindowStart: at, WindowSeconds: 15, Kind: kind, Host: host, Engine: events.EngineVLLM, Name: "vllm",
			Model: model, Samples: 15, UpSamples: 15, GenerationTokens: gen, PromptTokens: prompt}
	}
	gpu := func(at time.Time, kind, host string, idx int, util float64, samples uint64, energy float64) events.GPURollup {
		return events.GPURollup{V: 1, WindowStart: at, WindowSeconds: 15, Kind: kind, Host: host, GPUIndex: idx, GPUUUID: "GPU-" + host + string(rune('0'+idx)),
			Samples: samples, UtilAvg: util, EnergyJ: energy}
	}
	sk := sink.New(b.db.Conn(), "efficiency")
	if err := sk.WriteEngineRollups(ctx, []events.EngineRollup{
		eng(w0, events.KindWindow, "h1", "a", 3000, 9000),
		eng(w0, events.KindWindow, "h1", "b", 1500, 0),
		eng(w0, events.KindCorrection, "h1", "a", 300, 0),
		eng(w0, events.KindWindow, "h2", "a", 999, 999), // no GPU rows: no figure
		eng(w1, events.KindWindow, "h1", "a", 150, 150),
	}, sink.Ledger{SeqThrough: 1, FlushID: "e"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := sk.WriteGPURollups(ctx, []events.GPURollup{
		gpu(w0, events.KindWindow, "h1", 0, 80, 15, 3000),
		gpu(w0, events.KindWindow, "h1", 1, 40, 15, 1500),
		gpu(w0, events.KindCorrection, "h1", 0, 20, 5, 100),
		gpu(w0, events.KindWindow, "h3", 0, 50, 15, 700), // no engine rows: no figure
		gpu(w1, events.KindWindow, "h1", 0, 0, 15, 0),    // idle and no energy counter: ratios 0
	}, sink.Ledger{SeqThrough: 1, FlushID: "g"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	util := (80*15 + 40*15 + 20*5) / 35.0
	type row struct {
		start                                    time.Time
		host                                     string
		gen, total, genPS, totalPS               float64
		gpus                                     float64
		util, energy, genEff, totEff, genJ, totJ float64
	}
	want := []row{
		{w0, "h1", 4800, 13800, 320, 920, 2, util, 4600, 320 / util, 920 / util, 4800 / 4600.0, 13800 / 4600.0},
		{w1, "h1", 150, 300, 10, 20, 1, 0, 0, 0, 0, 0, 0},
	}
	check := func(t *testing.T, srv server) {
		res, err := srv.run(cookbook(t, "engine_efficiency.sql"), map[string]string{"from": dt(w0.Add(-time.Minute)), "to": dt(w0.Add(time.Minute))})
		if err != nil {
			t.Fatalf("ClickHouse %s: %v", srv.name, err)
		}
		if len(res.Rows) != len(want) {
			t.Fatalf("ClickHouse %s: %d rows %v, want %d", srv.name, len(res.Rows), res.Rows, len(want))
		}
		for i, r := range res.Rows {
			w := want[i]
			if !tm(t, r[0]).Equal(w.start) || str(t, r[1]) != w.host {
				t.Fatalf("ClickHouse %s row %d: %v %v, want %v %v", srv.name, i, r[0], r[1], w.start, w.host)
			}
			for j, v := range []float64{w.gen, w.total, w.genPS, w.totalPS, w.gpus, w.util, w.energy, w.genEff, w.totEff, w.genJ, w.totJ} {
				if got := num(t, r[2+j]); !near(got, v, 1e-9) {
					t.Errorf("ClickHouse %s row %d %s = %v, want %v", srv.name, i, res.Columns[2+j].Name, got, v)
				}
			}
		}
	}
	check(t, server18(b.db))
	t.Run("current", func(t *testing.T) { check(t, serverCurrent(current(t, b, "engine_rollups", "gpu_rollups"))) })
}
