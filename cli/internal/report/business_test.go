package report

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestConversationsWithoutConversations: over a range without conversations, on 18.16 and on
// the current engine, conversations.sql answers one row of zeros, never NaN, and no completion
// rate (NULL): no outcome is known, which a rate of 0 would read as every task failed.
func TestConversationsWithoutConversations(t *testing.T) {
	b := openBusiness(t)
	params := map[string]string{"from": "2026-03-02 10:00:00", "to": "2026-03-02 11:00:00", "layer": "gateway"}
	answers := b.query(t, "conversations.sql", params)
	// and bound by the current server itself, as clickhouse-client --param_… does
	now, err := b.cur.Query(cookbookQuery(t, "conversations.sql"), params)
	if err != nil {
		t.Fatalf("ClickHouse %s: %v", b.cur.Version, err)
	}
	for _, res := range append(answers, answer{b.cur.Version + " (bound by the server)", now}) {
		if len(res.r.Rows) != 1 {
			t.Fatalf("%s: %d rows, want 1", res.server, len(res.r.Rows))
		}
		for i, v := range res.r.Rows[0] {
			if res.r.Columns[i].Name == "completion_rate" {
				if v != nil {
					t.Errorf("%s: completion_rate = %v (%T), want NULL", res.server, v, v)
				}
				continue
			}
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
				t.Errorf("%s: %s = %v (%T), want 0", res.server, res.r.Columns[i].Name, v, v)
			}
		}
	}
	if err := testbed.Compare(answers[0].r, now, 1e-9); err != nil {
		t.Errorf("ClickHouse %s answers otherwise than 18.16: %v", b.cur.Version, err)
	}
}

// TestVerdictEdges runs the verdict queries, on 18.16 (whole seconds) and on the current
// engine, over a thumbs down changed to up within the same second (the later, by event_id,
// counts), a verdict given 8 days after the range (past the 7 days read: not counted) and,
// for feedback_coverage.sql, a verdict on a request 8 days older than the range (past the
// 7 days it reads requests back: unknown).
func TestVerdictEdges(t *testing.T) {
	b := openBusiness(t)
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
		b.insert(t, r.insert, r.vals...)
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
		{"feedback_coverage.sql", []float64{3, 0, 1, 0, 0, 1, 0, 0}},
	} {
		for _, res := range b.query(t, c.file, params) {
			if len(res.r.Rows) == 0 {
				t.Fatalf("%s on %s: no rows", c.file, res.server)
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
					t.Errorf("%s on %s: %s = %v, want %v (row %v)", c.file, res.server, res.r.Columns[first+i].Name, got[i], w, res.r.Rows[0])
				}
			}
		}
	}
}

// business is the two servers the business tests run the cookbook on over the same rows:
// 18.16 and the current engine, both migrated.
type business struct {
	db  *chdb.DB
	cur *testbed.Current
}

// answer is one server's answer to a query.
type answer struct {
	server string
	r      *testbed.Result
}

