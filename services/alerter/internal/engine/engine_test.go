package engine_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

func newEngine(t testing.TB, rs *rules.Set) *engine.Engine {
	t.Helper()
	e, err := engine.New(rs, baseline.Options{Step: 5 * time.Minute, Slot: 30 * time.Minute, Days: 7, Location: time.UTC, SplitWeekends: true}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func row(start time.Time, inst string, n uint64, ttft events.Latency) events.TokenRollup {
	return events.TokenRollup{
		V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
		Env: "prod", Scene: "chat", Model: "m", Instance: inst, Bucket: "0-499",
		Requests: n, OK: n, OutputTokens: n * 100, TTFT: ttft,
	}
}

func rulesOf(alerts []events.Alert) []string {
	var out []string
	for _, a := range alerts {
		out = append(out, a.State+" "+a.Severity+" "+a.Rule)
	}
	return out
}

// Without a baseline the static SLA decides; two instances of one series merge through
// their centroids: each instance's own p95 is under 2 s, the merged one is not averaged.
func TestStaticFallbackMergesInstances(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	fast := events.Latency{Count: 100, P95: 400, Means: []float64{200, 400}, Weights: []uint64{90, 10}}
	slow := events.Latency{Count: 100, P95: 1900, Means: []float64{1500, 6000}, Weights: []uint64{80, 20}}
	var sent []events.Alert
	for i := range 2 {
		start := t0.Add(time.Duration(i) * time.Minute)
		sent = append(sent, e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{row(start, "a", 100, fast), row(start, "b", 100, slow)}})...)
	}
	// The merged p95 of 200 requests sits in the 6 s centroid: over both SLA levels.
	got := rulesOf(sent)
	if len(got) != 2 || got[0] != "firing critical ttft_p95_sla" && got[1] != "firing critical ttft_p95_sla" {
		t.Fatalf("sent %v, want ttft_p95_sla firing warning and critical", got)
	}
	for _, a := range sent {
		if a.Value < 5000 || a.BaselineMethod != rules.Static || a.Labels["instance"] != "" {
			t.Errorf("%s: value %v method %s labels %v", a.Rule, a.Value, a.BaselineMethod, a.Labels)
		}
	}
	if c := e.Counts(); c.StaticFallback == 0 || c.Dynamic != 0 {
		t.Errorf("counts %+v, want static fallback only", c)
	}
}

// With a week of baseline the dynamic rule decides, and a value far under the SLA but far
// over the baseline fires it; the static rule stays silent.
func TestDynamicTakesOver(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	now := time.Date(2026, 3, 4, 3, 0, 0, 0, time.UTC) // Wednesday night
	for d := 1; d <= 7; d++ {
		for m := -30; m <= 30; m++ {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
			p95 := 300 + float64((m+d)%5)*10
			e.Learn(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{row(start, "", 200, events.Latency{Count: 200, P95: p95})}})
		}
	}
	var sent []events.Alert
	for i := range 3 {
		start := now.Add(time.Duration(i) * time.Minute)
		sent = append(sent, e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{row(start, "", 200, events.Latency{Count: 200, P95: 900})}})...)
	}
	got := rulesOf(sent)
	if len(got) != 1 || got[0] != "firing warning ttft_p95_dynamic" {
		t.Fatalf("sent %v, want only ttft_p95_dynamic firing", got)
	}
	a := sent[0]
	if a.BaselineCenter < 300 || a.BaselineCenter > 340 || a.BaselineSpread <= 0 || a.Threshold >= 900 {
		t.Errorf("baseline %v ± %v threshold %v", a.BaselineCenter, a.BaselineSpread, a.Threshold)
	}
}

