package engine_test

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// TestFlatBaselineNeedsMinChange: a series whose every baseline window is alike (no
// errors, the same latencies and throughput) has a MAD of 0; under the built-in median
// rules a small change (TTFT 20 % up, one error in a hundred, throughput 20 % down) is
// within min_change and min_delta and fires nothing, and a large one (TTFT doubled) fires.
func TestFlatBaselineNeedsMinChange(t *testing.T) {
	e := newEngine(t, rules.NewSet())
	now := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC) // a Wednesday
	win := func(start time.Time, ttft float64, errs, out uint64) engine.Window {
		r := row(start, "", 200, events.Latency{Count: 200, P95: ttft})
		r.TPOT = events.Latency{Count: 200, P95: 40}
		r.Total = events.Latency{Count: 200, P99: 5000}
		r.Errors, r.OK, r.OutputTokens = errs, 200-errs, out
		return engine.Window{Start: start, Seconds: 60, Tokens: []events.TokenRollup{r}}
	}
	for d := 1; d <= 7; d++ {
		for m := -40; m <= 40; m++ {
			e.Learn(win(now.AddDate(0, 0, -d).Add(time.Duration(m)*time.Minute), 300, 0, 20_000))
		}
	}
	var fired []string
	for i := range 10 {
		for _, a := range e.Evaluate(win(now.Add(time.Duration(i)*time.Minute), 360, 2, 16_000)) {
			fired = append(fired, a.State+" "+a.Rule)
		}
	}
	if len(fired) != 0 {
		t.Errorf("small changes against a flat baseline fired %v", fired)
	}
	var ttft bool
	for i := 10; i < 20; i++ {
		for _, a := range e.Evaluate(win(now.Add(time.Duration(i)*time.Minute), 600, 0, 20_000)) {
			ttft = ttft || (a.State == events.AlertFiring && a.Rule == "ttft_p95_dynamic")
		}
	}
	if !ttft {
		t.Error("TTFT doubled against a flat baseline did not fire ttft_p95_dynamic")
	}
}
