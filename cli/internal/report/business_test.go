package report

import (
	"context"
	"io/fs"
	"math"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestConversationsWithoutConversations: over a range without conversations, on 18.16 and on
// the current engine, conversations.sql answers one row of zeros, never NaN.
func TestConversationsWithoutConversations(t *testing.T) {
	db := openDB(t)
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/conversations.sql")
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"from": "2026-03-02 10:00:00", "to": "2026-03-02 11:00:00", "layer": "gateway"}
	bound, err := chdb.Bind(string(raw), params)
	if err != nil {
		t.Fatal(err)
	}
	old, err := testbed.Query(ctx, db.Conn(), bound)
	if err != nil {
		t.Fatalf("18.16: %v", err)
	}
	now, err := cur.Query(string(raw), params)
	if err != nil {
		t.Fatalf("ClickHouse %s: %v", cur.Version, err)
	}
	for _, res := range []struct {
		name string
		r    *testbed.Result
	}{{"18.16", old}, {cur.Version, now}} {
		if len(res.r.Rows) != 1 {
			t.Fatalf("%s: %d rows, want 1", res.name, len(res.r.Rows))
		}
		for i, v := range res.r.Rows[0] {
			f, ok := v.(float64)
			if !ok {
				switch x := v.(type) {
				case uint64:
					f, ok = float64(x), true
				case int64:
					f, ok = float64(x), true
				}
			}
			if !ok || math.IsNaN(f) || f != 0 {
				t.Errorf("%s: %s = %v (%T), want 0", res.name, res.r.Columns[i].Name, v, v)
			}
		}
	}
	if err := testbed.Compare(old, now, 1e-9); err != nil {
		t.Errorf("ClickHouse %s answers otherwise than 18.16: %v", cur.Version, err)
	}
}

