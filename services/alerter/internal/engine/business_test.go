package engine_test

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// thumbs returns a window's thumbs rollups for scene: n verdicts, up of them positive, split
// over two models and two sources (they add per scene).
func thumbs(start time.Time, scene string, n, up uint64) []events.FeedbackRollup {
	r := events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
		Env: "prod", Scene: scene, Model: "a", Name: "thumbs", Source: "user", Count: n / 2, Positive: up / 2}
	s := r
	s.Model, s.Source, s.Count, s.Positive = "b", "evaluator", n-n/2, up-up/2
	return []events.FeedbackRollup{r, s}
}

// outcomes returns a window's gateway token rollup for scene with these outcomes, and an
// engine-layer one of the same requests, all abandoned, which must not count.
func outcomes(start time.Time, scene string, completed, abandoned uint64) []events.TokenRollup {
	r := row(start, "", 200, events.Latency{}) // steady traffic: only the outcomes change
	r.Scene, r.Completed, r.Abandoned = scene, completed, abandoned
	eng := r
	eng.Layer, eng.Completed, eng.Abandoned = events.LayerEngine, 0, completed+abandoned
	return []events.TokenRollup{r, eng}
}

// businessWeek learns a week of one-minute windows around now's time of day: satisfaction
// about 0.8 and completion about 0.9, with a little noise.
func businessWeek(e *engine.Engine, now time.Time) {
	for d := 1; d <= 7; d++ {
		for m := -30; m <= 30; m++ {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
			j := uint64((m + 40 + d) % 5) // 0 to 4
			e.Learn(engine.Window{Start: start, Seconds: 60,
				Feedback: thumbs(start, "chat", 100, 78+j),
				Tokens:   outcomes(start, "chat", 88+j, 12-j)})
		}
	}
}

func fired(alerts []events.Alert, rule string) *events.Alert {
	for i := range alerts {
		if alerts[i].Rule == rule && alerts[i].State == events.AlertFiring {
			return &alerts[i]
		}
	}
	return nil
}

// TestBusinessRules checks satisfaction and completion rate against a week's baseline: a
// drop fires after `for` windows with the scene's labels only, a rise never fires, a window
// below the minimum count neither fires nor resolves, and outcomes at the engine layer and
// verdicts of another name or of no scene are not counted.
func TestBusinessRules(t *testing.T) {
	now := time.Date(2026, 3, 4, 15, 0, 0, 0, time.UTC) // a Wednesday afternoon
	type win struct {
		verdicts, up         uint64
		completed, abandoned uint64
	}
	cases := []struct {
		name    string
		windows []win
		want    []string // rules firing by the end
		resolve []string // rules resolved by the end
	}{
		{"steady", []win{{100, 80, 90, 10}, {100, 79, 91, 9}, {100, 81, 89, 11}}, nil, nil},
		{"satisfaction drops", []win{{100, 50, 90, 10}, {100, 45, 90, 10}, {100, 48, 90, 10}}, []string{"satisfaction_dynamic"}, nil},
		{"completion drops", []win{{100, 80, 60, 40}, {100, 80, 55, 45}}, []string{"completion_rate_dynamic"}, nil},
		{"both rise", []win{{100, 100, 100, 0}, {100, 99, 100, 0}, {100, 100, 100, 0}}, nil, nil},
		{"too few verdicts and outcomes", []win{{10, 0, 5, 10}, {10, 0, 5, 10}, {19, 0, 5, 14}}, nil, nil},
		{"quiet windows hold a firing alert", []win{{100, 40, 90, 10}, {100, 40, 90, 10}, {5, 5, 90, 10}, {0, 0, 90, 10}, {0, 0, 90, 10}, {3, 3, 90, 10}},
			[]string{"satisfaction_dynamic"}, nil},
		{"silent scene holds", []win{{100, 40, 60, 40}, {100, 40, 55, 45}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}},
			[]string{"satisfaction_dynamic", "completion_rate_dynamic"}, nil},
		{"recovery resolves", []win{{100, 40, 90, 10}, {100, 40, 90, 10}, {100, 80, 90, 10}, {100, 80, 90, 10}},
			nil, []string{"satisfaction_dynamic"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, rules.NewSet())
			businessWeek(e, now)
			firing := map[string]events.Alert{}
			resolved := map[string]bool{}
			for i, w := range c.windows {
				start := now.Add(time.Duration(i) * time.Minute)
				fb := thumbs(start, "chat", w.verdicts, w.up)
				// Not satisfaction: another name, and thumbs without a scene.
				fb = append(fb, events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
					Env: "prod", Scene: "chat", Name: "rating", Source: "user", Count: 500, Positive: 0})
				fb = append(fb, events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
					Env: "prod", Name: "thumbs", Source: "user", Count: 500, Positive: 0})
				for _, a := range e.Evaluate(engine.Window{Start: start, Seconds: 60, Feedback: fb, Tokens: outcomes(start, "chat", w.completed, w.abandoned)}) {
					if a.State == events.AlertFiring {
						firing[a.Rule] = a
					} else {
						delete(firing, a.Rule)
						resolved[a.Rule] = true
					}
				}
			}
			for rule, a := range firing {
				found := false
				for _, w := range c.want {
					found = found || w == rule
				}
				if !found {
					t.Errorf("%s fired: %s", rule, a.Summary)
				}
			}
			for _, w := range c.want {
				a, ok := firing[w]
				if !ok {
					t.Errorf("%s is not firing", w)
					continue
				}
				if a.Labels["scene"] != "chat" || a.Labels["env"] != "prod" || a.Labels["model"] != "" || a.Labels["bucket"] != "" ||
					a.Value >= a.Threshold || a.Threshold >= a.BaselineCenter || a.BaselineMethod != rules.MedianMAD {
					t.Errorf("%s: %+v", w, a)
				}
			}
			for _, w := range c.resolve {
				if !resolved[w] {
					t.Errorf("%s was not resolved", w)
				}
			}
		})
	}
}

