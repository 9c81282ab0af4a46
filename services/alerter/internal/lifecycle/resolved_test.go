package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// resolvedOnce runs a tracker over windows of a minute from t0, one observation of key or
// none (nil) in each, and returns the one alert it resolves.
func resolvedOnce(t *testing.T, t0 time.Time, windows []*Observation) events.Alert {
	t.Helper()
	tr := New(time.Hour)
	var resolved []events.Alert
	for i, o := range windows {
		start := t0.Add(time.Duration(i) * time.Minute)
		tr.Begin(start)
		if o != nil {
			tr.Observe(key, *o)
		}
		for _, a := range tr.End(start.Add(time.Minute)) {
			if a.State == events.AlertResolved {
				resolved = append(resolved, a)
			}
		}
	}
	if len(resolved) != 1 {
		t.Fatalf("resolved %d times, want once", len(resolved))
	}
	return resolved[0]
}

// TestResolvedCarriesTheWindowThatResolvedIt: a resolved alert's value, threshold and
// baseline are those of one window, the latest judged normal, and the level it was judged
// by, so "resolved" never comes with a value beyond the threshold shown; a series gone
// silent says so. The resolved alert used to carry the resolving window's value with the
// breaching window's threshold and baseline (a baseline that rose since made a resolved
// 150 next to a threshold of 100), and a silent series its last breaching value with no
// reason.
func TestResolvedCarriesTheWindowThatResolvedIt(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	breach := obs(150) // threshold 100, resolve level 90, center 50
	moved := Observation{Value: 150, Threshold: 250, ResolveAt: 240, HighIsBad: true, Method: "median_mad", Center: 200, Spread: 25, For: 2, KeepFiringFor: 2}
	low := func(v float64) *Observation { // low is bad: fires below 0.6, resolves at or above 0.65
		return &Observation{Value: v, Threshold: 0.6, ResolveAt: 0.65, Method: "median_mad", Center: 0.8, Spread: 0.05, For: 2, KeepFiringFor: 2}
	}
	for _, tc := range []struct {
		name                 string
		windows              []*Observation // nil: the key is not observed in the window
		wantValue, wantThr   float64
		wantCenter           float64
		wantWindow           int // index of the window the numbers come from
		wantReason, wantText string
	}{
		{"hysteresis: the resolve level is shown", []*Observation{&breach, &breach, ptr(obs(85)), ptr(obs(80))},
			80, 90, 50, 3, events.ResolvedNormal, "80 back at or below 90"},
		{"a baseline that moved: the resolving window's level and baseline", []*Observation{&breach, &breach, &moved, &moved},
			150, 240, 200, 3, events.ResolvedNormal, "150 back at or below 240 (baseline median 200"},
		{"low is bad", []*Observation{low(0.4), low(0.4), low(0.7), low(0.66)},
			0.66, 0.65, 0.8, 3, events.ResolvedNormal, "0.66 back at or above 0.65"},
		{"silent series: the last breach, and the reason", []*Observation{&breach, ptr(obs(160)), nil, nil},
			160, 100, 50, 1, events.ResolvedSilent, "no value to judge for 2 window(s); last 160 above 100"},
		{"normal then silent: the normal window, and the reason", []*Observation{&breach, &breach, ptr(obs(40)), nil},
			40, 90, 50, 2, events.ResolvedSilent, "40 back at or below 90 (baseline mean 50, σ 25) on prod/chat/m/0-499; 1 window(s) had no value to judge"},
		{"within SLA: the reason the value is normal", []*Observation{&breach, &breach, ptr(Observation{Value: 150, Threshold: 100, ResolveAt: 100, HighIsBad: true, Normal: events.ResolvedWithinSLA, Method: "static", KeepFiringFor: 1})},
			150, 100, 0, 2, events.ResolvedWithinSLA, "150, but no series it serves breaks its TTFT p95 SLA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := resolvedOnce(t, t0, tc.windows)
			if a.Value != tc.wantValue || a.Threshold != tc.wantThr || a.BaselineCenter != tc.wantCenter || a.ResolveReason != tc.wantReason {
				t.Errorf("resolved value %v threshold %v center %v reason %q, want %v %v %v %q", a.Value, a.Threshold, a.BaselineCenter, a.ResolveReason,
					tc.wantValue, tc.wantThr, tc.wantCenter, tc.wantReason)
			}
			if want := t0.Add(time.Duration(tc.wantWindow) * time.Minute); !a.WindowStart.Equal(want) {
				t.Errorf("window_start %s, want %s (the window of the numbers)", a.WindowStart, want)
			}
			if end := t0.Add(time.Duration(len(tc.windows)) * time.Minute); !a.EndsAt.Equal(end) || !a.At.Equal(end) {
				t.Errorf("ends_at %s at %s, want %s", a.EndsAt, a.At, end)
			}
			if !strings.Contains(a.Summary, tc.wantText) || !strings.HasPrefix(a.Summary, key.Rule+" resolved: ") {
				t.Errorf("summary %q, want it to contain %q", a.Summary, tc.wantText)
			}
		})
	}
}