// TestVerdictEdges runs the verdict queries, on 18.16 (whole seconds) and on the current
// engine, over a thumbs down changed to up within the same second (the later, by event_id,
// counts), a verdict given 8 days after the range (past the 7 days read: not counted) and,
// for feedback_coverage.sql, a verdict on a request 8 days older than the range (past the
// 7 days it reads requests back: unknown).
func TestVerdictEdges(t *testing.T) {
	db := openDB(t)
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	// within the requests' TTL (30 days) of the current engine, which drops older rows
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	to := from.Add(time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, ttft_ms, status)"
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	type row struct {
		insert string
		vals   []any
	}
	rows := []row{
		{reqs, []any{from.Add(10 * time.Minute), "r1", "prod", "chat", "m", "gateway", 100.0, "ok"}},
		{reqs, []any{from.Add(10 * time.Minute), "r2", "prod", "chat", "m", "gateway", 100.0, "ok"}},
		{reqs, []any{from.Add(-8 * 24 * time.Hour), "r-old", "prod", "chat", "m", "gateway", 100.0, "ok"}},
		// r1: down at .100, changed to up at .700 of the same second
		{fbs, []any{from.Add(20*time.Minute + 100*time.Millisecond), "0195a000-0000-7000-8000-000000000001", "r1", "", "thumbs", 0.0, "user", "prod", "chat", "m"}},
		{fbs, []any{from.Add(20*time.Minute + 700*time.Millisecond), "0195a000-0000-7000-8000-000000000002", "r1", "", "thumbs", 1.0, "user", "prod", "chat", "m"}},
		// r2: up in the range, down 8 days after it (not read)
		{fbs, []any{from.Add(20 * time.Minute), "0195a000-0000-7000-8000-000000000003", "r2", "", "thumbs", 1.0, "user", "prod", "chat", "m"}},
		{fbs, []any{to.Add(8 * 24 * time.Hour), "0195a000-0000-7000-8000-000000000004", "r2", "", "thumbs", 0.0, "user", "prod", "chat", "m"}},
		// on a request 8 days before the range
		{fbs, []any{from.Add(30 * time.Minute), "0195a000-0000-7000-8000-000000000005", "r-old", "", "thumbs", 1.0, "user", "prod", "chat", "m"}},
	}
	for _, r := range rows {
		b, err := db.Conn().PrepareBatch(ctx, r.insert)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Append(r.vals...); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
		if err := cur.Insert(ctx, r.insert, r.vals...); err != nil {
			t.Fatal(err)
		}
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": to.Format(time.DateTime), "layer": "gateway", "name": "thumbs", "satisfied_at": "1"}
	for _, c := range []struct {
		file string
		want []float64 // the first row's numeric columns, from the second
	}{
		// r1 up (its latest), r2 up: 2 verdicts, all satisfied
		{"satisfaction_by_ttft_band.sql", []float64{2, 1, 1}},
		{"satisfaction_by_stall.sql", []float64{2, 1, 1}},
		{"quality_by_scene_model.sql", []float64{2, 1, 0, 0, 0, 0}},
		// given in the range: r1's two (one superseded), r2's first, r-old's (unknown)
		{"feedback_coverage.sql", []float64{3, 0, 1, 0, 0, 1}},
	} {
		raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+c.file)
		if err != nil {
			t.Fatal(err)
		}
		bound, err := chdb.Bind(string(raw), params)
		if err != nil {
			t.Fatal(err)
		}
		old, err := testbed.Query(ctx, db.Conn(), bound)
		if err != nil {
			t.Fatalf("%s on 18.16: %v", c.file, err)
		}
		// bound here, as report does: chDB binds server-side parameters outside cur.DB
		now, err := cur.Query(bound, nil)
		if err != nil {
			t.Fatalf("%s on ClickHouse %s: %v", c.file, cur.Version, err)
		}
		for _, res := range []struct {
			name string
			r    *testbed.Result
		}{{"18.16", old}, {cur.Version, now}} {
			if len(res.r.Rows) == 0 {
				t.Fatalf("%s on %s: no rows", c.file, res.name)
			}
			first := 1
			if c.file == "feedback_coverage.sql" {
				first = 0
			} else if c.file == "quality_by_scene_model.sql" {
				first = 2
			}
			got := res.r.Rows[0][first:]
			for i, w := range c.want {
				if f := toFloat(got[i]); f != w {
					t.Errorf("%s on %s: %s = %v, want %v (row %v)", c.file, res.name, res.r.Columns[first+i].Name, got[i], w, res.r.Rows[0])
				}
			}
		}
	}
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case uint64:
		return float64(x)
	case int64:
		return float64(x)
	}
	return math.NaN()
}

// TestConversationIDAcrossEnvs: the same conversation id in two envs (staging numbering its
// conversations as prod does) is two conversations, on 18.16 and on the current engine: each
// with its own turns and outcome, not merged.
func TestConversationIDAcrossEnvs(t *testing.T) {
	db := openDB(t)
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, outcome, cost_usd)"
	for _, r := range [][]any{
		{from.Add(time.Minute), "a1", "prod", "chat", "m", "gateway", "1", uint32(1), "", 0.1},
		{from.Add(2 * time.Minute), "a2", "prod", "chat", "m", "gateway", "1", uint32(2), "completed", 0.1},
		{from.Add(4 * time.Minute), "c1", "staging", "chat", "m", "gateway", "1", uint32(1), "abandoned", 0.1},
	} {
		b, err := db.Conn().PrepareBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Append(r...); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
		if err := cur.Insert(ctx, reqs, r...); err != nil {
			t.Fatal(err)
		}
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": from.Add(time.Hour).Format(time.DateTime), "layer": "gateway",
		"limit": "10", "name": "thumbs", "satisfied_at": "1"}
	for _, c := range []struct {
		file string
		want [][]float64 // each row's numeric columns
	}{
		// 2 conversations of 2 and 1 turns; 1 completed, 1 abandoned
		{"conversations.sql", [][]float64{{2, 1.5, 1, 1, 0.5}}},
		// requests, turns, cost, tokens
		{"cost_per_conversation.sql", [][]float64{{2, 2, 0.2, 0, 0}, {1, 1, 0.1, 0, 0}}},
		// chat: 2 conversations at 0.15
		{"cost_per_satisfied_conversation.sql", [][]float64{{2, 0.15, 0, 0, 0}}},
	} {
		raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+c.file)
		if err != nil {
			t.Fatal(err)
		}
		bound, err := chdb.Bind(string(raw), params)
		if err != nil {
			t.Fatal(err)
		}
		old, err := testbed.Query(ctx, db.Conn(), bound)
		if err != nil {
			t.Fatalf("%s on 18.16: %v", c.file, err)
		}
		now, err := cur.Query(bound, nil) // bound here, as report does
		if err != nil {
			t.Fatalf("%s on ClickHouse %s: %v", c.file, cur.Version, err)
		}
		for _, res := range []struct {
			name string
			r    *testbed.Result
		}{{"18.16", old}, {cur.Version, now}} {
			if len(res.r.Rows) != len(c.want) {
				t.Fatalf("%s on %s: %d rows, want %d: %v", c.file, res.name, len(res.r.Rows), len(c.want), res.r.Rows)
			}
			for i, w := range c.want {
				var got []float64
				for _, v := range res.r.Rows[i] {
					if _, ok := v.(string); !ok {
						got = append(got, toFloat(v))
					}
				}
				for j := range w {
					if j >= len(got) || math.Abs(got[j]-w[j]) > 1e-9 {
						t.Errorf("%s on %s: row %d %v, want %v", c.file, res.name, i, res.r.Rows[i], w)
						break
					}
				}
			}
		}
	}
}

