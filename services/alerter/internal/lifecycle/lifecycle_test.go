package lifecycle

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var key = Key{Rule: "ttft_p95_dynamic", Severity: "warning", Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499"}

func obs(v float64) Observation {
	return Observation{Value: v, Threshold: 100, ResolveAt: 90, HighIsBad: true, Method: "mean_sigma", Center: 50, Spread: 25, For: 2, KeepFiringFor: 2}
}

// step feeds one window per value (a negative value: the key is not observed at all) and
// returns the states sent per window.
func step(tr *Tracker, t0 time.Time, values ...float64) [][]string {
	var out [][]string
	for i, v := range values {
		start := t0.Add(time.Duration(i) * time.Minute)
		tr.Begin(start)
		if v >= 0 {
			tr.Observe(key, obs(v))
		}
		var states []string
		for _, a := range tr.End(start.Add(time.Minute)) {
			states = append(states, a.State)
		}
		out = append(out, states)
	}
	return out
}

func TestLifecycle(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		values []float64
		want   []string // per window: "" nothing, "F" firing, "R" resolved
	}{
		{"one breach stays pending", []float64{150, 50, 50}, []string{"", "", ""}},
		{"two breaches fire once", []float64{150, 150, 150, 150}, []string{"", "F", "", ""}},
		{"resolved after keep_firing_for normal windows", []float64{150, 150, 50, 50, 50}, []string{"", "F", "", "R", ""}},
		{"hysteresis: 95 is not normal for a firing alert", []float64{150, 150, 95, 95, 80, 80}, []string{"", "F", "", "", "", "R"}},
		{"a breach resets the normal count", []float64{150, 150, 50, 150, 50, 50}, []string{"", "F", "", "", "", "R"}},
		{"an absent series counts as normal", []float64{150, 150, -1, -1}, []string{"", "F", "", "R"}},
		{"pending breaks on a normal window", []float64{150, 50, 150, 150}, []string{"", "", "", "F"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(time.Hour)
			got := step(tr, t0, tc.values...)
			for i, w := range tc.want {
				g := ""
				for _, s := range got[i] {
					g += map[string]string{events.AlertFiring: "F", events.AlertResolved: "R"}[s]
				}
				if g != w {
					t.Errorf("window %d: sent %q, want %q (all: %v)", i, g, w, got)
				}
			}
		})
	}
}

func TestResendAndFields(t *testing.T) {
	tr := New(10 * time.Minute)
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	var sent []events.Alert
	for i := range 25 {
		start := t0.Add(time.Duration(i) * time.Minute)
		tr.Begin(start)
		tr.Observe(key, obs(150+float64(i)))
		sent = append(sent, tr.End(start.Add(time.Minute))...)
	}
	// Fires at the end of window 1 (12:02), re-sent at 12:12 and 12:22.
	if len(sent) != 3 {
		t.Fatalf("sent %d, want 3 (fire and two re-sends)", len(sent))
	}
	first := sent[0]
	if !first.At.Equal(t0.Add(2*time.Minute)) || !first.StartsAt.Equal(first.At) || !sent[1].At.Equal(t0.Add(12*time.Minute)) {
		t.Errorf("at %s starts %s, resend at %s", first.At, first.StartsAt, sent[1].At)
	}
	if sent[1].Fingerprint != first.Fingerprint || !sent[1].StartsAt.Equal(first.StartsAt) {
		t.Error("a re-send must keep the fingerprint and starts_at")
	}
	if first.Value != 151 || first.Threshold != 100 || first.BaselineCenter != 50 || first.BaselineSpread != 25 || first.BaselineMethod != "mean_sigma" {
		t.Errorf("alert %+v lacks the numbers that explain it", first)
	}
	if first.Labels["alertname"] != key.Rule || first.Labels["bucket"] != "0-499" || first.Labels["severity"] != "warning" {
		t.Errorf("labels %v", first.Labels)
	}
	if first.Summary == "" || first.WindowStart != t0.Add(time.Minute) {
		t.Errorf("summary %q window %s", first.Summary, first.WindowStart)
	}
}

func TestFingerprint(t *testing.T) {
	a := Fingerprint(map[string]string{"a": "1", "b": "2"})
	b := Fingerprint(map[string]string{"b": "2", "a": "1"})
	c := Fingerprint(map[string]string{"a": "12", "b": ""})
	if a != b || a == c || len(a) != 16 {
		t.Errorf("fingerprints %s %s %s: want order-independent, distinct, 16 hex digits", a, b, c)
	}
	if Fingerprint(key.Labels()) == Fingerprint(Key{Rule: key.Rule, Severity: "critical", Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499"}.Labels()) {
		t.Error("severity must be part of the identity")
	}
}

// A firing alert restored after a restart is not sent again, is re-sent on schedule and
// resolves once.
func TestRestore(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tr := New(time.Hour)
	step(tr, t0, 150, 150)
	firing := tr.End(t0) // nothing new
	if len(firing) != 0 {
		t.Fatalf("unexpected %v", firing)
	}
	labels := key.Labels()
	restored := New(time.Hour)
	restored.Restore(events.Alert{Fingerprint: Fingerprint(labels), Rule: key.Rule, Severity: key.Severity, State: events.AlertFiring,
		Labels: labels, StartsAt: t0.Add(2 * time.Minute), At: t0.Add(2 * time.Minute)}, 2, true, false)
	got := step(restored, t0.Add(2*time.Minute), 150, 150, 50, 50)
	want := [][]string{nil, nil, nil, {events.AlertResolved}}
	for i := range want {
		if len(got[i]) != len(want[i]) || (len(want[i]) == 1 && got[i][0] != want[i][0]) {
			t.Errorf("window %d: sent %v, want %v", i, got[i], want[i])
		}
	}
}

func TestHold(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tr := New(time.Hour)
	step(tr, t0, 150, 150)
	for i := range 5 { // too little traffic to judge: the alert holds
		start := t0.Add(time.Duration(2+i) * time.Minute)
		tr.Begin(start)
		tr.Hold(key)
		if sent := tr.End(start.Add(time.Minute)); len(sent) != 0 {
			t.Fatalf("held window %d sent %v", i, sent)
		}
	}
	if f, _ := tr.Count(); f != 1 {
		t.Errorf("firing %d, want 1", f)
	}
}

// An engine alert's key survives its labels (a restart restores it to the same key), and
// an inclusive observation breaches at its threshold.
func TestEngineKeyAndInclusive(t *testing.T) {
	k := Key{Rule: "kv_cache_saturation", Severity: "warning", Model: "m", Instance: "gpu1", Engine: "vllm"}
	a := events.Alert{Rule: k.Rule, Severity: k.Severity, Labels: k.Labels()}
	if got := KeyOf(&a); got != k || a.Labels["engine"] != "vllm" {
		t.Fatalf("KeyOf(%v) = %+v, want %+v", a.Labels, got, k)
	}
	at := Observation{Value: 0.95, Threshold: 0.95, HighIsBad: true}
	if at.breach(at.Threshold) {
		t.Fatal("a value at an exclusive threshold breached")
	}
	at.Inclusive = true
	if !at.breach(at.Threshold) {
		t.Fatal("a value at an inclusive threshold did not breach")
	}
}