// TestBusinessMinimumFromRules checks that the minimum count comes from the scene's rules:
// with min_requests 5 a window of 10 verdicts fires, and a window under it is not learned.
func TestBusinessMinimumFromRules(t *testing.T) {
	rs, err := rules.Parse([]byte("scenes:\n  chat:\n    dynamic:\n      satisfaction: {min_requests: 5, min_points: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 4, 15, 0, 0, 0, time.UTC)
	e := newEngine(t, rs)
	for d := 1; d <= 7; d++ {
		for m := -30; m <= 30; m += 5 {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
			e.Learn(engine.Window{Start: start, Seconds: 60, Feedback: thumbs(start, "chat", 10, 8+uint64(m+30)/5%2)})
			// Windows of 4 verdicts, all negative, are under the minimum: not learned.
			e.Learn(engine.Window{Start: start.Add(time.Minute), Seconds: 60, Feedback: thumbs(start.Add(time.Minute), "chat", 4, 0)})
		}
	}
	var last []events.Alert
	for i := range 2 {
		start := now.Add(time.Duration(i) * time.Minute)
		last = e.Evaluate(engine.Window{Start: start, Seconds: 60, Feedback: thumbs(start, "chat", 10, 4)})
	}
	a := fired(last, "satisfaction_dynamic")
	if a == nil {
		t.Fatalf("satisfaction 0.4 against a baseline of 0.85 sent %v", rulesOf(last))
	}
	if a.BaselineCenter < 0.8 {
		t.Errorf("baseline center %v: windows under the minimum were learned", a.BaselineCenter)
	}
}

// completions returns a window's task_completed rollups for scene: completed of n verdicts
// positive, split over two models.
func completions(start time.Time, scene string, completed, abandoned uint64) []events.FeedbackRollup {
	r := events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
		Env: "prod", Scene: scene, Model: "a", Name: rules.CompletionFeedback, Source: "user", Count: (completed + abandoned) / 2, Positive: completed / 2}
	s := r
	s.Model, s.Count, s.Positive = "b", completed+abandoned-r.Count, completed-r.Positive
	return []events.FeedbackRollup{r, s}
}

// TestCompletionFromVerdicts: an app behind the gateway proxy reports completion as
// task_completed verdicts, not as outcomes on its requests; completion rate learns its
// baseline from them and fires when they drop, and a window of them beside requests'
// outcomes counts both.
func TestCompletionFromVerdicts(t *testing.T) {
	now := time.Date(2026, 3, 4, 15, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		windows [][4]uint64 // verdicts completed, abandoned; outcomes completed, abandoned
		fires   bool
	}{
		{"steady", [][4]uint64{{90, 10, 0, 0}, {89, 11, 0, 0}, {91, 9, 0, 0}}, false},
		{"verdicts drop", [][4]uint64{{55, 45, 0, 0}, {50, 50, 0, 0}, {52, 48, 0, 0}}, true},
		// 60 of 100 verdicts, 0 of 100 outcomes: 0.3
		{"verdicts and outcomes add", [][4]uint64{{60, 40, 0, 100}, {60, 40, 0, 100}, {60, 40, 0, 100}}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, rules.NewSet())
			for d := 1; d <= 7; d++ {
				for m := -30; m <= 30; m++ {
					start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute)
					j := uint64((m + 40 + d) % 5)
					e.Learn(engine.Window{Start: start, Seconds: 60, Feedback: completions(start, "chat", 88+j, 12-j)})
				}
			}
			fired := false
			for i, w := range c.windows {
				start := now.Add(time.Duration(i) * time.Minute)
				win := engine.Window{Start: start, Seconds: 60, Feedback: completions(start, "chat", w[0], w[1])}
				if w[2]+w[3] > 0 {
					win.Tokens = outcomes(start, "chat", w[2], w[3])
				}
				for _, a := range e.Evaluate(win) {
					if a.Rule == "completion_rate_dynamic" && a.State == events.AlertFiring {
						fired = true
						if a.Labels["scene"] != "chat" || a.Value >= a.Threshold {
							t.Errorf("%+v", a)
						}
					}
				}
			}
			if fired != c.fires {
				t.Errorf("completion_rate_dynamic fired %v, want %v", fired, c.fires)
			}
		})
	}
}
