package history_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/history"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// TestBaselineStepsInTheTimeZone: history falls into the baseline steps of the time of day
// in ALERTER_TIMEZONE, as the windows the engine learns do, also where the zone's offset is
// no multiple of the step (India, +05:30, with 1 h steps). The steps were cut in UTC: a
// window at 18:10 there went into the 17:00 step, and the engine learns it into 18:00's.
func TestBaselineStepsInTheTimeZone(t *testing.T) {
	ctx, db, _ := history.OpenMigrated(t)
	ist := time.FixedZone("IST", 5*3600+1800)
	const step = time.Hour
	w := time.Date(2026, 3, 2, 12, 40, 0, 0, time.UTC) // 18:10 in India
	for _, q := range []string{
		`INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, layer, bucket, requests, errors, output_tokens, completed, abandoned)
			SELECT toDateTime(%d), 60, 'window', 'prod', 'chat', 'm', 'a', 'gateway', '0-499', 100, 1, 6000, 30, 10`,
		`INSERT INTO gpu_rollups (window_start, window_seconds, kind, host, gpu_index, samples, util_avg, energy_j) SELECT toDateTime(%d), 60, 'window', 'a', 0, 60, 50, 3000`,
		`INSERT INTO engine_rollups (window_start, window_seconds, kind, host, engine, name, model, samples, up_samples, queue_depth_avg) SELECT toDateTime(%d), 60, 'window', 'a', 'vllm', 'vllm', 'm', 60, 60, 2`,
		`INSERT INTO feedback_rollups (window_start, window_seconds, kind, env, scene, model, name, source, count, positive) SELECT toDateTime(%d), 60, 'window', 'prod', 'chat', 'm', 'thumbs', 'user', 30, 20`,
	} {
		if err := db.Conn().Exec(ctx, fmt.Sprintf(q, w.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	store, err := baseline.New[string](baseline.Options{Step: step, Slot: time.Hour, Days: 7, Location: ist}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := store.StepOf(w)
	check := func(what string, at time.Time) {
		t.Helper()
		if got := store.StepOf(at); got != want {
			t.Errorf("%s cell at %s: step %d of the time of day there, want %d (that of its window at %s)", what, at.In(ist).Format("15:04"), got, want, w.In(ist).Format("15:04"))
		}
	}
	since, until := w.Add(-2*time.Hour), w.Add(2*time.Hour)
	f := &fakeBaselines{series: map[engine.SeriesKey]map[rules.Metric][]cell{}, hosts: map[string]map[rules.Metric][]cell{}}
	if _, err := history.LoadBaselines(ctx, db.Conn(), f, since, until, step, ist); err != nil {
		t.Fatal(err)
	}
	for _, cells := range f.series {
		check("series", cells[rules.ErrorRate][0].at)
	}
	check("host", f.hosts["a"][rules.TokensPerJoule][0].at)
	fe := fakeEngineBaselines{}
	if _, _, err := history.LoadEngineBaselines(ctx, db.Conn(), fe, since, until, step, ist); err != nil {
		t.Fatal(err)
	}
	check("engine", fe[engine.EngineKey{Host: "a", Name: "vllm", Model: "m"}][0].at)
	fb := fakeBusiness{}
	if _, _, err := history.LoadBusinessBaselines(ctx, db.Conn(), fb, rules.NewSet(), since, until, step, ist); err != nil {
		t.Fatal(err)
	}
	scene := fb[engine.SceneKey{Env: "prod", Scene: "chat"}]
	check("satisfaction", scene[rules.Satisfaction][0].at)
	check("completion", scene[rules.CompletionRate][0].at)
}
