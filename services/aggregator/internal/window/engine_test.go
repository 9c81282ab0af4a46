package window_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

func engineRollups(t *testing.T, a *window.EngineAggregator, now time.Time) []events.EngineRollup {
	t.Helper()
	var rows []events.EngineRollup
	for _, u := range a.Advance(now) {
		rows = a.Rollups(u, rows)
		a.Release(u)
	}
	slices.SortFunc(rows, func(x, y events.EngineRollup) int {
		if c := x.WindowStart.Compare(y.WindowStart); c != 0 {
			return c
		}
		switch {
		case x.Model < y.Model:
			return -1
		case x.Model > y.Model:
			return 1
		}
		return 0
	})
	return rows
}

var queueLe = []float64{0.1, 0.5, 1, 5}

func queueDelta(counts ...float64) *events.HistogramDelta {
	n := 0.0
	for _, c := range counts {
		n += c
	}
	return &events.HistogramDelta{Le: queueLe, Counts: counts, Sum: n * 0.3, Count: n}
}

func TestEngineWindows(t *testing.T) {
	a := window.NewEngine(cfg(t), nil)
	now := t0.Add(time.Minute)
	seq := uint64(0)
	add := func(s events.EngineSample) {
		seq++
		s.V, s.Host, s.Engine, s.Name = 1, "h1", events.EngineVLLM, "vllm-0"
		a.Add(&s, seq, now)
	}
	for i := range 30 { // one scrape a second across two 15 s windows
		add(events.EngineSample{TS: t0.Add(time.Duration(i) * time.Second), Model: "m", Up: true,
			Waiting: f64(float64(i % 5)), Running: f64(8), KVCacheUsage: f64(float64(i) / 100),
			PrefixCacheQueries: f64(100), PrefixCacheHits: f64(float64(10 * (i % 3))), // 0, 10, 20: rates 0, 0.1, 0.2
			Preemptions: f64(float64(i % 2)), PromptTokens: f64(300), GenerationTokens: f64(60),
			QueueTime: queueDelta(1, 1, 0, float64(i%2), 0)})
	}
	// A failed scrape has no model: it counts in the endpoint's row of model "".
	add(events.EngineSample{TS: t0.Add(3 * time.Second), Up: false, Error: "timeout"})
	rows := engineRollups(t, a, t0.Add(time.Hour))
	if len(rows) != 3 {
		t.Fatalf("%d rows: %+v", len(rows), rows)
	}
	down, first, second := rows[0], rows[1], rows[2]
	if down.Model != "" || down.Samples != 1 || down.DownSamples != 1 || down.UpSamples != 0 || down.GenerationTokens != 0 {
		t.Fatalf("down row %+v", down)
	}
	if first.Samples != 15 || first.UpSamples != 15 || second.Samples != 15 || first.Kind != events.KindWindow || first.WindowSeconds != 15 {
		t.Fatalf("first %+v second %+v", first, second)
	}
	// Waiting 0,1,2,3,4 three times: mean 2, max 4.
	if first.QueueDepthAvg != 2 || first.QueueDepthMax != 4 || first.RunningAvg != 8 || first.RunningMax != 8 {
		t.Fatalf("gauges %+v", first)
	}
	if math.Abs(first.KVCacheUsageAvg-0.07) > 1e-12 || first.KVCacheUsageMax != 0.14 || second.KVCacheUsageMax != 0.29 {
		t.Fatalf("kv %v %v %v", first.KVCacheUsageAvg, first.KVCacheUsageMax, second.KVCacheUsageMax)
	}
	// Counter deltas add: the hit rate is hits ÷ queries over the window.
	if first.PrefixCacheQueries != 1500 || first.PrefixCacheHits != 150 || first.Preemptions != 7 {
		t.Fatalf("counters %+v", first)
	}
	if first.PromptTokens != 4500 || first.GenerationTokens != 900 || first.PromptTokensPerS != 300 || first.GenerationTokensPerS != 60 {
		t.Fatalf("tokens %+v", first)
	}
	// Queue-time buckets add bucket by bucket: 15 in each of the first two, 7 in (1, 5].
	q := first.QueueTime
	if !slices.Equal(q.Le, queueLe) || !slices.Equal(q.Counts, []float64{15, 15, 0, 7, 0}) || q.Count != 37 {
		t.Fatalf("queue time %+v", q)
	}
	if want := events.HistogramQuantile(0.95, queueLe, q.Counts); q.P95 != want || want <= 1 || want > 5 {
		t.Fatalf("p95 %v, want %v in (1, 5]", q.P95, want)
	}
	if math.Abs(q.P50-(0.1+0.4*(18.5-15)/15)) > 1e-12 {
		t.Fatalf("p50 %v", q.P50)
	}
	if first.TTFT.Count != 0 || first.TTFT.Le != nil || first.TTFT.P95 != 0 {
		t.Fatalf("a histogram the engine does not export is empty: %+v", first.TTFT)
	}
}

