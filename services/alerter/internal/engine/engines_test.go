package engine_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// vLLM's request-latency bucket bounds, seconds.
var latencyLe = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0}

// hist is a histogram of n observations, all at v seconds.
func hist(n float64, v float64) events.EngineHistogram {
	h := events.EngineHistogram{Le: latencyLe, Counts: make([]float64, len(latencyLe)+1), Count: n, Sum: n * v}
	i := 0
	for i < len(latencyLe) && latencyLe[i] < v {
		i++
	}
	h.Counts[i] = n
	h.SetQuantiles()
	return h
}

// engRow is one window of the fake engine on host h: queue depth, KV usage, preemptions,
// and n requests that waited queue seconds and took prefill seconds.
func engRow(start time.Time, seconds int, host string, depth, kv, preempt, n, queue, prefill float64) events.EngineRollup {
	up := uint64(seconds)
	return events.EngineRollup{
		V: 1, WindowStart: start, WindowSeconds: seconds, Kind: events.KindWindow,
		Host: host, Engine: events.EngineVLLM, Name: "vllm", Model: "m",
		Samples: up, UpSamples: up, QueueDepthAvg: depth, QueueDepthMax: depth, KVCacheUsageAvg: kv, KVCacheUsageMax: kv,
		Preemptions: preempt, QueueTime: hist(n, queue), PrefillTime: hist(n, prefill),
	}
}

func downRow(start time.Time, seconds int, host string) events.EngineRollup {
	return events.EngineRollup{V: 1, WindowStart: start, WindowSeconds: seconds, Kind: events.KindWindow,
		Host: host, Engine: events.EngineVLLM, Name: "vllm", Samples: uint64(seconds), DownSamples: uint64(seconds)}
}

func firingOf(alerts []events.Alert, rule string) *events.Alert {
	for i := range alerts {
		if alerts[i].Rule == rule && alerts[i].State == events.AlertFiring {
			return &alerts[i]
		}
	}
	return nil
}

// KV-cache usage at 95 % or more fires once it has held for 2 minutes (8 windows of 15 s),
// not before, with the engine's labels; below 95 % × (1 − hysteresis) it resolves.
func TestKVCacheSaturationFor2Minutes(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	var at int
	var fired *events.Alert
	for i := range 12 {
		start := t0.Add(time.Duration(i) * 15 * time.Second)
		kv := 0.95 // exactly the threshold: a breach (≥)
		if i == 0 {
			kv = 0.5
		}
		if a := firingOf(e.Evaluate(engine.Window{Start: start, Seconds: 15, Engines: []events.EngineRollup{engRow(start, 15, "gpu1", 0, kv, 0, 10, 0.01, 0.2)}}), rules.KVCacheName); a != nil && fired == nil {
			fired, at = a, i
		}
	}
	if fired == nil || at != 8 {
		t.Fatalf("kv_cache_saturation fired at window %d (%v), want window 8: the 8th of 2 minutes of 15 s windows", at, fired)
	}
	if l := fired.Labels; l["instance"] != "gpu1" || l["engine"] != "vllm" || l["model"] != "m" || fired.Severity != "warning" || fired.Threshold != 0.95 {
		t.Errorf("alert %+v", fired)
	}
	if !strings.Contains(fired.Summary, "at or above 0.95") {
		t.Errorf("summary %q", fired.Summary)
	}
	var resolved bool
	for i := 12; i < 16; i++ {
		start := t0.Add(time.Duration(i) * 15 * time.Second)
		for _, a := range e.Evaluate(engine.Window{Start: start, Seconds: 15, Engines: []events.EngineRollup{engRow(start, 15, "gpu1", 0, 0.5, 0, 10, 0.01, 0.2)}}) {
			resolved = resolved || a.Rule == rules.KVCacheName && a.State == events.AlertResolved
		}
	}
	if !resolved {
		t.Error("kv_cache_saturation did not resolve")
	}
}

// Preemptions in every window for 2 minutes fire; a window without any resets the count.
func TestSustainedPreemptions(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	fired := -1
	for i := range 6 {
		start := t0.Add(time.Duration(i) * 30 * time.Second)
		pre := 3.0
		if i == 1 {
			pre = 0 // a quiet window: not sustained yet
		}
		if a := firingOf(e.Evaluate(engine.Window{Start: start, Seconds: 30, Engines: []events.EngineRollup{engRow(start, 30, "gpu1", 0, 0.5, pre, 10, 0.01, 0.2)}}), rules.PreemptionsName); a != nil {
			fired = i
			if a.Value != 0.1 {
				t.Errorf("value %v, want 3 preemptions / 30 s", a.Value)
			}
		}
	}
	if fired != 5 {
		t.Fatalf("engine_preemptions fired at window %d, want 5 (windows 2–5: 2 minutes of 30 s windows)", fired)
	}
}

