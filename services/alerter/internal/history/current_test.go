package history

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// TestBaselineQueriesOnCurrent runs the baseline queries on 18.16 and on ClickHouse 26.7
// (chDB) over the same rows and requires the same answers (the merged t-digest percentiles
// within 5 %: current servers read singleton centroids exactly where 18.16 interpolates).
func TestBaselineQueriesOnCurrent(t *testing.T) {
	ctx, db, cfg := OpenMigrated(t)
	start := time.Now().UTC().Truncate(time.Hour).Add(-2 * time.Hour)
	tb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model,
		instance, bucket, requests, errors, timeouts, output_tokens, ttft_count, ttft_means, ttft_weights)`)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO gpu_rollups (window_start, window_seconds, kind, host, gpu_index, samples, util_avg, energy_j)`)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		w := start.Add(time.Duration(i) * time.Minute)
		for _, inst := range []string{"a", "b"} {
			if err := tb.Append(w, uint32(60), "window", "prod", "chat", "m", inst, "0-499", uint64(100+i), uint64(i%3), uint64(i%2),
				uint64(6000+10*i), uint64(100), []float64{100 + float64(i), 900}, []uint64{90, 10}); err != nil {
				t.Fatal(err)
			}
			if err := gb.Append(w, uint32(60), "window", inst, uint16(0), uint64(60), 40+float64(i), 3000+float64(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tb.Send(); err != nil {
		t.Fatal(err)
	}
	if err := gb.Send(); err != nil {
		t.Fatal(err)
	}
	eb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO engine_rollups (window_start, window_seconds, kind, host, engine, name, model,
		samples, up_samples, queue_depth_avg, queue_time_le, queue_time_counts, queue_time_count, prefill_le, prefill_counts, prefill_count)`)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		le := []float64{0.5, 1, 2}
		if err := eb.Append(start.Add(time.Duration(i)*time.Minute), uint32(60), "window", "a", "vllm", "vllm", "m", uint64(60), uint64(60),
			float64(i%4), le, []float64{float64(i), 2, 1, 0}, float64(i+3), le, []float64{3, 0, 0, 0}, float64(3)); err != nil {
			t.Fatal(err)
		}
	}
	if err := eb.Send(); err != nil {
		t.Fatal(err)
	}
	// Business baselines: thumbs and outcomes of two scenes.
	fb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO feedback_rollups (window_start, window_seconds, kind, env, scene, model, name, source, count, positive)`)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, bucket, requests, completed, abandoned)`)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		w := start.Add(time.Duration(i) * time.Minute)
		for _, scene := range []string{"chat", "support"} {
			if err := fb.Append(w, uint32(60), "window", "prod", scene, "m", "thumbs", "user", uint64(5+i), uint64(i%7)); err != nil {
				t.Fatal(err)
			}
			if err := fb.Append(w, uint32(60), "window", "prod", scene, "m", rules.CompletionFeedback, "user", uint64(3+i%4), uint64(i%3)); err != nil {
				t.Fatal(err)
			}
			if err := ob.Append(w, uint32(60), "window", "prod", scene, "m", "0-499", uint64(60), uint64(10+i%9), uint64(i%13)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := fb.Send(); err != nil {
		t.Fatal(err)
	}
	if err := ob.Send(); err != nil {
		t.Fatal(err)
	}
	rs, err := rules.Parse([]byte("defaults:\n  dynamic:\n    satisfaction: {min_requests: 10}\nscenes:\n  chat:\n    dynamic:\n      satisfaction: {min_requests: 20}\n      completion_rate: {min_requests: 15}\n"))
	if err != nil {
		t.Fatal(err)
	}
	// The scenes' minimums, bound as parameters by the driver: spelled out here for chDB.
	business := func(m rules.Metric, q string) string {
		minSQL, args := minCount(rs, m)
		for _, a := range args {
			minSQL = strings.Replace(minSQL, "?", "'"+a.(string)+"'", 1)
		}
		return q + minSQL
	}
	cur := testbed.CurrentClickHouse(t)
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	if err := testbed.CopyTables(ctx, db.Conn(), cfg.DB, cur, "token_rollups", "gpu_rollups", "engine_rollups", "feedback_rollups"); err != nil {
		t.Fatal(err)
	}
	since, until := start.Add(-time.Hour).Unix(), start.Add(time.Hour).Unix()
	// The queries have no ORDER BY, and groupArray keeps any few values: rows are compared in
	// the order of their keys, the sampled values not at all.
	byKey := func(res *testbed.Result, keys int) []string {
		sort.Slice(res.Rows, func(i, j int) bool { return fmt.Sprint(res.Rows[i][:keys]) < fmt.Sprint(res.Rows[j][:keys]) })
		var sampled []string
		for _, c := range res.Columns {
			if strings.HasPrefix(c.Name, "groupArray") {
				sampled = append(sampled, c.Name)
			}
		}
		return sampled
	}
	for _, c := range []struct {
		q    string
		keys int
	}{{fmt.Sprintf(seriesCells, stepExpr(10*time.Minute, time.UTC, time.Now()), since, until), 6}, {fmt.Sprintf(hostCells, stepExpr(10*time.Minute, time.UTC, time.Now()), since, until, since, until), 2},
		{fmt.Sprintf(engineRows, since, until), 5},
		{fmt.Sprintf(satisfactionCells, stepExpr(10*time.Minute, time.UTC, time.Now()), since, until, rules.SatisfactionFeedback, business(rules.Satisfaction, "")), 3},
		{fmt.Sprintf(completionCells, stepExpr(10*time.Minute, time.UTC, time.Now()), since, until, since, until, rules.CompletionFeedback, business(rules.CompletionRate, "")), 3}} {
		q := c.q
		want, err := testbed.Query(ctx, db.Conn(), q)
		if err != nil {
			t.Fatalf("18.16: %v\n%s", err, q)
		}
		if len(want.Rows) == 0 {
			t.Fatalf("no rows on 18.16:\n%s", q)
		}
		got, err := cur.Query(q, nil)
		if err != nil {
			t.Fatalf("ClickHouse %s: %v\n%s", cur.Version, err, q)
		}
		byKey(want, c.keys)
		if err := testbed.Compare(want, got, 0.05, byKey(got, c.keys)...); err != nil {
			t.Errorf("ClickHouse %s answers otherwise than 18.16: %v\n%s", cur.Version, err, q)
		}
	}
}
