package window_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// series collects the requests of the closed units by env/scene/model/instance.
func series(a *window.Aggregator, units []*window.TokenUnit, into map[string]uint64) {
	for _, u := range units {
		for _, r := range a.Rollups(u, nil) {
			into[fmt.Sprintf("%s/%s/%s/%s", r.Env, r.Scene, r.Model, r.Instance)] += r.Requests
		}
		a.Release(u)
	}
}

// TestSeriesFoldAfterBurst: 100,000 made-up scenes fill AGG_MAX_SERIES; while they come, a
// new series folds but keeps its env (staging's own series is not lost into other/other);
// once they have gone quiet, a real new scene gets its own series, not "other" for an hour.
func TestSeriesFoldAfterBurst(t *testing.T) {
	c := cfg(t)
	c.MaxSeries = 10_000
	a := window.New(c, nil)
	got := map[string]uint64{}
	seq := uint64(0)
	add := func(env, scene string, at time.Duration) {
		seq++
		e := ev(at, events.StatusOK, 10, 2, 5, 20)
		e.Env, e.Scene = env, scene
		a.Add(e, seq, t0.Add(at))
	}
	for i := range 100_000 {
		at := time.Duration(i) * time.Millisecond
		add("prod", fmt.Sprint("burst-", i), at)
		if i%10_000 == 0 {
			series(a, a.Advance(t0.Add(at)), got)
		}
	}
	burstEnd := 100 * time.Second
	add("staging", "chat", burstEnd+time.Minute)
	add("prod", "checkout", burstEnd+time.Minute)
	add("prod", "checkout", burstEnd+8*time.Minute)
	series(a, a.Advance(t0.Add(burstEnd+time.Hour)), got)

	var total uint64
	for _, n := range got {
		total += n
	}
	for _, c := range []struct {
		key  string
		want uint64
	}{
		{"prod/burst-0/m1/", 1},
		{"prod/other/m1/", 0},
		{"prod/other/other/other", 100_000 - 10_000 + 1}, // the burst past the limit, and checkout during it
		{"staging/other/other/other", 1},
		{"other/other/other/other", 0},
		{"prod/checkout/m1/", 1},
	} {
		if got[c.key] != c.want {
			t.Errorf("%s: %d requests, want %d", c.key, got[c.key], c.want)
		}
	}
	if total != 100_003 || a.Folded() != 100_000-10_000+2 {
		t.Fatalf("%d requests in rollups, %d folded", total, a.Folded())
	}
}

// TestEnvAloneOverflows: only envs past MaxFoldedEnvs fold their env into "other".
func TestEnvAloneOverflows(t *testing.T) {
	c := cfg(t)
	c.MaxSeries = 1
	a := window.New(c, nil)
	now := t0.Add(time.Second)
	for i := range window.MaxFoldedEnvs + 2 {
		e := ev(0, events.StatusOK, 10, 2, 5, 20)
		e.Env = fmt.Sprint("env-", i)
		a.Add(e, uint64(i+1), now)
	}
	got := map[string]uint64{}
	series(a, a.Advance(t0.Add(time.Hour)), got)
	if got["env-0/chat/m1/"] != 1 || got["env-1/other/other/other"] != 1 || got[fmt.Sprintf("env-%d/other/other/other", window.MaxFoldedEnvs)] != 1 ||
		got["other/other/other/other"] != 1 || len(got) != window.MaxFoldedEnvs+2 {
		t.Fatalf("%d series: %v", len(got), got)
	}
}