// TestConversationRatingInOneRange: a rating given to a conversation counts in
// quality_by_scene_model.sql in the range of the conversation's first request only, for the
// model of its last request, on 18.16 and on the current engine: one that started before
// the range is left to that range (a daily report never counts it twice), one that goes on
// after it counts, for the model it ended on.
func TestConversationRatingInOneRange(t *testing.T) {
	db := openDB(t)
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	to := from.Add(time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn)"
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	for _, r := range []struct {
		insert string
		vals   []any
	}{
		{reqs, []any{from.Add(-30 * time.Minute), "s1", "prod", "chat", "m1", "gateway", "c-span", uint32(1)}},
		{reqs, []any{from.Add(10 * time.Minute), "s2", "prod", "chat", "m1", "gateway", "c-span", uint32(2)}},
		{reqs, []any{from.Add(10 * time.Minute), "i1", "prod", "chat", "m1", "gateway", "c-in", uint32(1)}},
		{reqs, []any{to.Add(30 * time.Minute), "i2", "prod", "chat", "m2", "gateway", "c-in", uint32(2)}},
		{fbs, []any{from.Add(20 * time.Minute), "f1", "", "c-span", "rating", 5.0, "user", "prod", "chat", ""}},
		{fbs, []any{to.Add(40 * time.Minute), "f2", "", "c-in", "rating", 3.0, "user", "prod", "chat", ""}},
	} {
		b, err := db.Conn().PrepareBatch(ctx, r.insert)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Append(r.vals...); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
		if err := cur.Insert(ctx, r.insert, r.vals...); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/quality_by_scene_model.sql")
	if err != nil {
		t.Fatal(err)
	}
	bound, err := chdb.Bind(string(raw), map[string]string{"from": from.Format(time.DateTime), "to": to.Format(time.DateTime), "layer": "gateway"})
	if err != nil {
		t.Fatal(err)
	}
	old, err := testbed.Query(ctx, db.Conn(), bound)
	if err != nil {
		t.Fatalf("18.16: %v", err)
	}
	now, err := cur.Query(bound, nil) // bound here, as report does
	if err != nil {
		t.Fatalf("ClickHouse %s: %v", cur.Version, err)
	}
	for _, res := range []struct {
		name string
		r    *testbed.Result
	}{{"18.16", old}, {cur.Version, now}} {
		// c-in's rating of 3, for m2
		if len(res.r.Rows) != 1 || res.r.Rows[0][1] != "m2" || toFloat(res.r.Rows[0][4]) != 1 || toFloat(res.r.Rows[0][5]) != 3 {
			t.Errorf("%s: %v, want one row: chat, m2, 1 rating of 3", res.name, res.r.Rows)
		}
	}
}
