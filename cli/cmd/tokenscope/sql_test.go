package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestReportSQL runs every cookbook query through `tokenscope report --sql` on 18.16, which
// cannot bind parameters itself, and the same files on ClickHouse 26.7 (chDB) with the
// server binding them, over the same rows: the same answers both ways.
func TestReportSQL(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx := context.Background()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	// Recent rows: a current server drops, as it inserts them, rows past the tables' TTL
	// (requests: 30 days).
	base := time.Now().UTC().Truncate(time.Minute).Add(-30 * time.Minute)
	// Served by gpu-node-1, whose engine rows below the engine queries join by instance.
	b, err := db.Conn().PrepareBatch(ctx, "INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, bucket, bucket_lo, requests, ok, errors, timeouts, input_tokens, output_tokens, cached_input_tokens, cost_usd, ttft_count, ttft_means, ttft_weights)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		model := []string{"qwen2.5-72b", "it's"}[i%2]
		means := []float64{100 + float64(i), 200 + float64(i), 900}
		if err := b.Append(base.Add(time.Duration(i)*15*time.Second), uint32(15), "window", "prod", "chat", model, "gpu-node-1", "0-500", uint32(0),
			uint64(12), uint64(10), uint64(1), uint64(1), uint64(1000+i), uint64(500), uint64(100), 0.01, uint64(10), means, []uint64{5, 4, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	rb, err := db.Conn().PrepareBatch(ctx, "INSERT INTO requests (ts, event_id, env, scene, model, status, error_code, conversation_id, turn, outcome, cost_usd, input_tokens, output_tokens, layer, trace_id, bucket, total_ms, queue_ms, prefill_ms, decode_ms, score_names, score_values)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		status, code := "ok", ""
		if i == 5 {
			status, code = "error", "429"
		}
		outcome := ""
		if i == 2 {
			outcome = "completed"
		}
		// e5, a gateway request, carries its own verdicts: thumbs up and a quality score.
		names, values := []string{}, []float64{}
		if i == 5 {
			names, values = []string{"thumbs", "quality"}, []float64{1, 0.9}
		}
		if err := rb.Append(base.Add(time.Duration(i)*time.Second), "e"+strconv.Itoa(i), "prod", "chat", "qwen2.5-72b", status, code,
			"c"+strconv.Itoa(i/3), uint32(i%3+1), outcome, 0.5, uint32(100), uint32(10),
			[]string{"engine", "gateway"}[i%2], fmt.Sprintf("%032x", i/2+1), "0-500", float64(90+i%2*10), float64((1-i%2)*5), float64((1-i%2)*20), float64((1-i%2)*60), names, values); err != nil {
			t.Fatal(err)
		}
	}
	if err := rb.Send(); err != nil {
		t.Fatal(err)
	}

	// One host's engine and GPU windows, for engine_efficiency.sql.
	for _, q := range []string{
		"INSERT INTO engine_rollups (window_start, window_seconds, kind, host, engine, name, model, samples, up_samples, generation_tokens, prompt_tokens) VALUES",
		"INSERT INTO gpu_rollups (window_start, window_seconds, kind, host, gpu_index, gpu_uuid, samples, util_avg, energy_j) VALUES",
	} {
		eb, err := db.Conn().PrepareBatch(ctx, strings.TrimSuffix(q, " VALUES"))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			at := base.Add(time.Duration(i) * 15 * time.Second)
			if strings.Contains(q, "engine_rollups") {
				err = eb.Append(at, uint32(15), "window", "gpu-node-1", "vllm", "vllm", "qwen2.5-72b", uint64(15), uint64(15), float64(1500+i), float64(6000))
			} else {
				err = eb.Append(at, uint32(15), "window", "gpu-node-1", uint16(0), "GPU-0", uint64(15), float64(50+i), float64(4000))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := eb.Send(); err != nil {
			t.Fatal(err)
		}
	}
	// Verdicts: thumbs on e0–e4 (up on e0–e2) and a second copy of one, a rating of
	// conversation c1, and thumbs on a request nobody sent.
	fb, err := db.Conn().PrepareBatch(ctx, "INSERT INTO feedback (ts, event_id, request_id, conversation_id, name, value, source)")
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range []struct {
		id, req, conv, name string
		value               float64
	}{
		{"f0", "e0", "", "thumbs", 1}, {"f1", "e1", "", "thumbs", 1}, {"f2", "e2", "", "thumbs", 1}, {"f3", "e3", "", "thumbs", 0},
		{"f4", "e4", "", "thumbs", 0}, {"f4", "e4", "", "thumbs", 0}, {"f5", "", "c1", "rating", 4}, {"f6", "gone", "", "thumbs", 1},
	} {
		if err := fb.Append(base.Add(time.Duration(10+i)*time.Minute), f.id, f.req, f.conv, f.name, f.value, "user"); err != nil {
			t.Fatal(err)
		}
	}
	if err := fb.Send(); err != nil {
		t.Fatal(err)
	}

	getenv := func(k string) string {
		return map[string]string{"CLICKHOUSE_ADDR": cfg.Addr, "CLICKHOUSE_DB": cfg.DB, "CLICKHOUSE_USER": cfg.User, "CLICKHOUSE_PASSWORD": cfg.Password}[k]
	}
	dir := filepath.Join(rootDir(t), "schemas", "clickhouse", "queries")
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("cookbook: %v %v", files, err)
	}
	all := map[string]string{"from": base.Format(time.RFC3339), "to": base.Add(time.Hour).Format(time.RFC3339), "model": "it's", "limit": "10", "layer": "gateway", "trace_id": "", "bucket": "", "name": "thumbs", "satisfied_at": "1"}
	serverParams := map[string]string{"from": strconv.FormatInt(base.Unix(), 10), "to": strconv.FormatInt(base.Add(time.Hour).Unix(), 10), "model": "it's", "limit": "10", "layer": "gateway", "trace_id": "", "bucket": "", "name": "thumbs", "satisfied_at": "1"}
	args := func(file string) []string {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		a := []string{"report", "--sql", file, "--json"}
		for _, p := range chdb.Params(string(raw)) {
			a = append(a, "--param", p.Name+"="+all[p.Name])
		}
		return a
	}
	answers := map[string][]map[string]any{}
	for _, file := range files {
		var out, errs bytes.Buffer
		if err := run(ctx, args(file), getenv, &out, &errs); err != nil {
			t.Fatalf("%s: %v\n%s", filepath.Base(file), err, errs.String())
		}
		var rows []map[string]any
		if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
			t.Fatalf("%s: %v\n%s", filepath.Base(file), err, out.String())
		}
		if len(rows) == 0 {
			t.Errorf("%s: no rows", filepath.Base(file))
		}
		answers[filepath.Base(file)] = rows
	}
	// The model whose name holds a quote: 10 windows of 10 samples.
	if got := answers["merged_p99.sql"][0]; got["samples"] != float64(100) || got["ttft_p99"].(float64) < 800 {
		t.Errorf("merged_p99 = %v, want 100 samples and a p99 in the slow centroid", got)
	}
	// Three traces of a gateway event (100 ms) and an engine one (90 ms: 5 queued, 20
	// prefill, 60 decode).
	if got := answers["trace_split.sql"]; len(got) != 1 || got[0]["traces"] != float64(3) || got[0]["gateway_ms"] != float64(10) ||
		got[0]["queue_ms"] != float64(5) || got[0]["decode_ms"] != float64(60) || got[0]["engine_other_ms"] != float64(5) || got[0]["app_ms"] != nil {
		t.Errorf("trace_split = %v", got)
	}
	if got := answers["error_codes.sql"]; len(got) != 1 || got[0]["error_code"] != "429" || got[0]["requests"] != float64(1) {
		t.Errorf("error_codes = %v", got)
	}

	// Seven verdicts sent as feedback and e5's two inline scores.
	if got := answers["feedback_coverage.sql"]; len(got) != 1 || got[0]["verdicts"] != float64(9) || got[0]["duplicate_rows"] != float64(1) ||
		got[0]["unknown_request"] != float64(1) || got[0]["conversation_only"] != float64(1) || got[0]["inline_scores"] != float64(2) {
		t.Errorf("feedback_coverage = %v", got)
	}

	// The business view: the same queries, one range, at one layer.
	business := func(layer ...string) map[string][]map[string]any {
		var biz bytes.Buffer
		a := append([]string{"report", "--business", "--from", base.Format(time.RFC3339), "--to", base.Add(time.Hour).Format(time.RFC3339), "--json"}, layer...)
		if err := run(ctx, a, getenv, &biz, io.Discard); err != nil {
			t.Fatal(err)
		}
		var view struct {
			Sections []struct {
				Query string           `json:"query"`
				Rows  []map[string]any `json:"rows"`
			} `json:"sections"`
		}
		if err := json.Unmarshal(biz.Bytes(), &view); err != nil {
			t.Fatalf("%v\n%s", err, biz.String())
		}
		bySection := map[string][]map[string]any{}
		for _, s := range view.Sections {
			bySection[s.Query] = s.Rows
		}
		return bySection
	}
	bySection := business()
	// e0–e5 have no TTFT (0 ms): one band. The gateway's are e1 (up), e3 (down) and e5 (up,
	// inline); the engine's e0, e2 (up) and e4 (down, sent twice, counted once).
	if got := bySection["satisfaction_by_ttft_band.sql"]; len(got) != 1 || got[0]["ttft_band"] != "1: <= 500 ms" || got[0]["verdicts"] != float64(3) || math.Abs(got[0]["satisfied"].(float64)-2.0/3) > 1e-9 {
		t.Errorf("business view, satisfaction by TTFT band = %v", got)
	}
	if got := business("--layer", "engine")["satisfaction_by_ttft_band.sql"]; len(got) != 1 || got[0]["verdicts"] != float64(3) || math.Abs(got[0]["satisfied"].(float64)-2.0/3) > 1e-9 {
		t.Errorf("business view of the engine layer, satisfaction by TTFT band = %v", got)
	}
	// e5's inline quality score is the gateway's only one; c1's rating counts for its scene
	// and model.
	if got := bySection["quality_by_scene_model.sql"]; len(got) != 1 || got[0]["quality_scores"] != float64(1) || got[0]["quality_avg"] != 0.9 || got[0]["thumbs"] != float64(3) ||
		got[0]["ratings"] != float64(1) || got[0]["rating_avg"] != float64(4) {
		t.Errorf("business view, quality by scene and model = %v", got)
	}
	if got := bySection["quality_by_bucket.sql"]; len(got) != 1 || got[0]["bucket"] != "0-500" || got[0]["verdicts"] != float64(1) || got[0]["value_p50"] != 0.9 {
		t.Errorf("business view, quality by bucket = %v", got)
	}
	if got := bySection["retries.sql"]; len(got) != 1 || got[0]["conversations"] != float64(2) {
		t.Errorf("business view, retries = %v", got)
	}
	var text bytes.Buffer
	if err := run(ctx, []string{"report", "--business", "--last", "2h"}, getenv, &text, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "Satisfaction (thumbs up) by TTFT band") || !strings.Contains(text.String(), "1: <= 500 ms") {
		t.Errorf("business view:\n%s", text.String())
	}
	if err := run(ctx, []string{"report", "--business", "--model", "x"}, getenv, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--business takes a range") {
		t.Errorf("--business --model: %v", err)
	}

	var table bytes.Buffer
	if err := run(ctx, []string{"report", "--sql", filepath.Join(dir, "error_vs_timeout.sql"), "--param", "from=" + base.Local().Format("2006-01-02 15:04"), "--param", "to=now", "--param", "layer=gateway"}, getenv, &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "model") || !strings.Contains(table.String(), "qwen2.5-72b") || !strings.Contains(table.String(), "2 rows") {
		t.Errorf("table:\n%s", table.String())
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"report", "--sql", filepath.Join(dir, "merged_p99.sql"), "--param", "from=now-1h", "--param", "to=now"}, "needs --param model=… (a String)"},
		{[]string{"report", "--sql", filepath.Join(dir, "error_codes.sql"), "--param", "from=now-1h", "--param", "to=now", "--param", "layer=gateway", "--param", "model=x"}, "--param model: "},
		{[]string{"report", "--sql", filepath.Join(dir, "cost_per_conversation.sql"), "--param", "from=now-1h", "--param", "to=now", "--param", "layer=gateway", "--param", "limit=-1"}, `limit="-1" is not a UInt32`},
		{[]string{"report", "--sql", filepath.Join(dir, "nope.sql")}, "cannot read --sql"},
	} {
		if err := run(ctx, bad.args, getenv, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want an error containing %q", bad.args[2:], err, bad.want)
		}
	}

	t.Run("current", func(t *testing.T) {
		cur := testbed.CurrentClickHouse(t)
		if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
			t.Fatal(err)
		}
		if err := testbed.CopyTables(ctx, db.Conn(), cfg.DB, cur, "token_rollups", "requests", "engine_rollups", "gpu_rollups", "feedback"); err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			name := filepath.Base(file)
			raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+name)
			if err != nil {
				t.Fatal(err)
			}
			res, err := cur.Query(string(raw), serverParams)
			if err != nil {
				t.Fatalf("%s on ClickHouse %s: %v", name, cur.Version, err)
			}
			want := answers[name]
			if len(res.Rows) != len(want) {
				t.Errorf("%s: %d rows on ClickHouse %s, %d through report --sql on 18.16", name, len(res.Rows), cur.Version, len(want))
				continue
			}
			for i, row := range res.Rows {
				for j, col := range res.Columns {
					got, w := row[j], want[i][col.Name]
					if !sameJSON(got, w) {
						t.Errorf("%s row %d %s: %v on ClickHouse %s, %v through report --sql on 18.16", name, i+1, col.Name, got, cur.Version, w)
					}
				}
			}
		}
	})
}

// sameJSON compares a value of a testbed.Result with what report --json printed for it;
// t-digest quantiles (which current servers read off singleton centroids without 18.16's
// interpolation) within 10 %.
func sameJSON(got, want any) bool {
	var g float64
	switch x := got.(type) {
	case uint64:
		g = float64(x)
	case int64:
		g = float64(x)
	case float64:
		g = x
	case time.Time:
		w, err := time.Parse(time.RFC3339, want.(string))
		return err == nil && w.Equal(x)
	default:
		return got == want
	}
	w, ok := want.(float64)
	if want == nil && math.IsNaN(g) {
		return true // report --json prints nan as null
	}
	if !ok {
		return false
	}
	if g == w {
		return true
	}
	d := g - w
	if d < 0 {
		d = -d
	}
	return d <= 0.1*max(g, w)
}