// TestResendWhileResolvingKeepsTheBreach: a firing alert re-sent during the normal windows
// that will resolve it still carries the breach it fires for. It carried the normal
// window's value: "firing: 50 above 100".
func TestResendWhileResolvingKeepsTheBreach(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tr := New(2 * time.Minute)
	o := obs(150)
	o.KeepFiringFor = 3
	var sent []events.Alert
	for i, v := range []float64{150, 150, 50, 50} {
		start := t0.Add(time.Duration(i) * time.Minute)
		tr.Begin(start)
		o.Value = v
		tr.Observe(key, o)
		sent = append(sent, tr.End(start.Add(time.Minute))...)
	}
	if len(sent) != 2 || sent[1].State != events.AlertFiring {
		t.Fatalf("sent %d alerts, want the firing one and its re-send", len(sent))
	}
	if r := sent[1]; r.Value != 150 || r.Threshold != 100 || !r.WindowStart.Equal(t0.Add(time.Minute)) || !strings.Contains(r.Summary, "150 above 100") {
		t.Errorf("re-send value %v threshold %v window %s summary %q, want the breach of 12:01", r.Value, r.Threshold, r.WindowStart, r.Summary)
	}
}

// TestRestoredAlertKnowsItsDirection: a firing alert restored after a restart, resolved
// by silence or re-sent, names its bad direction, which the alert does not carry: it said
// "2500 below 2000" of a TTFT SLA alert.
func TestRestoredAlertKnowsItsDirection(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		rule      string
		highIsBad bool
		value     float64
		threshold float64
		want      string
	}{
		{"ttft_p95_sla", true, 2500, 2000, "last 2500 above 2000"},
		{"satisfaction_dynamic", false, 0.4, 0.6, "last 0.4 below 0.6"},
	} {
		k := Key{Rule: tc.rule, Severity: "warning", Env: "prod", Scene: "chat"}
		tr := New(time.Hour)
		tr.Restore(events.Alert{Rule: k.Rule, Severity: k.Severity, State: events.AlertFiring, Labels: k.Labels(),
			Value: tc.value, Threshold: tc.threshold, StartsAt: t0, At: t0}, 1, tc.highIsBad, false)
		tr.Begin(t0)
		sent := tr.End(t0.Add(time.Minute))
		if len(sent) != 1 || sent[0].ResolveReason != events.ResolvedSilent || !strings.Contains(sent[0].Summary, tc.want) {
			t.Errorf("%s: sent %+v, want resolved as silent, %s", tc.rule, sent, tc.want)
		}
	}
}

func ptr(o Observation) *Observation { return &o }

// TestHoldIsBounded: an alert held because its series' traffic stays too thin to judge
// resolves as silent once it has had no judged window for MaxHold, instead of firing (and
// being re-sent) forever; before then it holds. It held forever.
func TestHoldIsBounded(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tr := New(time.Hour)
	step(tr, t0, 150, 150)
	var resolved []events.Alert
	var at time.Time
	for i := 2; i < 2+24*60+5; i++ {
		start := t0.Add(time.Duration(i) * time.Minute)
		tr.Begin(start)
		tr.Hold(key)
		for _, a := range tr.End(start.Add(time.Minute)) {
			if a.State == events.AlertResolved {
				resolved = append(resolved, a)
				at = start.Add(time.Minute)
			}
		}
	}
	// Last judged window 12:01; held through 12:01 + 24h, then two windows count.
	if want := t0.Add(time.Minute + MaxHold + 2*time.Minute); len(resolved) != 1 || !at.Equal(want) {
		t.Fatalf("resolved %d times, at %s; want once at %s", len(resolved), at, want)
	}
	if r := resolved[0]; r.ResolveReason != events.ResolvedSilent || r.Value != 150 {
		t.Errorf("resolved %+v, want silent with the last breach", r)
	}
}