// An engine whose scrapes all fail for 30 s is down (critical), per host and endpoint.
func TestEngineDown(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	var fired *events.Alert
	var at int
	for i := range 4 {
		start := t0.Add(time.Duration(i) * 15 * time.Second)
		rows := []events.EngineRollup{downRow(start, 15, "gpu1"), engRow(start, 15, "gpu2", 0, 0.5, 0, 10, 0.01, 0.2)}
		if i == 0 {
			rows[0] = engRow(start, 15, "gpu1", 0, 0.5, 0, 10, 0.01, 0.2)
		}
		if a := firingOf(e.Evaluate(engine.Window{Start: start, Seconds: 15, Engines: rows}), rules.DownName); a != nil && fired == nil {
			fired, at = a, i
		}
	}
	if fired == nil || at != 2 || fired.Severity != "critical" || fired.Labels["instance"] != "gpu1" || fired.Labels["engine"] != "vllm" {
		t.Fatalf("engine_down %+v at window %d, want critical on gpu1/vllm at window 2", fired, at)
	}
	if _, ok := fired.Labels["model"]; ok {
		t.Errorf("engine_down is per endpoint, not per model: %v", fired.Labels)
	}
	if c := e.Counts(); c.Firing != 1 {
		t.Errorf("firing %d, want 1 (gpu2 is up)", c.Firing)
	}
}

// The TTFT alert of a series served by an engine host names what grew with it: queue
// time when requests wait in the queue, prefill time when prompts take longer; a series
// whose instance has no engine data gets no hint.
func TestTTFTAlertNamesQueueOrPrefill(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	normalTTFT := events.Latency{Count: 100, P95: 400}
	slowTTFT := events.Latency{Count: 100, P95: 4500}
	for _, tc := range []struct {
		name            string
		queue, prefill  float64 // seconds, during the incident
		host, instance  string
		want            string
		wantQueueAbove  float64 // ms
		wantPrefillNear float64
	}{
		{"queue", 4, 0.25, "gpu1", "gpu1", events.CauseQueueTime, 2500, 250},
		{"prefill", 0.01, 4, "gpu1", "gpu1", events.CausePrefillTime, 0, 2500},
		{"no engine data", 4, 0.25, "gpu1", "other", "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, rules.NewSet())
			var fired *events.Alert
			for i := range 14 {
				start := t0.Add(time.Duration(i) * 15 * time.Second)
				ttft, q, p := normalTTFT, 0.01, 0.25
				if i >= 10 {
					ttft, q, p = slowTTFT, tc.queue, tc.prefill
				}
				tok := row(start, tc.instance, 100, ttft)
				tok.WindowSeconds = 15
				w := engine.Window{Start: start, Seconds: 15, Tokens: []events.TokenRollup{tok},
					Engines: []events.EngineRollup{engRow(start, 15, tc.host, 0, 0.5, 0, 40, q, p)}}
				if a := firingOf(e.Evaluate(w), "ttft_p95_sla"); a != nil && fired == nil {
					fired = a
				}
			}
			if fired == nil {
				t.Fatal("ttft_p95_sla did not fire")
			}
			c := fired.EngineCause
			if tc.want == "" {
				if c != nil {
					t.Fatalf("cause %+v for a series without engine data", c)
				}
				return
			}
			if c == nil {
				t.Fatalf("no engine cause on %+v", fired)
			}
			if c.Cause != tc.want || c.Host != "gpu1" || c.Engine != "vllm" || c.Reference != "recent" {
				t.Errorf("cause %+v, want %s on gpu1/vllm against the recent windows", c, tc.want)
			}
			if tc.want == events.CauseQueueTime && (c.QueueP95Ms < tc.wantQueueAbove || c.QueueRefMs > 300) {
				t.Errorf("queue %v ms vs %v ms", c.QueueP95Ms, c.QueueRefMs)
			}
			if !strings.Contains(fired.Summary, strings.ReplaceAll(tc.want, "_", " ")+" grew") {
				t.Errorf("summary %q does not say %s grew", fired.Summary, tc.want)
			}
		})
	}
}

// Queue depth far over its seasonal baseline fires queue_depth_dynamic; the hint then
// compares with the baseline, not the recent windows.
func TestQueueDepthAgainstBaseline(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	now := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC) // Wednesday
	for d := 1; d <= 7; d++ {
		for m := -30; m <= 30; m++ {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
			depth := 1 + float64((m+d)%3)
			tok := row(start, "gpu1", 200, events.Latency{Count: 200, P95: 400})
			e.Learn(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{tok},
				Engines: []events.EngineRollup{engRow(start, 60, "gpu1", depth, 0.5, 0, 100, 0.1, 0.25)}})
		}
	}
	var sent []events.Alert
	for i := range 3 {
		start := now.Add(time.Duration(i) * time.Minute)
		tok := row(start, "gpu1", 200, events.Latency{Count: 200, P95: 4000})
		sent = append(sent, e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{tok},
			Engines: []events.EngineRollup{engRow(start, 60, "gpu1", 40, 0.5, 0, 100, 4, 0.25)}})...)
	}
	q := firingOf(sent, "queue_depth_dynamic")
	if q == nil || q.BaselineMethod != rules.MedianMAD || q.BaselineCenter < 1 || q.BaselineCenter > 3 {
		t.Fatalf("queue_depth_dynamic %+v (sent %v)", q, rulesOf(sent))
	}
	if firingOf(sent, "queue_time_p95_dynamic") == nil {
		t.Errorf("queue_time_p95_dynamic did not fire: %v", rulesOf(sent))
	}
	tt := firingOf(sent, "ttft_p95_dynamic")
	if tt == nil || tt.EngineCause == nil || tt.EngineCause.Cause != events.CauseQueueTime || tt.EngineCause.Reference != "baseline" {
		t.Fatalf("ttft_p95_dynamic %+v", tt)
	}
	if c := e.Counts(); c.BaselineEngines != 1 || c.Engines == 0 {
		t.Errorf("counts %+v", c)
	}
}