func openBusiness(t *testing.T) business {
	t.Helper()
	b := business{db: openDB(t), cur: testbed.CurrentClickHouse(t)}
	if _, err := chdb.MigrateOn(context.Background(), b.cur, b.cur.DB, b.cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	return b
}

// insert writes one row into both servers.
func (b business) insert(t *testing.T, insert string, vals ...any) {
	t.Helper()
	ctx := context.Background()
	batch, err := b.db.Conn().PrepareBatch(ctx, insert)
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Append(vals...); err != nil {
		t.Fatal(err)
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	if err := b.cur.Insert(ctx, insert, vals...); err != nil {
		t.Fatal(err)
	}
}

// query runs the cookbook query file with params on both servers, 18.16's answer first.
// The parameters are bound here, as report does: chDB binds server-side parameters outside
// cur.DB.
func (b business) query(t *testing.T, file string, params map[string]string) []answer {
	t.Helper()
	bound, err := chdb.Bind(cookbookQuery(t, file), params)
	if err != nil {
		t.Fatal(err)
	}
	old, err := testbed.Query(context.Background(), b.db.Conn(), bound)
	if err != nil {
		t.Fatalf("%s on 18.16: %v", file, err)
	}
	now, err := b.cur.Query(bound, nil)
	if err != nil {
		t.Fatalf("%s on ClickHouse %s: %v", file, b.cur.Version, err)
	}
	return []answer{{"18.16", old}, {b.cur.Version, now}}
}

func cookbookQuery(t *testing.T, file string) string {
	t.Helper()
	raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+file)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
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

// numbers is a row's numeric columns as floats, its strings left out.
func numbers(row []any) []float64 {
	var got []float64
	for _, v := range row {
		if _, ok := v.(string); !ok {
			got = append(got, toFloat(v))
		}
	}
	return got
}

// rowMatches: row has want's columns, its strings equal to want's, its numbers within 1e-9 of
// want's float64s and NULL where want has nil.
func rowMatches(row, want []any) bool {
	if len(row) != len(want) {
		return false
	}
	for j, w := range want {
		switch x := w.(type) {
		case string:
			if row[j] != x {
				return false
			}
		case float64:
			if !(math.Abs(toFloat(row[j])-x) <= 1e-9) {
				return false
			}
		case nil:
			if row[j] != nil {
				return false
			}
		}
	}
	return true
}

// oneRow is a query file, its parameters and the numbers of the one row it answers.
type oneRow struct {
	file   string
	params map[string]string
	want   []float64 // the first row's numbers
}

// coverageParams are params with to moved a week later, as the tests run
// feedback_coverage.sql.
func coverageParams(params map[string]string, to time.Time) map[string]string {
	coverage := maps.Clone(params)
	coverage["to"] = to.Add(7 * 24 * time.Hour).Format(time.DateTime)
	return coverage
}

// expectOneRow runs file with params on both servers and requires one row whose numeric
// columns are want.
func (b business) expectOneRow(t *testing.T, file string, params map[string]string, want []float64) {
	t.Helper()
	for _, res := range b.query(t, file, params) {
		if len(res.r.Rows) != 1 {
			t.Errorf("%s on %s: %v, want one row", file, res.server, res.r.Rows)
			continue
		}
		if got := numbers(res.r.Rows[0]); !slices.Equal(got, want) {
			t.Errorf("%s on %s: %v, want %v", file, res.server, res.r.Rows[0], want)
		}
	}
}

// expectConversations runs conversations.sql with params on both servers and requires one
// row whose first columns are want, each within 1e-9.
func (b business) expectConversations(t *testing.T, params map[string]string, want []float64) {
	t.Helper()
	for _, res := range b.query(t, "conversations.sql", params) {
		if len(res.r.Rows) != 1 {
			t.Fatalf("conversations.sql on %s: %v, want %v", res.server, res.r.Rows, want)
		}
		for i, w := range want {
			if got := toFloat(res.r.Rows[0][i]); math.Abs(got-w) > 1e-9 {
				t.Errorf("conversations.sql on %s: %s = %v, want %v", res.server, res.r.Columns[i].Name, got, w)
			}
		}
	}
}

// TestConversationIDAcrossEnvs: the same conversation id in two envs (staging numbering its
// conversations as prod does) is two conversations, on 18.16 and on the current engine: each
// with its own turns and outcome, not merged.
func TestConversationIDAcrossEnvs(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, outcome, cost_usd)"
	for _, r := range [][]any{
		{from.Add(time.Minute), "a1", "prod", "chat", "m", "gateway", "1", uint32(1), "", 0.1},
		{from.Add(2 * time.Minute), "a2", "prod", "chat", "m", "gateway", "1", uint32(2), "completed", 0.1},
		{from.Add(4 * time.Minute), "c1", "staging", "chat", "m", "gateway", "1", uint32(1), "abandoned", 0.1},
	} {
		b.insert(t, reqs, r...)
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
		for _, res := range b.query(t, c.file, params) {
			if len(res.r.Rows) != len(c.want) {
				t.Fatalf("%s on %s: %d rows, want %d: %v", c.file, res.server, len(res.r.Rows), len(c.want), res.r.Rows)
			}
			for i, w := range c.want {
				got := numbers(res.r.Rows[i])
				for j := range w {
					if j >= len(got) || math.Abs(got[j]-w[j]) > 1e-9 {
						t.Errorf("%s on %s: row %d %v, want %v", c.file, res.server, i, res.r.Rows[i], w)
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
	b := openBusiness(t)
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
		b.insert(t, r.insert, r.vals...)
	}
	for _, res := range b.query(t, "quality_by_scene_model.sql", map[string]string{"from": from.Format(time.DateTime), "to": to.Format(time.DateTime), "layer": "gateway"}) {
		// c-in's rating of 3, for m2
		if len(res.r.Rows) != 1 || res.r.Rows[0][1] != "m2" || toFloat(res.r.Rows[0][4]) != 1 || toFloat(res.r.Rows[0][5]) != 3 {
			t.Errorf("%s: %v, want one row: chat, m2, 1 rating of 3", res.server, res.r.Rows)
		}
	}
}

// TestConversationVerdictsAcrossEnvs: one conversation id in two envs, each with its own
// verdicts, is two conversations in every business query, on 18.16 and on the current
// engine: each conversation gets its env's verdicts only, a verdict on a request rates its
// request's conversation, a verdict without env rates the conversation of its id in the one
// env that has it (and none where two envs have it), and a turn in one env is no retry of
// the same turn in the other.
func TestConversationVerdictsAcrossEnvs(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	to := from.Add(time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, status, cost_usd)"
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	for _, r := range [][]any{
		{from.Add(30 * time.Second), "s1", "staging", "chat", "m-staging", "gateway", "1", uint32(1), "timeout", 0.3},
		{from.Add(time.Minute), "p1", "prod", "chat", "m-prod", "gateway", "1", uint32(1), "ok", 0.1},
		{from.Add(3 * time.Minute), "e1", "prod", "chat", "m-prod", "gateway", "solo", uint32(1), "ok", 0.05},
	} {
		b.insert(t, reqs, r...)
	}
	id := func(n int) string { return fmt.Sprintf("0195a000-0000-7000-8000-%012d", n) }
	for _, f := range [][]any{
		{from.Add(10 * time.Minute), id(1), "", "1", "thumbs", 1.0, "user", "prod", "chat", ""},
		{from.Add(11 * time.Minute), id(2), "", "1", "thumbs", 0.0, "user", "staging", "chat", ""},
		{from.Add(10 * time.Minute), id(3), "", "1", "rating", 5.0, "user", "prod", "chat", ""},
		{from.Add(11 * time.Minute), id(4), "", "1", "rating", 1.0, "user", "staging", "chat", ""},
		// without env: "1" is in two envs (neither counts it), solo in prod only
		{from.Add(12 * time.Minute), id(5), "", "1", "rating", 3.0, "user", "", "", ""},
		{from.Add(13 * time.Minute), id(6), "", "1", "thumbs", 0.0, "user", "", "", ""},
		{from.Add(12 * time.Minute), id(7), "", "solo", "rating", 4.0, "user", "", "", ""},
		// on a request: its conversation, prod's solo
		{from.Add(12 * time.Minute), id(8), "e1", "", "thumbs", 1.0, "user", "", "", ""},
		// on conversations no request carries: "gone" in no env, "solo" in staging
		{from.Add(14 * time.Minute), id(9), "", "gone", "thumbs", 1.0, "user", "", "", ""},
		{from.Add(14 * time.Minute), id(10), "", "solo", "thumbs", 0.0, "user", "staging", "chat", ""},
	} {
		b.insert(t, fbs, f...)
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": to.Format(time.DateTime), "layer": "gateway",
		"limit": "10", "name": "thumbs", "satisfied_at": "0.5"}
	with := func(k, v string) map[string]string {
		p := maps.Clone(params)
		p[k] = v
		return p
	}
	for _, c := range []struct {
		file   string
		params map[string]string
		want   [][]any
	}{
		// m-prod: e1's thumbs up and prod's "1" up, prod's rating 5 and solo's 4; m-staging:
		// staging's thumbs down and rating 1
		{"quality_by_scene_model.sql", params, [][]any{
			{"chat", "m-prod", 2.0, 1.0, 2.0, 4.5, 0.0, 0.0},
			{"chat", "m-staging", 1.0, 0.0, 1.0, 1.0, 0.0, 0.0}}},
		// 3 conversations, rated by prod "1" (up), staging "1" (down), solo (e1's up)
		{"cost_per_satisfied_conversation.sql", params, [][]any{{"chat", 3.0, 0.15, 3.0, 2.0, 0.225}}},
		{"cost_per_conversation.sql", params, [][]any{
			{"staging", "1", 1.0, 1.0, 0.3, 0.0, 0.0},
			{"prod", "1", 1.0, 1.0, 0.1, 0.0, 0.0},
			{"prod", "solo", 1.0, 1.0, 0.05, 0.0, 0.0}}},
		// no outcome known: no completion rate
		{"conversations.sql", params, [][]any{{3.0, 1.0, 0.0, 0.0, nil}}},
		// staging's turn 1 timed out, prod's did not: no retry
		{"retries.sql", params, [][]any{{"chat", 3.0, 0.0, 0.0, 0.0}}},
		// 10 verdicts, none superseded: prod's and staging's are of two conversations, and
		// those without env apart; "1"'s two without env are of an id in two envs, which no
		// query counts, and "gone"'s and staging's "solo" of no request's conversation
		{"feedback_coverage.sql", with("to", to.Add(7*24*time.Hour).Format(time.DateTime)), [][]any{{10.0, 0.0, 0.0, 9.0, 0.0, 0.0, 2.0, 2.0}}},
	} {
		for _, res := range b.query(t, c.file, c.params) {
			if len(res.r.Rows) != len(c.want) {
				t.Errorf("%s on %s: %v, want %v", c.file, res.server, res.r.Rows, c.want)
				continue
			}
			for i, w := range c.want {
				if !rowMatches(res.r.Rows[i], w) {
					t.Errorf("%s on %s: row %d %v, want %v", c.file, res.server, i, res.r.Rows[i], w)
				}
			}
		}
	}
}

// TestSameSecondTies: two requests of one turn within the same second, which 18.16 stores
// as one (whole seconds), are told apart by event_id (UUIDv7 ids sort by time), on 18.16 and
// on the current engine: a turn whose first request timed out is a retry, and a
// conversation's later outcome is its outcome.
func TestSameSecondTies(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, status, outcome)"
	at := from.Add(time.Minute)
	id := func(n int) string { return fmt.Sprintf("0195a000-0000-7000-8000-%012d", n) }
	// each pair is written in one order or the other, so that a server taking the first (or
	// the last) row of a tie it reads takes the wrong one in half of them: turn 1 of each r-
	// conversation timed out, then was answered; each o- conversation was abandoned, then
	// completed
	for i := range 10 {
		at := at.Add(time.Duration(i) * time.Second)
		pair := [][]any{
			{at.Add(100 * time.Millisecond), id(4*i + 1), "prod", "chat", "m", "gateway", fmt.Sprint("r-", i), uint32(1), "timeout", ""},
			{at.Add(700 * time.Millisecond), id(4*i + 2), "prod", "chat", "m", "gateway", fmt.Sprint("r-", i), uint32(1), "ok", ""},
			{at.Add(100 * time.Millisecond), id(4*i + 3), "prod", "chat", "m", "gateway", fmt.Sprint("o-", i), uint32(1), "ok", "abandoned"},
			{at.Add(700 * time.Millisecond), id(4*i + 4), "prod", "chat", "m", "gateway", fmt.Sprint("o-", i), uint32(1), "ok", "completed"},
		}
		if i%2 == 1 {
			pair[0], pair[1], pair[2], pair[3] = pair[1], pair[0], pair[3], pair[2]
		}
		for _, r := range pair {
			b.insert(t, reqs, r...)
		}
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": from.Add(time.Hour).Format(time.DateTime), "layer": "gateway"}
	for _, c := range []struct {
		file string
		want []float64
	}{
		{"retries.sql", []float64{20, 10, 10, 0.5}},
		{"conversations.sql", []float64{20, 1, 10, 0, 1}},
	} {
		for _, res := range b.query(t, c.file, params) {
			if got := numbers(res.r.Rows[0]); !slices.Equal(got, c.want) {
				t.Errorf("%s on %s: %v, want %v", c.file, res.server, res.r.Rows, c.want)
			}
		}
	}
}

// TestRequestVerdictChangedWithConversation: a thumbs down on a request, changed to up by a
// verdict that names the request and its conversation, is one verdict, up, in every query
// that counts verdicts on requests, on 18.16 and on the current engine: the latest of a
// source on a request counts, whether or not it names the conversation too.
func TestRequestVerdictChangedWithConversation(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	to := from.Add(time.Hour)
	b.insert(t, "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, ttft_ms, status, cost_usd)",
		from.Add(time.Minute), "r1", "prod", "chat", "m", "gateway", "c", uint32(1), 100.0, "ok", 0.1)
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	b.insert(t, fbs, from.Add(10*time.Minute), "0195a000-0000-7000-8000-000000000001", "r1", "", "thumbs", 0.0, "user", "prod", "chat", "m")
	b.insert(t, fbs, from.Add(20*time.Minute), "0195a000-0000-7000-8000-000000000002", "r1", "c", "thumbs", 1.0, "user", "prod", "chat", "m")
	params := map[string]string{"from": from.Format(time.DateTime), "to": to.Format(time.DateTime), "layer": "gateway",
		"name": "thumbs", "satisfied_at": "1"}
	coverage := coverageParams(params, to)
	for _, c := range []oneRow{
		{"satisfaction_by_ttft_band.sql", params, []float64{1, 1, 1}},
		{"satisfaction_by_stall.sql", params, []float64{1, 1, 1}},
		{"quality_by_scene_model.sql", params, []float64{1, 1, 0, 0, 0, 0}},
		{"quality_by_bucket.sql", params, []float64{1, 1, 1, 1}},
		{"cost_per_satisfied_conversation.sql", params, []float64{1, 0.1, 1, 1, 0.1}},
		// one verdict, one superseded
		{"feedback_coverage.sql", coverage, []float64{1, 0, 0, 0, 0, 1, 0, 0}},
	} {
		b.expectOneRow(t, c.file, c.params, c.want)
	}
}

// TestConversationAcrossScenes: a conversation whose turns call two scenes counts for the
// scene of its first request in quality_by_scene_model.sql and
// cost_per_satisfied_conversation.sql, on 18.16 and on the current engine, whichever
// order its requests were written in.
func TestConversationAcrossScenes(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, cost_usd)"
	for i := range 10 {
		conv := fmt.Sprint("c-", i)
		first := []any{from.Add(time.Minute), conv + "-1", "prod", "chat", "m", "gateway", conv, uint32(1), 0.1}
		second := []any{from.Add(2 * time.Minute), conv + "-2", "prod", "search", "m", "gateway", conv, uint32(2), 0.1}
		if i%2 == 1 {
			first, second = second, first
		}
		b.insert(t, reqs, first...)
		b.insert(t, reqs, second...)
		b.insert(t, "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)",
			from.Add(10*time.Minute), fmt.Sprintf("0195a000-0000-7000-8000-%012d", i), "", conv, "rating", 5.0, "user", "prod", "", "")
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": from.Add(time.Hour).Format(time.DateTime), "layer": "gateway",
		"name": "rating", "satisfied_at": "4"}
	for _, c := range []struct {
		file string
		want []any
	}{
		{"quality_by_scene_model.sql", []any{"chat", "m", 0.0, 0.0, 10.0, 5.0, 0.0, 0.0}},
		{"cost_per_satisfied_conversation.sql", []any{"chat", 10.0, 0.2, 10.0, 10.0, 0.2}},
	} {
		for _, res := range b.query(t, c.file, params) {
			if len(res.r.Rows) != 1 || !rowMatches(res.r.Rows[0], c.want) {
				t.Errorf("%s on %s: %v, want one row %v", c.file, res.server, res.r.Rows, c.want)
			}
		}
	}
}

// TestConversationSceneIsItsFirstRequest: a conversation of 3 requests over two scenes
// (turn 1 in chat timed out and asked again in search within the same second, turn 2 in
// search), each request rated down then up and the conversation rated down, counts once,
// for the scene of its first request by (ts, event_id), in every query that gives a
// conversation a scene, on 18.16 (whole seconds: the tie is broken by event_id) and on the
// current engine, whichever order its rows were written in; its 3 requests × 2 verdicts
// multiply nothing.
func TestConversationSceneIsItsFirstRequest(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, status, cost_usd)"
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	id := func(n int) string { return fmt.Sprintf("0195a000-0000-7000-8000-%012d", n) }
	for i := range 6 {
		conv := fmt.Sprint("c-", i)
		rs := [][]any{
			{from.Add(time.Minute + 100*time.Millisecond), id(10*i + 1), "prod", "chat", "m", "gateway", conv, uint32(1), "timeout", 0.1},
			{from.Add(time.Minute + 700*time.Millisecond), id(10*i + 2), "prod", "search", "m", "gateway", conv, uint32(1), "ok", 0.1},
			{from.Add(5 * time.Minute), id(10*i + 3), "prod", "search", "m", "gateway", conv, uint32(2), "ok", 0.1},
		}
		if i%2 == 1 {
			slices.Reverse(rs)
		}
		for _, r := range rs {
			b.insert(t, reqs, r...)
		}
		for j := 1; j <= 3; j++ {
			b.insert(t, fbs, from.Add(10*time.Minute), id(1000+10*i+j), id(10*i+j), "", "thumbs", 0.0, "user", "prod", "", "")
			b.insert(t, fbs, from.Add(20*time.Minute), id(2000+10*i+j), id(10*i+j), "", "thumbs", 1.0, "user", "prod", "", "")
		}
		b.insert(t, fbs, from.Add(30*time.Minute), id(3000+i), "", conv, "thumbs", 0.0, "user", "prod", "", "")
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": from.Add(time.Hour).Format(time.DateTime), "layer": "gateway",
		"limit": "10", "name": "thumbs", "satisfied_at": "0.5"}
	for _, c := range []struct {
		file string
		want [][]any
	}{
		// chat: the first requests' ups and the conversations' downs; search: the others' ups
		{"quality_by_scene_model.sql", [][]any{
			{"chat", "m", 12.0, 0.5, 0.0, 0.0, 0.0, 0.0},
			{"search", "m", 12.0, 1.0, 0.0, 0.0, 0.0, 0.0}}},
		// each conversation: 3 ups and a down, 0.75 >= 0.5
		{"cost_per_satisfied_conversation.sql", [][]any{{"chat", 6.0, 0.3, 6.0, 6.0, 0.3}}},
		// turn 1 of each timed out in chat, then asked again in search
		{"retries.sql", [][]any{{"chat", 6.0, 6.0, 6.0, 1.0}}},
		{"conversations.sql", [][]any{{6.0, 2.0, 0.0, 0.0, nil}}},
	} {
		for _, res := range b.query(t, c.file, params) {
			ok := len(res.r.Rows) == len(c.want)
			for i := 0; ok && i < len(c.want); i++ {
				ok = rowMatches(res.r.Rows[i], c.want[i])
			}
			if !ok {
				t.Errorf("%s on %s: %v, want %v", c.file, res.server, res.r.Rows, c.want)
			}
		}
	}
}

// TestConversationVerdictWithoutEnvChanged: a rating on a conversation sent without env (3),
// then changed with its env (4), is one verdict, 4, on 18.16 and on the current engine: the
// one without env rates the conversation of its id in the one env that has it, so the later
// one supersedes it in feedback_coverage.sql as in the queries that count verdicts.
func TestConversationVerdictWithoutEnvChanged(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	to := from.Add(time.Hour)
	b.insert(t, "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, cost_usd)",
		from.Add(time.Minute), "p1", "prod", "chat", "m", "gateway", "solo", uint32(1), 0.1)
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	b.insert(t, fbs, from.Add(10*time.Minute), "0195a000-0000-7000-8000-000000000001", "", "solo", "rating", 3.0, "user", "", "", "")
	b.insert(t, fbs, from.Add(20*time.Minute), "0195a000-0000-7000-8000-000000000002", "", "solo", "rating", 4.0, "user", "prod", "", "")
	params := map[string]string{"from": from.Format(time.DateTime), "to": to.Format(time.DateTime), "layer": "gateway",
		"name": "rating", "satisfied_at": "4"}
	coverage := coverageParams(params, to)
	for _, c := range []oneRow{
		{"quality_by_scene_model.sql", params, []float64{0, 0, 1, 4, 0, 0}},
		{"cost_per_satisfied_conversation.sql", params, []float64{1, 0.1, 1, 1, 0.1}},
		// one verdict on a conversation, one superseded
		{"feedback_coverage.sql", coverage, []float64{1, 0, 0, 1, 0, 1, 0, 0}},
	} {
		b.expectOneRow(t, c.file, c.params, c.want)
	}
}

// TestCompletionFromVerdicts: an app behind the gateway proxy cannot put an outcome on its
// requests and reports completion as a task_completed verdict; conversations.sql counts a
// conversation without an outcome by its latest task_completed verdict, on 18.16 (whole
// seconds: a tie broken by event_id) and on the current engine, and an outcome on a request
// wins over a verdict. Conversations with neither count in no rate.
func TestCompletionFromVerdicts(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, status, outcome)"
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	for _, r := range [][]any{
		{from.Add(time.Minute), "a1", "prod", "chat", "m", "gateway", "a", uint32(1), "ok", ""},
		{from.Add(2 * time.Minute), "a2", "prod", "chat", "m", "gateway", "a", uint32(2), "ok", ""},
		{from.Add(time.Minute), "b1", "prod", "chat", "m", "gateway", "b", uint32(1), "ok", ""},
		{from.Add(time.Minute), "c1", "prod", "chat", "m", "gateway", "c", uint32(1), "ok", "completed"},
		{from.Add(time.Minute), "d1", "prod", "chat", "m", "gateway", "d", uint32(1), "ok", ""},
		{from.Add(time.Minute), "e1", "prod", "chat", "m", "gateway", "e", uint32(1), "ok", ""},
	} {
		b.insert(t, reqs, r...)
	}
	id := func(n int) string { return fmt.Sprintf("0195a000-0000-7000-8000-%012d", n) }
	at := from.Add(10 * time.Minute)
	for _, f := range [][]any{
		// a: abandoned at .100, changed to completed at .700 of the same second, written last first
		{at.Add(700 * time.Millisecond), id(2), "", "a", "task_completed", 1.0, "app", "prod", "chat", ""},
		{at.Add(100 * time.Millisecond), id(1), "", "a", "task_completed", 0.0, "app", "prod", "chat", ""},
		// b: on its request, abandoned
		{at, id(3), "b1", "", "task_completed", 0.0, "app", "", "", ""},
		// c: its request's outcome wins
		{at, id(4), "", "c", "task_completed", 0.0, "app", "prod", "chat", ""},
		// d: another name says nothing about completion
		{at, id(5), "", "d", "thumbs", 1.0, "user", "prod", "chat", ""},
		// e: without env, of the one env that has e
		{at, id(6), "", "e", "task_completed", 1.0, "app", "", "", ""},
	} {
		b.insert(t, fbs, f...)
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": from.Add(time.Hour).Format(time.DateTime), "layer": "gateway"}
	// 5 conversations of 6 turns; a, c, e completed, b abandoned, d unknown
	want := []float64{5, 1.2, 3, 1, 0.75}
	b.expectConversations(t, params, want)
}

// TestCompletionVerdictValues: a task_completed verdict's value decides by its sign, as the
// feedback rollups' positive does for the alerter: 1 (true) and 0.5 are completed, 0 (false)
// and -1 abandoned, on 18.16 and on the current engine. A verdict without scene still counts
// for its conversation here (the alerter's series leave it out).
func TestCompletionVerdictValues(t *testing.T) {
	b := openBusiness(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	const reqs = "INSERT INTO requests (ts, event_id, env, scene, model, layer, conversation_id, turn, status, outcome)"
	const fbs = "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source, env, scene, model)"
	at := from.Add(10 * time.Minute)
	for i, v := range []float64{1, 0.5, 0, -1} {
		conv := fmt.Sprintf("v%d", i)
		b.insert(t, reqs, from.Add(time.Minute), conv+"r", "prod", "chat", "m", "gateway", conv, uint32(1), "ok", "")
		b.insert(t, fbs, at, fmt.Sprintf("0195a000-0000-7000-8000-%012d", i), "", conv, "task_completed", v, "user", "prod", "", "")
	}
	params := map[string]string{"from": from.Format(time.DateTime), "to": from.Add(time.Hour).Format(time.DateTime), "layer": "gateway"}
	// conversations, avg_turns, completed, abandoned, completion_rate
	want := []float64{4, 1, 2, 2, 0.5}
	b.expectConversations(t, params, want)
}
