package report

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// window is one token_rollups row of known content: every latency is its own centroid.
type window struct {
	start                     time.Time
	model, scene, env, bucket string
	layer                     string // empty: gateway
	lo                        uint32
	ok, errors, timeouts      uint64
	in, out                   uint64
	ttft, tpot                []float64
}

func openDB(t *testing.T) *chdb.DB {
	t.Helper()
	ctx := context.Background()
	db, err := chdb.Open(ctx, testbed.ClickHouse(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	return db
}

func insert(t *testing.T, db *chdb.DB, ws ...window) {
	t.Helper()
	ctx := context.Background()
	b, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, layer,
		bucket, bucket_lo, requests, ok, errors, timeouts, canceled, input_tokens, output_tokens,
		ttft_count, ttft_means, ttft_weights, tpot_count, tpot_means, tpot_weights)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		ones := func(xs []float64) []uint64 {
			o := make([]uint64, len(xs))
			for i := range o {
				o[i] = 1
			}
			return o
		}
		layer := w.layer
		if layer == "" {
			layer = "gateway"
		}
		if err := b.Append(w.start, uint32(10), "window", w.env, w.scene, w.model, "", layer, w.bucket, w.lo,
			w.ok+w.errors+w.timeouts, w.ok, w.errors, w.timeouts, uint64(0), w.in, w.out,
			uint64(len(w.ttft)), w.ttft, ones(w.ttft), uint64(len(w.tpot)), w.tpot, ones(w.tpot)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func repeat(v float64, n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = v
	}
	return xs
}

func seq(from, to float64) []float64 {
	var xs []float64
	for v := from; v <= to; v++ {
		xs = append(xs, v)
	}
	return xs
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

// knownWindows are the rows TestQuery knows the answers for.
func knownWindows(base time.Time) []window {
	return []window{
		// Two windows of the short bucket: 90 fast requests, then 10 slow ones. The merged
		// P95 is the slow ones' latency; averaging the windows' P95s would give about half.
		{start: base, model: "qwen", scene: "chat", env: "prod", bucket: "0-500", lo: 0, ok: 88, errors: 1, timeouts: 1,
			in: 9000, out: 4000, ttft: repeat(100, 90), tpot: repeat(20, 88)},
		{start: base.Add(10 * time.Second), model: "qwen", scene: "chat", env: "prod", bucket: "0-500", lo: 0, ok: 10,
			in: 1000, out: 1000, ttft: repeat(1000, 10), tpot: repeat(40, 10)},
		// A long bucket listed after the short one although its label sorts first.
		{start: base, model: "qwen", scene: "chat", env: "prod", bucket: "32000+", lo: 32000, ok: 100,
			in: 4e6, out: 1000, ttft: seq(1, 100), tpot: seq(101, 200)},
		// Only errors: no latency samples.
		{start: base, model: "qwen", scene: "chat", env: "prod", bucket: "2000-8000", lo: 2000, errors: 4, in: 12000},
		// Other labels, for the filters.
		{start: base, model: "llama", scene: "code", env: "staging", bucket: "0-500", lo: 0, ok: 5,
			in: 500, out: 50, ttft: repeat(50, 5), tpot: repeat(5, 5)},
		// The engine's and the app's view of the short bucket's requests: never in a report
		// of the gateway.
		{start: base, model: "qwen", scene: "chat", env: "prod", layer: "engine", bucket: "0-500", lo: 0, ok: 100,
			in: 10000, out: 5000, ttft: repeat(60, 100), tpot: repeat(20, 100)},
		{start: base, model: "qwen", scene: "chat", env: "prod", layer: "app", bucket: "0-500", lo: 0, ok: 100,
			in: 10000, out: 5000, ttft: append(repeat(150, 90), repeat(1200, 10)...), tpot: repeat(20, 100)},
		// Outside the range.
		{start: base.Add(time.Hour), model: "qwen", scene: "chat", env: "prod", bucket: "0-500", lo: 0, ok: 1000,
			in: 1, out: 1, ttft: repeat(9999, 1000), tpot: repeat(9999, 1000)},
	}
}

func TestQuery(t *testing.T) {
	db := openDB(t)
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	insert(t, db, knownWindows(base)...)
	ctx := context.Background()
	r := Range{From: base, To: base.Add(30 * time.Minute)}

	rep, err := Query(ctx, db.Conn(), r, Filter{Env: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Seconds() != 20 {
		t.Fatalf("windows cover %vs, want 20s", rep.Seconds())
	}
	var got []string
	for _, x := range rep.Rows {
		got = append(got, x.Bucket)
	}
	if len(got) != 3 || got[0] != "0-500" || got[1] != "2000-8000" || got[2] != "32000+" {
		t.Fatalf("rows %v, want 0-500, 2000-8000, 32000+ in bucket order", got)
	}
	short := rep.Rows[0]
	if short.Requests != 100 || short.Errors != 1 || short.Timeouts != 1 || short.ErrorRate != 0.01 || short.TimeoutRate != 0.01 {
		t.Fatalf("short bucket counts %+v", short)
	}
	if short.OutputTPS != 5000.0/20 {
		t.Fatalf("output tokens/s %v, want 250", short.OutputTPS)
	}
	if short.TTFT.N != 100 || !near(short.TTFT.P50, 100, 0.01) || !near(short.TTFT.P95, 1000, 0.01) || !near(short.TTFT.P99, 1000, 0.01) {
		t.Fatalf("short TTFT %+v, want p50 100, p95 and p99 1000 (merged, not averaged)", short.TTFT)
	}
	if short.TPOT.N != 98 || !near(short.TPOT.P50, 20, 0.01) || !near(short.TPOT.P99, 40, 0.01) {
		t.Fatalf("short TPOT %+v", short.TPOT)
	}
	if e := rep.Rows[1]; e.Requests != 4 || e.ErrorRate != 1 || e.TTFT.N != 0 || e.TPOT.N != 0 {
		t.Fatalf("errors-only bucket %+v", e)
	}
	long := rep.Rows[2]
	if long.TTFT.N != 100 || math.Abs(long.TTFT.P95-95) > 2 || math.Abs(long.TPOT.P50-150) > 2 {
		t.Fatalf("long bucket %+v, want TTFT p95 ≈ 95, TPOT p50 ≈ 150", long)
	}

	for _, tc := range []struct {
		name string
		f    Filter
		want int
	}{
		{"all", Filter{}, 4},
		{"model", Filter{Model: "llama"}, 1},
		{"scene", Filter{Scene: "chat"}, 3},
		{"no match", Filter{Model: "qwen", Env: "staging"}, 0},
		{"quote in a value", Filter{Model: "it's"}, 0},
		{"engine layer", Filter{Layer: "engine"}, 1},
		{"no such layer", Filter{Layer: "edge"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Query(ctx, db.Conn(), r, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Rows) != tc.want {
				t.Fatalf("%d rows, want %d: %+v", len(rep.Rows), tc.want, rep.Rows)
			}
		})
	}

	if _, err := Query(ctx, db.Conn(), Range{From: base, To: base}, Filter{}); err == nil {
		t.Fatal("an empty range was accepted")
	}
}

// TestQueryLayers sets the three layers' TTFT of the same requests side by side, each from
// its own rows.
func TestQueryLayers(t *testing.T) {
	db := openDB(t)
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	insert(t, db, knownWindows(base)...)
	ctx := context.Background()
	rep, err := QueryLayers(ctx, db.Conn(), Range{From: base, To: base.Add(30 * time.Minute)}, Filter{Env: "prod", Layer: "engine"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 3 || rep.Rows[0].Bucket != "0-500" || rep.Filter.Layer != "" {
		t.Fatalf("rows %+v filter %+v, want three buckets, short first, every layer read", rep.Rows, rep.Filter)
	}
	want := []struct {
		layer    string
		n        uint64
		p50, p95 float64
	}{{"app", 100, 150, 1200}, {"gateway", 100, 100, 1000}, {"engine", 100, 60, 60}}
	for i, w := range want {
		c := rep.Rows[0].Layers[i]
		if c.Layer != w.layer || c.Requests != w.n || c.TTFT.N != w.n || !near(c.TTFT.P50, w.p50, 0.01) || !near(c.TTFT.P95, w.p95, 0.01) {
			t.Errorf("short bucket at %s: %+v, want %d requests, TTFT p50 %v p95 %v", w.layer, c, w.n, w.p50, w.p95)
		}
	}
	if long := rep.Rows[2].Layers; long[0].Requests != 0 || long[1].Requests != 100 || long[2].Requests != 0 || long[0].TTFT.N != 0 {
		t.Errorf("long bucket %+v, want the gateway's only", long)
	}
	var out strings.Builder
	if err := WriteLayers(&out, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "gateway n") || !strings.Contains(out.String(), "1200") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestQueryCompare(t *testing.T) {
	db := openDB(t)
	change := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	insert(t, db,
		window{start: change.Add(-time.Minute), model: "m", scene: "s", env: "e", bucket: "500-2000", lo: 500, ok: 50,
			in: 50000, out: 5000, ttft: repeat(400, 50), tpot: repeat(30, 50)},
		window{start: change.Add(time.Minute), model: "m", scene: "s", env: "e", bucket: "500-2000", lo: 500, ok: 50,
			in: 50000, out: 5000, ttft: repeat(600, 50), tpot: repeat(30, 50)},
		window{start: change.Add(time.Minute), model: "m", scene: "s", env: "e", bucket: "0-500", lo: 0, ok: 10,
			in: 1000, out: 100, ttft: repeat(90, 10), tpot: repeat(10, 10)},
	)
	ctx := context.Background()
	before, err := Query(ctx, db.Conn(), Range{From: change.Add(-time.Hour), To: change}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	after, err := Query(ctx, db.Conn(), Range{From: change, To: change.Add(time.Hour)}, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	c := Compare(before, after)
	if len(c.Changes) != 2 || c.Changes[0].Bucket != "0-500" || c.Changes[0].Before != nil || c.Changes[1].Before == nil || c.Changes[1].After == nil {
		t.Fatalf("changes %+v", c.Changes)
	}
	p, ok := PctChange(c.Changes[1].Before.TTFT.P95, c.Changes[1].After.TTFT.P95)
	if !ok || !near(p, 50, 0.02) {
		t.Fatalf("TTFT p95 change %v%%, want +50%%", p)
	}
}