// An incident that lasts longer than the recent reference's windows does not become its
// own reference: a series of the same host whose TTFT breaks late in it still hears that
// queue time grew, against the engine's windows from before the incident.
func TestTTFTHintReferenceExcludesTheIncident(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	var late *events.Alert
	for i := range 60 {
		start := t0.Add(time.Duration(i) * 15 * time.Second)
		q := 0.01
		early, lateTTFT := events.Latency{Count: 100, P95: 400}, events.Latency{Count: 100, P95: 400}
		if i >= 10 {
			q, early.P95 = 4, 4500
		}
		if i >= 50 {
			lateTTFT.P95 = 4500
		}
		a, b := row(start, "gpu1", 100, early), row(start, "gpu1", 100, lateTTFT)
		a.WindowSeconds, b.WindowSeconds, b.Bucket = 15, 15, "500-1999"
		w := engine.Window{Start: start, Seconds: 15, Tokens: []events.TokenRollup{a, b},
			Engines: []events.EngineRollup{engRow(start, 15, "gpu1", 0, 0.5, 0, 40, q, 0.25)}}
		for _, al := range e.Evaluate(w) {
			if al.Rule == "ttft_p95_sla" && al.State == events.AlertFiring && al.Labels["bucket"] == "500-1999" && late == nil {
				late = &al
			}
		}
	}
	if late == nil || late.EngineCause == nil {
		t.Fatalf("late alert %+v", late)
	}
	if c := late.EngineCause; c.Cause != events.CauseQueueTime || c.QueueRefMs > 300 {
		t.Errorf("cause %+v, want queue time against the pre-incident ~285 ms", c)
	}
}

// The hint's baseline reference is the median, as the dynamic rules': yesterday's queue
// storm at this hour (8 s) does not make today's 1.5 s queue look normal. Against the mean
// the reference was 1.2 s, and the hint said neither grew.
func TestTTFTHintBaselineIgnoresYesterdaysIncident(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	now := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC) // Wednesday
	for d := 1; d <= 7; d++ {
		for m := -30; m <= 30; m++ {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
			queue := 0.1
			if d == 1 && m >= 0 {
				queue = 8
			}
			tok := row(start, "gpu1", 200, events.Latency{Count: 200, P95: 400})
			e.Learn(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{tok},
				Engines: []events.EngineRollup{engRow(start, 60, "gpu1", 1, 0.5, 0, 100, queue, 0.25)}})
		}
	}
	var tt *events.Alert
	for i := range 3 {
		start := now.Add(time.Duration(i) * time.Minute)
		tok := row(start, "gpu1", 200, events.Latency{Count: 200, P95: 4000})
		if a := firingOf(e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{tok},
			Engines: []events.EngineRollup{engRow(start, 60, "gpu1", 1, 0.5, 0, 100, 1.5, 0.25)}}), "ttft_p95_dynamic"); a != nil {
			tt = a
		}
	}
	if tt == nil || tt.EngineCause == nil {
		t.Fatalf("ttft_p95_dynamic %+v", tt)
	}
	if c := tt.EngineCause; c.Cause != events.CauseQueueTime || c.Reference != "baseline" || c.QueueRefMs > 300 {
		t.Errorf("cause %+v, want queue time against a baseline of about 285 ms", c)
	}
}

// TestEngineRecentBounded: the recent windows kept as the TTFT hint's reference are bounded
// by ALERTER_MAX_SERIES, as the engines' baselines are. A flood of engine models (a new
// model label in every window) kept one for each until it had been gone 120 windows.
func TestEngineRecentBounded(t *testing.T) {
	e, err := engine.New(rules.NewSet(), baseline.Options{Step: 5 * time.Minute, Slot: 30 * time.Minute, Days: 7, Location: time.UTC, MaxSeries: 10}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	for i := range 20 {
		start := t0.Add(time.Duration(i) * 15 * time.Second)
		w := engine.Window{Start: start, Seconds: 15}
		for j := range 50 {
			r := engRow(start, 15, "gpu1", 1, 0.5, 0, 10, 0.01, 0.2)
			r.Model = "m" + strconv.Itoa(i*50+j)
			w.Engines = append(w.Engines, r)
		}
		e.Evaluate(w)
	}
	if n := e.RecentLen(); n > 10 {
		t.Errorf("%d engines' recent windows kept, want at most ALERTER_MAX_SERIES (10)", n)
	}
}
