package report

import (
	"context"
	"io/fs"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// insertInstanceTokens writes token_rollups rows of one series on an instance, measured at
// layer: n requests, TTFTs 1..n ms as singleton centroids, input and cached tokens.
func insertInstanceTokens(t *testing.T, db *chdb.DB, start time.Time, instance, layer string, n int, in, cached uint64) {
	t.Helper()
	b, err := db.Conn().PrepareBatch(context.Background(), `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance,
		bucket, requests, ok, input_tokens, cached_input_tokens, output_tokens, ttft_count, ttft_means, ttft_weights, layer)`)
	if err != nil {
		t.Fatal(err)
	}
	means, weights := make([]float64, n), make([]uint64, n)
	for i := range n {
		means[i], weights[i] = float64(i+1), 1
	}
	if err := b.Append(start, uint32(10), "window", "prod", "chat", "llama", instance, "500-1999", uint64(n), uint64(n), in, cached, uint64(10*n),
		uint64(n), means, weights, layer); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

// TestCookbookEngineQueries runs ttft_vs_queue.sql and engine_prefix_cache.sql over known
// rows (the gateway's beside an engine layer's token rollups of the same host, which they
// leave out), on 18.16 (parameters bound by chdb.Bind) and on ClickHouse 26.7 (bound by the
// server): the gateway's TTFT p95 and cached share per host beside the engines' queue and
// prefix cache, the queue p95 read off the buckets summed over the minute.
func TestCookbookEngineQueries(t *testing.T) {
	db := openDB(t)
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	knownEngineWindows(t, db, base)
	insertInstanceTokens(t, db, base, "gpu1", "gateway", 100, 100_000, 30_000)
	insertInstanceTokens(t, db, base.Add(10*time.Second), "gpu1", "gateway", 100, 100_000, 50_000)
	insertInstanceTokens(t, db, base, "gpu2", "gateway", 40, 8_000, 0)
	insertInstanceTokens(t, db, base, "no-engine", "gateway", 40, 8_000, 0)
	// the engine's own view of gpu1's requests (slower, all cached): never summed with the gateway's
	insertInstanceTokens(t, db, base, "gpu1", "engine", 1000, 100_000, 100_000)
	params := map[string]string{"from": strconv.FormatInt(base.Unix(), 10), "to": strconv.FormatInt(base.Add(time.Hour).Unix(), 10)}
	read := func(name string) string {
		raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+name)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	col := func(res *testbed.Result, name string) int {
		for i, c := range res.Columns {
			if c.Name == name {
				return i
			}
		}
		t.Fatalf("no column %s in %v", name, res.Columns)
		return -1
	}
	f := func(v any) float64 {
		switch x := v.(type) {
		case float64:
			return x
		case uint64:
			return float64(x)
		}
		t.Fatalf("%v (%T) is not a number", v, v)
		return 0
	}
	near := func(what string, got, want, tol float64) {
		t.Helper()
		if math.Abs(got-want) > tol*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	checks := map[string]func(server string, res *testbed.Result){
		"ttft_vs_queue.sql": func(server string, res *testbed.Result) {
			if len(res.Rows) != 2 {
				t.Fatalf("%s: %d rows, want gpu1 and gpu2 at 10:00 (no-engine has no engine rows): %v", server, len(res.Rows), res.Rows)
			}
			g1, g2 := res.Rows[0], res.Rows[1]
			if g1[col(res, "host")] != "gpu1" || !g1[col(res, "minute")].(time.Time).Equal(base) {
				t.Fatalf("%s: first row %v", server, g1)
			}
			near(server+" gpu1 requests", f(g1[col(res, "requests")]), 200, 0)
			// 200 TTFTs, 1..100 ms twice: the p95 is about 95 ms.
			near(server+" gpu1 TTFT p95", f(g1[col(res, "ttft_p95_ms")]), 95, 0.03)
			near(server+" gpu1 queue depth avg", f(g1[col(res, "queue_depth_avg")]), 4, 1e-9)
			near(server+" gpu1 queue depth max", f(g1[col(res, "queue_depth_max")]), 12, 0)
			near(server+" gpu1 queue p95", f(g1[col(res, "queue_p95_ms")]), 4700, 1e-9)
			near(server+" gpu1 queue requests", f(g1[col(res, "queue_requests")]), 20, 0)
			near(server+" gpu2 queue p95 without observations", f(g2[col(res, "queue_p95_ms")]), 0, 0)
			near(server+" gpu2 queue depth", f(g2[col(res, "queue_depth_avg")]), 1, 1e-9)
		},
		"engine_prefix_cache.sql": func(server string, res *testbed.Result) {
			if len(res.Rows) != 2 {
				t.Fatalf("%s: %d rows, want gpu1 and gpu2: %v", server, len(res.Rows), res.Rows)
			}
			g1, g2 := res.Rows[0], res.Rows[1]
			near(server+" gpu1 engine hit rate", f(g1[col(res, "engine_hit_rate")]), 0.75, 1e-9) // 3000 / 4000
			near(server+" gpu1 gateway cached share", f(g1[col(res, "gateway_cached_share")]), 0.4, 1e-9)
			near(server+" gpu1 gateway requests", f(g1[col(res, "gateway_requests")]), 200, 0)
			near(server+" gpu2 engine hit rate", f(g2[col(res, "engine_hit_rate")]), 0, 0)
			near(server+" gpu2 SGLang-style gauge", f(g2[col(res, "engine_hit_rate_gauge")]), 0.4, 1e-9)
		},
	}
	answers := map[string]*testbed.Result{}
	ctx := context.Background()
	for name, check := range checks {
		bound, err := chdb.Bind(read(name), params)
		if err != nil {
			t.Fatal(err)
		}
		res, err := testbed.Query(ctx, db.Conn(), bound)
		if err != nil {
			t.Fatalf("%s on 18.16: %v", name, err)
		}
		check("18.16", res)
		answers[name] = res
	}
	t.Run("current", func(t *testing.T) {
		cur := testbed.CurrentClickHouse(t)
		if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
			t.Fatal(err)
		}
		if err := testbed.CopyTables(ctx, db.Conn(), db.Name(), cur, "engine_rollups", "gpu_rollups", "token_rollups"); err != nil {
			t.Fatal(err)
		}
		for name, check := range checks {
			res, err := cur.Query(read(name), params)
			if err != nil {
				t.Fatalf("%s on ClickHouse %s: %v", name, cur.Version, err)
			}
			check(cur.Version, res)
			// t-digest quantiles: current servers read singleton centroids exactly where 18.16
			// interpolates; both are checked above.
			if err := testbed.Compare(answers[name], res, 1e-9, "ttft_p95_ms"); err != nil {
				t.Errorf("%s: ClickHouse %s answers otherwise than 18.16: %v", name, cur.Version, err)
			}
		}
	})
}
