package history_test

import (
	"math"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/history"
)

type engineCell struct {
	at       time.Time
	v        engine.EngineValue
	n        uint64
	mean, vr float64
}

type fakeEngineBaselines map[engine.EngineKey][]engineCell

func (f fakeEngineBaselines) MergeEngine(k engine.EngineKey, t time.Time, v engine.EngineValue, n uint64, mean, vr float64, _ []float64) {
	f[k] = append(f[k], engineCell{t, v, n, mean, vr})
}

// TestLoadEngineBaselines reads engine_rollups on the real ClickHouse: a window and its
// correction merge bucket by bucket before the p95 is read off them, queue depth is
// weighted by up samples, windows fall into baseline steps, a window all down is left out.
func TestLoadEngineBaselines(t *testing.T) {
	ctx, db, _ := history.OpenMigrated(t)
	b, err := db.Conn().PrepareBatch(ctx, `INSERT INTO engine_rollups (window_start, window_seconds, kind, host, engine, name, model,
		samples, up_samples, down_samples, queue_depth_avg, queue_time_le, queue_time_counts, queue_time_count, prefill_le, prefill_counts, prefill_count)`)
	if err != nil {
		t.Fatal(err)
	}
	le := []float64{0.5, 1, 2, 5}
	t0 := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	add := func(start time.Time, kind, model string, up, down uint64, depth float64, q, p []float64) {
		t.Helper()
		sum := func(v []float64) float64 {
			s := 0.0
			for _, x := range v {
				s += x
			}
			return s
		}
		if err := b.Append(start, uint32(60), kind, "gpu1", events.EngineVLLM, "vllm", model, up+down, up, down, depth, le, q, sum(q), le, p, sum(p)); err != nil {
			t.Fatal(err)
		}
	}
	// 10:00: 10 requests under 0.5 s; its correction adds 10 in (2, 5]: merged, the p95
	// rank (19 of 20) lies in (2, 5] at 4.7 s, where neither row alone has it.
	add(t0, "window", "m", 60, 0, 2, []float64{10, 0, 0, 0, 0}, []float64{10, 0, 0, 0, 0})
	add(t0, "correction", "m", 20, 0, 6, []float64{0, 0, 0, 10, 0}, []float64{0, 0, 0, 0, 0})
	// 10:01: one row.
	add(t0.Add(time.Minute), "window", "m", 60, 0, 1, []float64{20, 0, 0, 0, 0}, []float64{0, 20, 0, 0, 0})
	// 10:02: the engine was down; its row has no model.
	add(t0.Add(2*time.Minute), "window", "", 0, 60, 0, []float64{0, 0, 0, 0, 0}, []float64{0, 0, 0, 0, 0})
	// 10:05: the next 5-minute step.
	add(t0.Add(5*time.Minute), "window", "m", 60, 0, 3, []float64{0, 20, 0, 0, 0}, []float64{0, 20, 0, 0, 0})
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	got := fakeEngineBaselines{}
	n, through, err := history.LoadEngineBaselines(ctx, db.Conn(), got, t0.Add(-time.Hour), t0.Add(time.Hour), 5*time.Minute, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || !through.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("%d cells through %s, want 2 through 10:05", n, through)
	}
	if _, ok := got[engine.EngineKey{Host: "gpu1", Name: "vllm"}]; ok {
		t.Error("a window all down is in the baseline")
	}
	cells := got[engine.EngineKey{Host: "gpu1", Name: "vllm", Model: "m"}]
	find := func(at time.Time, v engine.EngineValue) engineCell {
		for _, c := range cells {
			if c.at.Equal(at) && c.v == v {
				return c
			}
		}
		t.Fatalf("no cell %v at %s in %+v", v, at, cells)
		return engineCell{}
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	// Queue depth: 10:00 is (2·60 + 6·20)/80 = 3, 10:01 is 1: mean 2, variance 1.
	d := find(t0, engine.EngineQueueDepth)
	if d.n != 2 {
		t.Errorf("queue depth cell of %d windows, want 2", d.n)
	}
	near("queue depth mean", d.mean, 2)
	near("queue depth variance", d.vr, 1)
	// Queue p95: 10:00 merged 4700 ms; 10:01 (20 under 0.5 s) 475 ms.
	q := find(t0, engine.EngineQueueTimeP95)
	near("queue p95 mean", q.mean, (4700+475)/2.0)
	// Prefill p95: 10:00 475 ms, 10:01 in (0.5, 1]: 975 ms.
	near("prefill p95 mean", find(t0, engine.EnginePrefillP95).mean, (475+975)/2.0)
	near("next step's queue depth", find(t0.Add(5*time.Minute), engine.EngineQueueDepth).mean, 3)
}