// Efficiency joins a host's token rows and GPU rows; saturation needs both a busy GPU and
// a TTFT SLA breach on that host.
func TestSaturation(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	eval := func(i int, util, ttft float64) []events.Alert {
		start := t0.Add(time.Duration(i) * time.Minute)
		return e.Evaluate(engine.Window{Start: start, Seconds: 60,
			Tokens: []events.TokenRollup{row(start, "gpu-a", 50, events.Latency{Count: 50, P95: ttft})},
			GPUs:   []events.GPURollup{{WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow, Host: "gpu-a", Samples: 60, UtilAvg: util, EnergyJ: 30000}},
		})
	}
	var sat []events.Alert
	for i, c := range []struct{ util, ttft float64 }{
		{99, 500}, {99, 500}, // busy but fast: fine
		{97, 2500}, {98, 2600}, // busy and slow: saturation
		{60, 2500}, {60, 2500}, // slow but not busy: resolved
	} {
		for _, a := range eval(i, c.util, c.ttft) {
			if a.Rule == rules.SaturationName {
				sat = append(sat, a)
			}
		}
	}
	if len(sat) != 2 || sat[0].State != events.AlertFiring || sat[1].State != events.AlertResolved {
		t.Fatalf("saturation alerts %v, want firing then resolved", rulesOf(sat))
	}
	if sat[0].Labels["instance"] != "gpu-a" || sat[0].Value != 98 || sat[0].Threshold != 95 {
		t.Errorf("saturation %+v", sat[0])
	}
	if r := sat[1]; r.Value != 60 || r.Threshold != 95 || r.ResolveReason != events.ResolvedNormal {
		t.Errorf("resolved value %v threshold %v reason %q, want 60 under 95, normal", r.Value, r.Threshold, r.ResolveReason)
	}
}

// TestSaturationResolvedWithinSLA: a saturated host that stays busy once its series are
// fast again resolves saying why, with the utilisation threshold it is still above. It
// resolved as "value 99, threshold 95" (from an infinite resolve level), numbers that say
// it still breaches.
func TestSaturationResolvedWithinSLA(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	var sat []events.Alert
	for i, c := range []struct{ util, ttft float64 }{{97, 2500}, {98, 2600}, {99, 500}, {99, 500}} {
		start := t0.Add(time.Duration(i) * time.Minute)
		for _, a := range e.Evaluate(engine.Window{Start: start, Seconds: 60,
			Tokens: []events.TokenRollup{row(start, "gpu-a", 50, events.Latency{Count: 50, P95: c.ttft})},
			GPUs:   []events.GPURollup{{WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow, Host: "gpu-a", Samples: 60, UtilAvg: c.util, EnergyJ: 30000}},
		}) {
			if a.Rule == rules.SaturationName {
				sat = append(sat, a)
			}
		}
	}
	if len(sat) != 2 || sat[1].State != events.AlertResolved {
		t.Fatalf("saturation alerts %v, want firing then resolved", rulesOf(sat))
	}
	if r := sat[1]; r.ResolveReason != events.ResolvedWithinSLA || r.Value != 99 || r.Threshold != 95 || !strings.Contains(r.Summary, "no series it serves breaks its TTFT p95 SLA") {
		t.Errorf("resolved %+v, want reason within_sla, value 99, threshold 95", r)
	}
}

func TestCorrectionsAreNotEvaluated(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		start := t0.Add(time.Duration(i) * time.Minute)
		r := row(start, "", 100, events.Latency{Count: 100, P95: 9000})
		r.Kind = events.KindCorrection
		if got := e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{r}}); len(got) != 0 {
			t.Fatalf("a correction raised %v", rulesOf(got))
		}
	}
	if c := e.Counts(); c.SkippedRows != 3 || c.Series != 0 {
		t.Errorf("counts %+v, want 3 skipped rows", c)
	}
}

// BenchmarkEvaluate10kSeries evaluates a window of 10,000 series (2,000 scenes × 5 buckets)
// against a week of baseline: the goal is at most 50 ms per window. The first window of a
// baseline step computes every baseline (cold); later windows of the step reuse them.
func BenchmarkEvaluate10kSeries(b *testing.B) {
	const scenes, buckets = 2000, 5
	e := newEngine(b, rules.NewSet())
	now := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC)
	mk := func(start time.Time, p95 float64) engine.Window {
		w := engine.Window{Start: start, Seconds: 15}
		for s := range scenes {
			for k := range buckets {
				r := row(start, "", 200, events.Latency{Count: 200, P95: p95 + float64(k)})
				r.Scene, r.Bucket = fmt.Sprintf("scene-%d", s), fmt.Sprintf("b%d", k)
				r.TPOT = events.Latency{Count: 200, P95: 40}
				r.Total = events.Latency{Count: 200, P99: 5000}
				r.Errors, r.Timeouts = 1, 1
				w.Tokens = append(w.Tokens, r)
			}
		}
		return w
	}
	// A week of history: one window per 5-minute cell of each slot, enough points per cell
	// to pass min_points.
	for d := 1; d <= 7; d++ {
		for m := -30; m <= 30; m += 5 {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
			for rep := range 6 {
				e.Learn(mk(start.Add(time.Duration(rep)*15*time.Second), 300+float64(rep)))
			}
		}
	}
	var steps []engine.Window
	for i := range 12 {
		steps = append(steps, mk(now.Add(time.Duration(i)*5*time.Minute), 310))
	}
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			// Each iteration moves to the next 5-minute step, so every baseline is computed.
			e.Evaluate(steps[i%len(steps)])
		}
	})
	b.Run("warm", func(b *testing.B) {
		w := mk(now, 310)
		b.ReportAllocs()
		for b.Loop() {
			e.Evaluate(w)
		}
	})
}

