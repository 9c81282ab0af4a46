package report

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// engWindow is one engine_rollups row of known content.
type engWindow struct {
	start                time.Time
	host, name, model    string
	kind                 string
	up, down             uint64
	depthAvg, depthMax   float64
	kvAvg, kvMax         float64
	queries, hits, gauge float64
	preempt              float64
	prompt, generated    float64
	queueCounts          []float64 // over engLe
}

var engLe = []float64{0.5, 1, 2, 5}

func insertEngine(t *testing.T, db *chdb.DB, ws ...engWindow) {
	t.Helper()
	ctx := context.Background()
	b, err := db.Conn().PrepareBatch(ctx, `INSERT INTO engine_rollups (window_start, window_seconds, kind, host, engine, name, model,
		samples, up_samples, down_samples, queue_depth_avg, queue_depth_max, running_avg, kv_cache_usage_avg, kv_cache_usage_max,
		cache_hit_rate_avg, prefix_cache_queries, prefix_cache_hits, preemptions, prompt_tokens, generation_tokens,
		queue_time_le, queue_time_counts, queue_time_count)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		kind := w.kind
		if kind == "" {
			kind = "window"
		}
		le, n := engLe, 0.0
		for _, c := range w.queueCounts {
			n += c
		}
		if n == 0 {
			le = nil
		}
		if err := b.Append(w.start, uint32(10), kind, w.host, "vllm", w.name, w.model, w.up+w.down, w.up, w.down,
			w.depthAvg, w.depthMax, 4.0, w.kvAvg, w.kvMax, w.gauge, w.queries, w.hits, w.preempt, w.prompt, w.generated,
			le, w.queueCounts, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func insertGPU(t *testing.T, db *chdb.DB, start time.Time, host string, gpu uint16, samples uint64, util, energy float64) {
	t.Helper()
	b, err := db.Conn().PrepareBatch(context.Background(), `INSERT INTO gpu_rollups (window_start, window_seconds, kind, host, gpu_index, samples, util_avg, energy_j)`)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append(start, uint32(10), "window", host, gpu, samples, util, energy); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

// knownEngineWindows: host gpu1 serves llama for two 10 s windows (the second with a
// correction row), goes down for a third; host gpu2 serves qwen without a GPU rollup.
func knownEngineWindows(t *testing.T, db *chdb.DB, base time.Time) {
	insertEngine(t, db,
		engWindow{start: base, host: "gpu1", name: "vllm", model: "llama", up: 10, depthAvg: 2, depthMax: 5, kvAvg: 0.5, kvMax: 0.6,
			queries: 1000, hits: 250, preempt: 1, prompt: 2000, generated: 600, queueCounts: []float64{10, 0, 0, 0, 0}},
		engWindow{start: base.Add(10 * time.Second), host: "gpu1", name: "vllm", model: "llama", up: 10, depthAvg: 6, depthMax: 12, kvAvg: 0.9, kvMax: 0.97,
			queries: 3000, hits: 2750, preempt: 2, prompt: 2000, generated: 600, queueCounts: []float64{0, 0, 0, 5, 0}},
		engWindow{start: base.Add(10 * time.Second), kind: "correction", host: "gpu1", name: "vllm", model: "llama",
			generated: 200, queueCounts: []float64{0, 0, 0, 5, 0}},
		engWindow{start: base.Add(20 * time.Second), host: "gpu1", name: "vllm", down: 10, queueCounts: []float64{}},
		engWindow{start: base, host: "gpu2", name: "vllm", model: "qwen", up: 10, depthAvg: 1, depthMax: 1, kvAvg: 0.1, kvMax: 0.1,
			gauge: 0.4, generated: 300, queueCounts: []float64{}},
	)
	insertGPU(t, db, base, "gpu1", 0, 10, 50, 4000)
	insertGPU(t, db, base.Add(10*time.Second), "gpu1", 0, 10, 70, 4000)
}

// TestQueryEngine reads the engine view of known rows: gauges weighted by answered
// scrapes, the prefix hit rate from the token counts (not an average of ratios), queue p95
// from the bucket counts summed over windows and corrections, tokens/s over the span,
// efficiency against the host's GPUs, and the share of scrapes that answered.
func TestQueryEngine(t *testing.T) {
	db := openDB(t)
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	knownEngineWindows(t, db, base)
	rep, err := QueryEngine(context.Background(), db.Conn(), Range{From: base, To: base.Add(time.Hour)}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Seconds() != 30 || len(rep.Rows) != 2 {
		t.Fatalf("span %v s, %d rows, want 30 s and 2: %+v", rep.Seconds(), len(rep.Rows), rep.Rows)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	l := rep.Rows[0]
	if l.Host != "gpu1" || l.Model != "llama" || l.Name != "vllm" || l.Engine != "vllm" || !l.HasPrefix || !l.HasGPU {
		t.Fatalf("row %+v", l)
	}
	near("queue depth avg", l.QueueDepthAvg, 4) // (2·10 + 6·10) / 20
	near("queue depth max", l.QueueDepthMax, 12)
	near("KV avg", l.KVCacheUsageAvg, 0.7)
	near("KV max", l.KVCacheUsageMax, 0.97)
	near("prefix hit rate", l.PrefixHitRate, 0.75) // 3000 / 4000, where the ratios average 0.58
	near("preemptions", l.Preemptions, 3)
	near("up share", l.UpShare, 20.0/30)
	near("prompt tok/s", l.PromptTPS, 4000.0/30)
	near("generation tok/s", l.GenerationTPS, 1400.0/30)
	// 20 requests: 10 under 0.5 s, 10 in (2, 5]: the p95 rank 19 lies at 2 + 3·9/10 s.
	if l.QueueTime.N != 20 {
		t.Errorf("queue time of %d requests, want 20", l.QueueTime.N)
	}
	near("queue p95", l.QueueTime.P95, 4700)
	near("queue p50", l.QueueTime.P50, 500)
	near("GPU util", l.GPUUtilPct, 60)
	near("tok/s per util %", l.TPSPerUtilPct, 1400.0/30/60)
	near("tokens per joule", l.TokensPerJoule, 1400.0/8000)

	q := rep.Rows[1]
	if q.Host != "gpu2" || q.HasGPU || q.QueueTime.N != 0 || !q.HasPrefix {
		t.Errorf("qwen row %+v: no GPU, no queue observations, SGLang-style hit-rate gauge", q)
	}
	near("gauge hit rate", q.PrefixHitRate, 0.4)
	near("qwen up share", q.UpShare, 1)

	var out bytes.Buffer
	if err := WriteEngineTable(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"queue p95", "4700", "75.00%", "interpolated within the engine's histogram buckets", "gpu2"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}

	only, err := QueryEngine(context.Background(), db.Conn(), Range{From: base, To: base.Add(time.Hour)}, Filter{Model: "qwen"})
	if err != nil || len(only.Rows) != 1 || only.Rows[0].Model != "qwen" {
		t.Fatalf("model filter: %v, %+v", err, only.Rows)
	}
	none, err := QueryEngine(context.Background(), db.Conn(), Range{From: base.Add(2 * time.Hour), To: base.Add(3 * time.Hour)}, Filter{})
	if err != nil || len(none.Rows) != 0 {
		t.Fatalf("empty range: %v, %+v", err, none.Rows)
	}
}

// TestEngineQueriesOnCurrent sends the engine view's queries to 18.16 and to ClickHouse
// 26.7 over the same rows and requires the same answers.
func TestEngineQueriesOnCurrent(t *testing.T) {
	db := openDB(t)
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	knownEngineWindows(t, db, base)
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	if err := testbed.CopyTables(ctx, db.Conn(), db.Name(), cur, "engine_rollups", "gpu_rollups"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Filter{{}, {Model: "llama"}, {Model: "it's"}} {
		bound, unbound, params, err := engineQueries(Range{From: base, To: base.Add(time.Hour)}, f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range bound {
			want, err := testbed.Query(ctx, db.Conn(), bound[i])
			if err != nil {
				t.Fatalf("18.16: %v\n%s", err, bound[i])
			}
			p := params
			if i == 2 {
				p = map[string]string{"from": params["from"], "to": params["to"]}
			}
			got, err := cur.Query(unbound[i], p)
			if err != nil {
				t.Fatalf("ClickHouse %s: %v\n%s", cur.Version, err, unbound[i])
			}
			if err := testbed.Compare(want, got, 1e-9); err != nil {
				t.Errorf("filter %+v: ClickHouse %s answers otherwise than 18.16: %v\n%s", f, cur.Version, err, unbound[i])
			}
		}
	}
}
