package history_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/history"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

func TestMain(m *testing.M) { testbed.Main(m) }

type cell struct {
	at       time.Time
	n        uint64
	mean, vr float64
	sample   []float64
}

type fakeBaselines struct {
	series map[engine.SeriesKey]map[rules.Metric][]cell
	hosts  map[string]map[rules.Metric][]cell
}

func (f *fakeBaselines) MergeSeries(k engine.SeriesKey, t time.Time, m rules.Metric, n uint64, mean, vr float64, s []float64) {
	if f.series[k] == nil {
		f.series[k] = map[rules.Metric][]cell{}
	}
	f.series[k][m] = append(f.series[k][m], cell{t, n, mean, vr, s})
}

func (f *fakeBaselines) MergeHost(h string, t time.Time, m rules.Metric, n uint64, mean, vr float64, s []float64) {
	if f.hosts[h] == nil {
		f.hosts[h] = map[rules.Metric][]cell{}
	}
	f.hosts[h][m] = append(f.hosts[h][m], cell{t, n, mean, vr, s})
}

// TestLoadBaselines checks the SQL against the real ClickHouse: two instances of one series
// merge into one value per window (counts summed, percentiles from merged centroids), a
// correction row adds its counts, and tokens join GPU rows by instance = host.
func TestLoadBaselines(t *testing.T) {
	ctx, db, _ := history.OpenMigrated(t)
	step0 := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	tb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model,
		instance, bucket, requests, errors, timeouts, output_tokens, ttft_count, ttft_means, ttft_weights)`)
	if err != nil {
		t.Fatal(err)
	}
	add := func(start time.Time, kind, inst string, req, errs, tmo, out uint64, means []float64, weights []uint64) {
		t.Helper()
		var n uint64
		for _, w := range weights {
			n += w
		}
		if err := tb.Append(start, uint32(60), kind, "prod", "chat", "m", inst, "0-499", req, errs, tmo, out, n, means, weights); err != nil {
			t.Fatal(err)
		}
	}
	// Window 1 (10:00): two instances, 100 requests each; instance b is slow.
	add(step0, "window", "a", 100, 2, 0, 6000, []float64{100, 200}, []uint64{50, 50})
	add(step0, "window", "b", 100, 0, 4, 6000, []float64{900, 1000}, []uint64{50, 50})
	// Window 2 (10:01): one instance, then a correction with two more errors.
	add(step0.Add(time.Minute), "window", "a", 100, 0, 0, 12000, []float64{300}, []uint64{100})
	add(step0.Add(time.Minute), "correction", "a", 0, 2, 0, 0, nil, nil)
	if err := tb.Send(); err != nil {
		t.Fatal(err)
	}
	// The engine's view of window 1's requests on instance a: a series of its own, and no
	// part of the host's efficiency (its output tokens are the gateway's again).
	if err := db.Conn().Exec(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, layer, bucket, requests, errors, output_tokens)
		SELECT toDateTime('2026-03-02 10:00:00'), 60, 'window', 'prod', 'chat', 'm', 'a', 'engine', '0-499', 100, 50, 6000`); err != nil {
		t.Fatal(err)
	}
	gb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO gpu_rollups (window_start, window_seconds, kind, host, gpu_index, samples, util_avg, energy_j)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		start  time.Time
		host   string
		idx    uint16
		util   float64
		energy float64
	}{
		{step0, "a", 0, 40, 3000}, {step0, "a", 1, 60, 3000}, // mean 50 %, 6000 J
		{step0.Add(time.Minute), "a", 0, 100, 6000},
	} {
		if err := gb.Append(g.start, uint32(60), "window", g.host, g.idx, uint64(60), g.util, g.energy); err != nil {
			t.Fatal(err)
		}
	}
	if err := gb.Send(); err != nil {
		t.Fatal(err)
	}

	f := &fakeBaselines{series: map[engine.SeriesKey]map[rules.Metric][]cell{}, hosts: map[string]map[rules.Metric][]cell{}}
	loaded, err := history.LoadBaselines(ctx, db.Conn(), f, step0.Add(-time.Hour), step0.Add(time.Hour), 5*time.Minute, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.SeriesCells != 2 || loaded.HostCells != 1 || !loaded.Through.Equal(step0.Add(time.Minute)) {
		t.Fatalf("loaded %+v, want two series cells (gateway, engine), one host cell, through 10:01", loaded)
	}
	if c := f.series[engine.SeriesKey{Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499", Layer: "engine"}][rules.ErrorRate]; len(c) != 1 || c[0].n != 1 || c[0].mean != 0.5 {
		t.Fatalf("engine layer error rate cells %+v, want one window at 0.5", c)
	}
	s := f.series[engine.SeriesKey{Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499"}]
	near := func(name string, got, want, tol float64) {
		t.Helper()
		if math.Abs(got-want) > tol {
			t.Errorf("%s = %v, want %v ± %v", name, got, want, tol)
		}
	}
	c := s[rules.ErrorRate][0]
	if c.n != 2 || !c.at.Equal(step0) {
		t.Fatalf("error rate cell %+v, want 2 windows at %s", c, step0)
	}
	near("error rate mean", c.mean, (0.01+0.02)/2, 1e-9) // window 1: 2/200; window 2: (0+2)/100
	near("timeout rate mean", s[rules.TimeoutRate][0].mean, (0.02+0)/2, 1e-9)
	near("output tps mean", s[rules.OutputTPS][0].mean, (12000.0/60+12000.0/60)/2, 1e-9)
	// TTFT p95: window 1 merges both instances, so its p95 sits in the slow instance's
	// centroids (≈ 1000), not the average of two p95s; window 2 is 300.
	tt := s[rules.TTFTP95][0]
	if tt.n != 2 || len(tt.sample) != 2 {
		t.Fatalf("ttft cell %+v, want 2 windows, 2 sampled", tt)
	}
	hi := max(tt.sample[0], tt.sample[1])
	near("merged ttft p95 of window 1", hi, 1000, 60)
	if _, ok := s[rules.TPOTP95]; ok && s[rules.TPOTP95][0].n != 0 {
		t.Errorf("tpot has %d windows, want none (no tpot samples)", s[rules.TPOTP95][0].n)
	}
	h := f.hosts["a"]
	// Efficiency: tps / util. Window 1: (6000/60)/50 = 2; window 2: (12000/60)/100 = 2.
	near("gpu efficiency", h[rules.GPUEfficiency][0].mean, 2, 1e-9)
	// Tokens per joule: window 1: 6000/6000 = 1; window 2: 12000/6000 = 2.
	near("tokens per joule", h[rules.TokensPerJoule][0].mean, 1.5, 1e-9)
	near("tokens per joule variance", h[rules.TokensPerJoule][0].vr, 0.25, 1e-9)
}

// TestRestoreAlerts reads the latest state per fingerprint back from the ALERTS stream.
func TestRestoreAlerts(t *testing.T) {
	ns := testbed.NATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	empty, err := func() ([]events.Alert, error) {
		if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 20, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamAlerts); err != nil {
			t.Fatal(err)
		}
		return history.RestoreAlerts(ctx, js, time.Now().Add(-time.Hour))
	}()
	if err != nil || len(empty) != 0 {
		t.Fatalf("empty stream: %v, %v; want nothing", empty, err)
	}
	at := time.Now().UTC().Truncate(time.Second)
	for _, a := range []events.Alert{
		{V: 1, Fingerprint: "aaa", Rule: "ttft_p95_dynamic", State: "firing", Severity: "warning", At: at},
		{V: 1, Fingerprint: "bbb", Rule: "error_rate_sla", State: "firing", Severity: "critical", At: at},
		{V: 1, Fingerprint: "aaa", Rule: "ttft_p95_dynamic", State: "resolved", Severity: "warning", At: at.Add(time.Minute)},
		{V: 1, Fingerprint: "ccc", Rule: "gpu_saturation", State: "firing", Severity: "warning", At: at.Add(time.Minute)},
	} {
		data, _ := json.Marshal(a)
		if _, err := js.Publish(ctx, events.AlertSubject(a.Severity, a.Rule), data); err != nil {
			t.Fatal(err)
		}
	}
	got, err := history.RestoreAlerts(ctx, js, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var fps []string
	for _, a := range got {
		fps = append(fps, a.Fingerprint)
	}
	if len(fps) != 2 || fps[0] != "bbb" || fps[1] != "ccc" {
		t.Errorf("restored %v, want [bbb ccc] (aaa resolved)", fps)
	}
}

type fakeBusiness map[engine.SceneKey]map[rules.Metric][]cell

func (f fakeBusiness) MergeBusiness(k engine.SceneKey, t time.Time, m rules.Metric, n uint64, mean, vr float64, s []float64) {
	if f[k] == nil {
		f[k] = map[rules.Metric][]cell{}
	}
	f[k][m] = append(f[k][m], cell{t, n, mean, vr, s})
}

// TestLoadCompletionBaselines: completion rate's baseline counts a scene's task_completed
// verdicts (positive completed, the rest abandoned) beside its gateway requests' outcomes, as
// the engine does: a scene whose app reports completion only as verdicts (behind the gateway
// proxy) has a baseline, and one reporting both ways sums them per window.
func TestLoadCompletionBaselines(t *testing.T) {
	ctx, db, _ := history.OpenMigrated(t)
	fb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO feedback_rollups (window_start, window_seconds, kind, env, scene, model, name, source, count, positive)`)
	if err != nil {
		t.Fatal(err)
	}
	step0 := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		at          time.Time
		kind, scene string
		name        string
		count, up   uint64
	}{
		// proxy: verdicts only, 8 of 10 and 6 of 10 completed (a correction adds 1 of 2)
		{step0, "window", "proxy", "task_completed", 10, 8},
		{step0.Add(time.Minute), "window", "proxy", "task_completed", 8, 5},
		{step0.Add(time.Minute), "correction", "proxy", "task_completed", 2, 1},
		{step0, "window", "proxy", "thumbs", 10, 0},
		{step0, "window", "both", "task_completed", 10, 10},
	} {
		if err := fb.Append(r.at, uint32(60), r.kind, "prod", r.scene, "m", r.name, "user", r.count, r.up); err != nil {
			t.Fatal(err)
		}
	}
	if err := fb.Send(); err != nil {
		t.Fatal(err)
	}
	// both: 0 of 10 outcomes beside 10 of 10 verdicts; the engine layer's are not counted
	tb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, layer, bucket, requests, completed, abandoned)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, layer := range []string{"gateway", "engine"} {
		done := uint64(0)
		if layer == "engine" {
			done = 10
		}
		if err := tb.Append(step0, uint32(60), "window", "prod", "both", "m", "a", layer, "0-499", uint64(10), done, 10-done); err != nil {
			t.Fatal(err)
		}
	}
	if err := tb.Send(); err != nil {
		t.Fatal(err)
	}
	rs, err := rules.Parse([]byte("defaults:\n  dynamic:\n    completion_rate: {min_requests: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := fakeBusiness{}
	if _, _, err := history.LoadBusinessBaselines(ctx, db.Conn(), f, rs, step0.Add(-time.Hour), step0.Add(time.Hour), 5*time.Minute, time.UTC); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		scene string
		n     uint64
		mean  float64
	}{{"proxy", 2, (0.8 + 0.6) / 2}, {"both", 1, 0.5}} {
		got := f[engine.SceneKey{Env: "prod", Scene: c.scene}][rules.CompletionRate]
		if len(got) != 1 || got[0].n != c.n || math.Abs(got[0].mean-c.mean) > 1e-9 {
			t.Errorf("%s completion cells %+v, want one of %d windows, mean %v", c.scene, got, c.n, c.mean)
		}
	}
}