// TestLayersAreSeparateSeries evaluates the same requests seen at the gateway (fast) and by
// the engine (slow): the engine's TTFT SLA alert fires on a series of its own, labelled with
// its layer, and the gateway's never merges the engine's centroids into its own. An alert
// without a layer label is the gateway's, as before layers.
func TestLayersAreSeparateSeries(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	fast := events.Latency{Count: 100, P95: 400, Means: []float64{200, 400}, Weights: []uint64{90, 10}}
	slow := events.Latency{Count: 100, P95: 6000, Means: []float64{5500, 6500}, Weights: []uint64{50, 50}}
	var sent []events.Alert
	for i := range 2 {
		start := t0.Add(time.Duration(i) * time.Minute)
		gw, eng := row(start, "a", 100, fast), row(start, "a", 100, slow)
		eng.Layer = events.LayerEngine
		sent = append(sent, e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{gw, eng}})...)
	}
	if len(sent) == 0 {
		t.Fatal("the engine's slow TTFT fired nothing")
	}
	for _, a := range sent {
		if a.Rule != "ttft_p95_sla" || a.Labels["layer"] != "engine" || a.Value != 6000 {
			t.Errorf("%s %s: value %v labels %v; want only the engine layer's ttft_p95_sla at 6000", a.State, a.Rule, a.Value, a.Labels)
		}
	}
	if c := e.Counts(); c.Series != 4 { // two series, two windows
		t.Errorf("evaluated %d series, want 4", c.Series)
	}
}

// TestHugeValueDoesNotBlindTheBaseline: one rollup of the history with an absurd TTFT
// p95, finite as a float64 but past what a baseline cell (float32) holds or squares, is
// not learned; before, it made the slot's baseline mean or σ infinite or NaN for the
// whole week, no value ever breached its threshold, and a real surge at that time of day
// did not fire.
func TestHugeValueDoesNotBlindTheBaseline(t *testing.T) {
	for _, huge := range []float64{1e39, -1e39, 1e25, 1e300} {
		t.Run(fmt.Sprint(huge), func(t *testing.T) {
			e := newEngine(t, rules.NewSet())
			now := time.Date(2026, 3, 4, 3, 0, 0, 0, time.UTC) // Wednesday night
			for d := 1; d <= 7; d++ {
				for m := -30; m <= 30; m++ {
					start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
					p95 := 300 + float64((m+d)%5)*10
					if d == 1 && m == 0 {
						p95 = huge
					}
					e.Learn(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{row(start, "", 200, events.Latency{Count: 200, P95: p95})}})
				}
			}
			var sent []events.Alert
			for i := range 3 {
				start := now.Add(time.Duration(i) * time.Minute)
				sent = append(sent, e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{row(start, "", 200, events.Latency{Count: 200, P95: 900})}})...)
			}
			if got := rulesOf(sent); len(got) != 1 || got[0] != "firing warning ttft_p95_dynamic" {
				t.Fatalf("sent %v, want ttft_p95_dynamic firing", got)
			}
			if a := sent[0]; a.BaselineCenter < 300 || a.BaselineCenter > 340 || a.Threshold >= 900 {
				t.Errorf("baseline %v ± %v threshold %v", a.BaselineCenter, a.BaselineSpread, a.Threshold)
			}
		})
	}
}