func TestEngineTGIBatchIsRunning(t *testing.T) {
	a := window.NewEngine(cfg(t), nil)
	for i, b := range []float64{4, 6} {
		a.Add(&events.EngineSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", Engine: events.EngineTGI, Name: "tgi",
			Up: true, BatchSize: f64(b), Waiting: f64(2)}, uint64(i+1), t0.Add(time.Minute))
	}
	rows := engineRollups(t, a, t0.Add(time.Hour))
	if len(rows) != 1 || rows[0].RunningAvg != 5 || rows[0].RunningMax != 6 || rows[0].QueueDepthAvg != 2 {
		t.Fatalf("%+v", rows)
	}
}

// TestEngineHistogramBoundsChange merges deltas whose bounds differ (an engine restarted
// with other buckets) onto the bounds both have: no observation is lost or moved to a
// bucket that does not hold it.
func TestEngineHistogramBoundsChange(t *testing.T) {
	a := window.NewEngine(cfg(t), nil)
	add := func(i int, d *events.HistogramDelta) {
		a.Add(&events.EngineSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", Engine: events.EngineVLLM, Name: "v",
			Model: "m", Up: true, TTFT: d}, uint64(i+1), t0.Add(time.Minute))
	}
	add(0, &events.HistogramDelta{Le: []float64{0.1, 0.5, 1, 5}, Counts: []float64{1, 2, 3, 4, 5}, Count: 15, Sum: 30})
	add(1, &events.HistogramDelta{Le: []float64{0.5, 2, 5}, Counts: []float64{10, 20, 30, 40}, Count: 100, Sum: 300})
	add(2, &events.HistogramDelta{Le: []float64{0.25, 0.5, 5, 10}, Counts: []float64{1, 1, 1, 1, 1}, Count: 5, Sum: 9})
	rows := engineRollups(t, a, t0.Add(time.Hour))
	h := rows[0].TTFT
	// Common bounds 0.5 and 5: ≤0.5 gets 1+2, 10, 1+1; (0.5, 5] gets 3+4, 20+30, 1; above 5: 5, 40, 1+1.
	if !slices.Equal(h.Le, []float64{0.5, 5}) || !slices.Equal(h.Counts, []float64{15, 58, 47}) || h.Count != 120 || h.Sum != 339 {
		t.Fatalf("%+v", h)
	}
}

func TestEngineLateSampleIsCorrection(t *testing.T) {
	a := window.NewEngine(cfg(t), nil)
	s := events.EngineSample{V: 1, TS: t0, Host: "h", Engine: events.EngineVLLM, Name: "v", Model: "m", Up: true, GenerationTokens: f64(10)}
	a.Add(&s, 1, t0.Add(time.Second))
	rows := engineRollups(t, a, t0.Add(time.Hour))
	if len(rows) != 1 || rows[0].Kind != events.KindWindow {
		t.Fatalf("%+v", rows)
	}
	a.Flushed([]time.Time{t0}, 1, t0.Add(time.Hour))
	if res := a.Add(&s, 2, t0.Add(time.Hour)); res != window.AddedLate {
		t.Fatalf("result %v", res)
	}
	if res := a.Add(&s, 1, t0.Add(time.Hour)); res != window.Skipped {
		t.Fatalf("a stored position: result %v", res)
	}
	rows = engineRollups(t, a, t0.Add(time.Hour))
	if len(rows) != 1 || rows[0].Kind != events.KindCorrection || rows[0].GenerationTokens != 10 || rows[0].Samples != 1 {
		t.Fatalf("%+v", rows)
	}
}

// TestEngineStatsReused checks a released key's histograms start empty when reused.
func TestEngineStatsReused(t *testing.T) {
	a := window.NewEngine(cfg(t), nil)
	for w := range 2 {
		a.Add(&events.EngineSample{V: 1, TS: t0.Add(time.Duration(w) * time.Minute), Host: "h", Engine: events.EngineVLLM, Name: "v",
			Model: "m", Up: true, QueueTime: queueDelta(0, 0, 0, 2, 0)}, uint64(w+1), t0.Add(time.Duration(w)*time.Minute))
		rows := engineRollups(t, a, t0.Add(time.Duration(w)*time.Minute+time.Hour))
		if len(rows) != 1 || !slices.Equal(rows[0].QueueTime.Counts, []float64{0, 0, 0, 2, 0}) || rows[0].Samples != 1 {
			t.Fatalf("window %d: %+v", w, rows)
		}
	}
}
