package events_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestHistogramQuantile checks the estimate against values worked out by hand with
// Prometheus's bucketQuantile (promql/quantile.go) for the same cumulative buckets.
func TestHistogramQuantile(t *testing.T) {
	le := []float64{0.1, 0.5, 1, 5}
	f := func(name string, q float64, counts []float64, want float64) {
		t.Helper()
		got := events.HistogramQuantile(q, le, counts)
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("%s: got %v, want NaN", name, got)
			}
			return
		}
		if math.Abs(got-want) > 1e-12 {
			t.Fatalf("%s: got %v, want %v", name, got, want)
		}
	}
	// 10 observations: 2 ≤ 0.1, 4 in (0.1, 0.5], 3 in (0.5, 1], 1 in (1, 5], 0 above.
	c := []float64{2, 4, 3, 1, 0}
	f("median in the second bucket", 0.5, c, 0.1+0.4*(5-2)/4.0)
	f("p95 in the fourth bucket", 0.95, c, 1+4*(9.5-9)/1.0)
	f("p10 in the first bucket from 0", 0.1, c, 0.1*1/2.0)
	f("q=0 is the lowest bucket's start", 0, c, 0)
	f("q=1 is the top of the highest filled bucket", 1, c, 5)
	f("a rank in +Inf gives the highest bound", 0.99, []float64{1, 0, 0, 0, 9}, 5)
	f("empty buckets before the rank are skipped", 0.5, []float64{0, 0, 4, 0, 0}, 0.5+0.5*2/4.0)
	f("no observations", 0.5, []float64{0, 0, 0, 0, 0}, math.NaN())
	f("counts of the wrong length", 0.5, []float64{1, 2}, math.NaN())
	f("q above 1", 1.5, c, math.NaN())
	f("q below 0", -0.1, c, math.NaN())
	if got := events.HistogramQuantile(0.5, []float64{-1, 1}, []float64{3, 1, 0}); got != -1 {
		t.Fatalf("a first bound ≤ 0 is returned as is, got %v", got)
	}
}

func TestEngineHistogramSetQuantiles(t *testing.T) {
	h := events.EngineHistogram{Le: []float64{1, 2}, Counts: []float64{0, 10, 0}, Count: 10}
	h.SetQuantiles()
	if h.P50 != 1.5 || h.P95 != 1.95 || math.Abs(h.P99-1.99) > 1e-12 {
		t.Fatalf("got p50 %v p95 %v p99 %v", h.P50, h.P95, h.P99)
	}
	empty := events.EngineHistogram{P95: 3}
	empty.SetQuantiles()
	if empty.P95 != 0 {
		t.Fatalf("an empty histogram keeps p95 %v", empty.P95)
	}
}

// TestEngineRollupMatchesSchema checks that what the Go encoder writes for an engine rollup
// passes its schema, and that the schema rejects what it must.
func TestEngineRollupMatchesSchema(t *testing.T) {
	sch := compileSchema(t, "engine_rollup.schema.json")
	h := events.EngineHistogram{Le: []float64{0.1, 1}, Counts: []float64{3, 1, 0}, Sum: 0.9, Count: 4}
	h.SetQuantiles()
	r := events.EngineRollup{
		V: events.Version, WindowStart: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), WindowSeconds: 15,
		Kind: events.KindWindow, Host: "gpu-node-3", Engine: events.EngineVLLM, Name: "vllm", Model: "qwen2.5-72b-instruct",
		Samples: 15, UpSamples: 14, DownSamples: 1, QueueDepthAvg: 3.5, QueueDepthMax: 7,
		RunningAvg: 8, RunningMax: 8, KVCacheUsageAvg: 0.4, KVCacheUsageMax: 0.6,
		PrefixCacheQueries: 1000, PrefixCacheHits: 600, Preemptions: 2,
		PromptTokens: 12000, GenerationTokens: 3000, PromptTokensPerS: 800, GenerationTokensPerS: 200,
		QueueTime: h, TTFT: h,
	}
	raw, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateSchema(sch, raw); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	var back events.EngineRollup
	if err := json.Unmarshal(raw, &back); err != nil || back.QueueTime.P50 != h.P50 || back.Model != r.Model {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	for name, bad := range map[string]string{
		"unknown engine":   `"engine":"triton"`,
		"negative samples": `"samples":-1`,
		"unknown kind":     `"kind":"partial"`,
	} {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		var kv map[string]json.RawMessage
		if err := json.Unmarshal([]byte("{"+bad+"}"), &kv); err != nil {
			t.Fatal(err)
		}
		for k, v := range kv {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		if validateSchema(sch, b) == nil {
			t.Fatalf("%s: the schema accepts %s", name, b)
		}
	}
}
