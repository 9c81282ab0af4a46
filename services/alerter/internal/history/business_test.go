package history_test

import (
	"fmt"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/history"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// completionWindow is one window's rollups for the completion series: scene proxy reports
// completion only as task_completed verdicts, scene both as gateway outcomes and verdicts
// beside them. Beside those, rollups neither path may count in them: the engine layer's
// view of both's requests (all abandoned), thumbs, task_completed verdicts without a scene,
// and proxy's verdicts without an env (all abandoned), which are a series of their own.
// done and quit are each source's completed and abandoned counts; proxy has them from each
// of two models.
func completionWindow(start time.Time, done, quit uint64) engine.Window {
	fb := func(scene, model, name string, count, positive uint64) events.FeedbackRollup {
		return events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
			Env: "prod", Scene: scene, Model: model, Name: name, Source: "user", Count: count, Positive: positive}
	}
	tok := func(layer events.Layer, completed, abandoned uint64) events.TokenRollup {
		return events.TokenRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
			Env: "prod", Scene: "both", Model: "m", Instance: "a", Layer: layer, Bucket: "0-499",
			Requests: completed + abandoned, OK: completed + abandoned, Completed: completed, Abandoned: abandoned}
	}
	return engine.Window{Start: start, Seconds: 60,
		Feedback: []events.FeedbackRollup{
			fb("proxy", "a", rules.CompletionFeedback, done+quit, done),
			fb("proxy", "b", rules.CompletionFeedback, done+quit, done),
			fb("proxy", "a", rules.SatisfactionFeedback, 40, 0),
			fb("", "a", rules.CompletionFeedback, 40, 0),
			{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow, Scene: "proxy", Model: "a",
				Name: rules.CompletionFeedback, Source: "user", Count: 40, Positive: 0}, // no env: a series of its own
			fb("both", "a", rules.CompletionFeedback, done+quit, done),
		},
		Tokens: []events.TokenRollup{tok(events.LayerGateway, done, quit), tok(events.LayerEngine, 0, done+quit)},
	}
}

// TestCompletionHistoryMatchesLive feeds the same week of rollups to an engine that learns
// them as they come and, stored in ClickHouse, to one that loads them as history: the two
// baselines of completion rate are the same, so the same windows after them raise the same
// alerts with the same values, thresholds and centers. Scene both's windows of 12 outcomes
// and 12 verdicts are over the minimum of 20 together (proxy's 24 verdicts over it alone),
// the windows of 9 and 9 (proxy's 18) under it; at
// most three windows share a baseline step, so both keep every value for the median.
func TestCompletionHistoryMatchesLive(t *testing.T) {
	ctx, db, _ := history.OpenMigrated(t)
	newEngine := func() *engine.Engine {
		e, err := engine.New(rules.NewSet(), baseline.Options{Step: 5 * time.Minute, Slot: 30 * time.Minute, Days: 7, Location: time.UTC, SplitWeekends: true}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	live, loaded := newEngine(), newEngine()

	now := time.Date(2026, 3, 4, 15, 0, 0, 0, time.UTC) // a Wednesday
	var windows []engine.Window
	for d := 1; d <= 7; d++ {
		for k := -6; k <= 6; k++ {
			for i := range 3 {
				start := now.AddDate(0, 0, -d).Add(time.Duration(5*k+i) * time.Minute)
				j := uint64((k + 7*d + 3*i + 50) % 7) // 0 to 6
				done, quit := 9+j%4, 3-j%4+j%2        // 12 or 13 of each source, 9 to 13 completed
				if i == 2 {
					done, quit = j%3, 9-j%3 // 9 of each: under the minimum, not learned
				}
				windows = append(windows, completionWindow(start, done, quit))
			}
		}
	}
	fb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO feedback_rollups (window_start, window_seconds, kind, env, scene, model, name, source, count, positive)`)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, layer, bucket, requests, ok, completed, abandoned)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range windows {
		live.Learn(w)
		for _, f := range w.Feedback {
			if err := fb.Append(f.WindowStart, f.WindowSeconds, string(f.Kind), f.Env, f.Scene, f.Model, f.Name, string(f.Source), f.Count, f.Positive); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range w.Tokens {
			if err := tb.Append(r.WindowStart, r.WindowSeconds, string(r.Kind), r.Env, r.Scene, r.Model, r.Instance, string(r.Layer), r.Bucket, r.Requests, r.OK, r.Completed, r.Abandoned); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := fb.Send(); err != nil {
		t.Fatal(err)
	}
	if err := tb.Send(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := history.LoadBusinessBaselines(ctx, db.Conn(), loaded, rules.NewSet(), now.AddDate(0, 0, -8), now, 5*time.Minute, time.UTC); err != nil {
		t.Fatal(err)
	}

	// Completion drops to 0.3 in both scenes: pending, then firing.
	type judged struct {
		rule, env, scene, state      string
		value, threshold, center, sd float64
	}
	judge := func(e *engine.Engine, w engine.Window) []judged {
		var out []judged
		for _, a := range e.Evaluate(w) {
			if a.Rule != "completion_rate_dynamic" && a.Rule != "satisfaction_dynamic" {
				continue
			}
			out = append(out, judged{a.Rule, a.Labels["env"], a.Labels["scene"], string(a.State), a.Value, a.Threshold, a.BaselineCenter, a.BaselineSpread})
		}
		sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
		return out
	}
	firing := 0
	for i := range 2 {
		w := completionWindow(now.Add(time.Duration(i)*time.Minute), 9, 21)
		l, h := judge(live, w), judge(loaded, w)
		if len(l) != len(h) {
			t.Fatalf("window %d: live %+v, history %+v", i, l, h)
		}
		for n := range l {
			a, b := l[n], h[n]
			near := func(x, y float64) bool { return math.Abs(x-y) <= 1e-6*math.Max(1, math.Abs(x)) }
			if a.rule != b.rule || a.env != b.env || a.scene != b.scene || a.state != b.state || !near(a.value, b.value) ||
				!near(a.threshold, b.threshold) || !near(a.center, b.center) || !near(a.sd, b.sd) {
				t.Errorf("window %d: live %+v, history %+v", i, a, b)
			}
			if a.state == string(events.AlertFiring) {
				firing++
			}
		}
	}
	if firing != 2 {
		t.Errorf("%d completion alerts firing in both, want 2 (proxy and both)", firing)
	}
}