// TestResolvedSummaryMatchesItsWindows: a resolved alert's summary tells what its windows
// held, in their order. A gpu_saturation alert whose host stayed busy within SLA and then
// went silent said "150 back at or below 100" (a value beyond the level, "back" past it);
// a silent window before the normal one was told as coming after it ("then").
func TestResolvedSummaryMatchesItsWindows(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	breach := obs(150)
	withinSLA := Observation{Value: 150, Threshold: 100, ResolveAt: 100, HighIsBad: true, Normal: events.ResolvedWithinSLA, Method: "static", KeepFiringFor: 2}
	for _, tc := range []struct {
		name       string
		windows    []*Observation
		wantReason string
		want, not  string
	}{
		{"within SLA, then silent", []*Observation{&breach, &breach, &withinSLA, nil},
			events.ResolvedSilent, "150, but no series it serves breaks its TTFT p95 SLA on prod/chat/m/0-499; 1 window(s) had no value to judge", "back"},
		{"silent, then normal", []*Observation{&breach, &breach, nil, ptr(obs(40))},
			events.ResolvedSilent, "40 back at or below 90 (baseline mean 50, σ 25) on prod/chat/m/0-499; 1 window(s) had no value to judge", "then"},
		{"normal, then silent", []*Observation{&breach, &breach, ptr(obs(40)), nil},
			events.ResolvedSilent, "40 back at or below 90 (baseline mean 50, σ 25) on prod/chat/m/0-499; 1 window(s) had no value to judge", "then"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := resolvedOnce(t, t0, tc.windows)
			if a.ResolveReason != tc.wantReason || !strings.HasSuffix(a.Summary, tc.want) || strings.Contains(a.Summary, tc.not) {
				t.Errorf("reason %q summary %q, want %q ending %q and not containing %q", a.ResolveReason, a.Summary, tc.wantReason, tc.want, tc.not)
			}
		})
	}
}

// TestRestartKeepsTheHold: an alert held after a normal window resolves when its hold ends
// whether or not the alerter restarted meanwhile: the firing alert it restores from says
// which window was judged last (judged_window_start), and the hold runs from there. A restart measured the hold
// from the breaching window, resolving the alert hours early as silent.
func TestRestartKeepsTheHold(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	normalAt := 20 * 60 // minutes after t0: one normal window, then only held windows
	restartAt := 25 * 60
	run := func(restart bool) (time.Time, events.Alert) {
		tr := New(time.Hour)
		var lastFiring events.Alert
		for i := 0; i < normalAt+24*60+10; i++ {
			start := t0.Add(time.Duration(i) * time.Minute)
			if restart && i == restartAt {
				tr = New(time.Hour)
				tr.Restore(lastFiring, 2, true, false)
			}
			tr.Begin(start)
			switch {
			case i < 2:
				tr.Observe(key, obs(150))
			case i == normalAt:
				tr.Observe(key, obs(40))
			default:
				tr.Hold(key)
			}
			for _, a := range tr.End(start.Add(time.Minute)) {
				if a.State == events.AlertResolved {
					return start.Add(time.Minute), a
				}
				lastFiring = a
			}
		}
		return time.Time{}, events.Alert{}
	}
	want, _ := run(false)
	// The normal window counts: one window past the hold resolves it.
	if exp := t0.Add(time.Duration(normalAt)*time.Minute + MaxHold + time.Minute); !want.Equal(exp) {
		t.Fatalf("without a restart resolved at %s, want %s", want, exp)
	}
	// The normal window before the restart is not counted again: one window later at most.
	got, a := run(true)
	if got.Before(want) || got.After(want.Add(time.Minute)) || a.ResolveReason != events.ResolvedSilent {
		t.Errorf("after a restart resolved at %s (%s), want %s or the window after, silent", got, a.ResolveReason, want)
	}
}