// TestRestoredAlertKeepsFiringFor: a firing alert restored at start resolves after its
// scene's keep_firing_for windows without it, as it would have without the restart. It
// resolved after one: a restart followed by a window without the series (sparse traffic)
// sent a resolve, and the incident still going on fired it again, a second page.
func TestRestoredAlertKeepsFiringFor(t *testing.T) {
	rs, err := rules.Parse([]byte("scenes:\n  chat:\n    keep_firing_for: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, rs)
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	labels := map[string]string{"alertname": "ttft_p95_sla", "severity": "warning", "env": "prod", "scene": "chat", "model": "m", "bucket": "0-499"}
	e.Restore([]events.Alert{{V: 1, Fingerprint: "f", Rule: "ttft_p95_sla", Severity: "warning", State: events.AlertFiring, Labels: labels,
		Value: 2500, Threshold: 2000, StartsAt: t0.Add(-time.Hour), At: t0.Add(-time.Minute)}})
	other := func(start time.Time) events.TokenRollup {
		r := row(start, "", 100, events.Latency{Count: 100, P95: 300})
		r.Model = "other"
		return r
	}
	var sent []events.Alert
	for i, p95 := range []float64{-1, -1, 2500, 2600} { // -1: the series has no rollup in the window
		start := t0.Add(time.Duration(i) * time.Minute)
		w := engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{other(start)}}
		if p95 >= 0 {
			w.Tokens = append(w.Tokens, row(start, "", 100, events.Latency{Count: 100, P95: p95}))
		}
		sent = append(sent, e.Evaluate(w)...)
	}
	if len(sent) != 0 {
		t.Fatalf("sent %v, want nothing: the restored alert keeps firing through two windows without its series", rulesOf(sent))
	}
	for i := 4; i < 7; i++ {
		start := t0.Add(time.Duration(i) * time.Minute)
		sent = append(sent, e.Evaluate(engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{other(start)}})...)
	}
	if got := rulesOf(sent); len(got) != 1 || got[0] != "resolved warning ttft_p95_sla" || !sent[0].At.Equal(t0.Add(7*time.Minute)) {
		t.Fatalf("sent %v, want ttft_p95_sla resolved once, after three windows without the series", got)
	}
	if r := sent[0]; r.ResolveReason != events.ResolvedSilent || r.Value != 2600 || !strings.Contains(r.Summary, "last 2600 above 2000") {
		t.Errorf("resolved %+v, want silent with the last breach, 2600 above 2000", r)
	}
}

// TestRestoredEngineAlertKeepsItsComparison: a restored engine_down or kv_cache_saturation
// alert, whose breach is a value at its threshold too, says so when it resolves by silence.
// It said "last 1 above 1" of an engine whose every scrape failed.
func TestRestoredEngineAlertKeepsItsComparison(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		rule, severity   string
		value, threshold float64
		want             string
	}{
		{rules.DownName, events.SeverityCritical, 1, 1, "last 1 at or above 1"},
		{rules.KVCacheName, events.SeverityWarning, 0.95, 0.95, "last 0.95 at or above 0.95"},
		{rules.PreemptionsName, events.SeverityWarning, 2, 0, "last 2 above 0"},
	} {
		e := newEngine(t, rules.NewSet())
		labels := map[string]string{"alertname": tc.rule, "severity": tc.severity, "instance": "gpu-1", "engine": "vllm"}
		e.Restore([]events.Alert{{V: 1, Fingerprint: "f", Rule: tc.rule, Severity: tc.severity, State: events.AlertFiring, Labels: labels,
			Value: tc.value, Threshold: tc.threshold, BaselineMethod: rules.Static, WindowStart: t0.Add(-2 * time.Minute), StartsAt: t0.Add(-time.Minute), At: t0.Add(-time.Minute)}})
		var sent []events.Alert
		for i := range 3 {
			sent = append(sent, e.Evaluate(engine.Window{Start: t0.Add(time.Duration(i) * time.Minute), Seconds: 60})...)
		}
		if len(sent) != 1 || sent[0].ResolveReason != events.ResolvedSilent || !strings.Contains(sent[0].Summary, tc.want) {
			t.Errorf("%s: sent %+v, want it resolved as silent, %q", tc.rule, sent, tc.want)
		}
	}
}
