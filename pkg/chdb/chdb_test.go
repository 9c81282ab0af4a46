package chdb_test

import (
	"context"
	"errors"
	"flag"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/chserver"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func TestRenderDegradesWithoutFeatures(t *testing.T) {
	src := "CREATE TABLE IF NOT EXISTS t (ts {{dt64 3}}, m {{lc \"String\"}}) ENGINE = MergeTree ORDER BY ts {{ttl \"ts\" 30}};"
	old, err := chdb.Render("x.sql", src, chdb.Features{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(old, "{}") || strings.Contains(old, "LowCardinality") || strings.Contains(old, "DateTime64") || strings.Contains(old, "TTL") {
		t.Fatalf("18.16 DDL uses newer features: %s", old)
	}
	cur, err := chdb.Render("x.sql", src, chdb.Features{LowCardinality: true, DateTime64: true, TTL: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DateTime64(3, 'UTC')", "LowCardinality(String)", "TTL toDateTime(ts) + INTERVAL 30 DAY"} {
		if !strings.Contains(cur, want) {
			t.Fatalf("current DDL lacks %s: %s", want, cur)
		}
	}
	if _, err := chdb.Render("bad.sql", "{{nope}}", chdb.Features{}); err == nil || !strings.Contains(err.Error(), "bad.sql") {
		t.Fatalf("a bad template must be named in the error, got %v", err)
	}
}

func TestStatements(t *testing.T) {
	got := chdb.Statements("-- comment;\nCREATE TABLE a (x UInt8)\nENGINE = Memory;\n\nCREATE TABLE b (s String) ENGINE = Memory;\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], "CREATE TABLE a") || strings.HasSuffix(got[1], ";") {
		t.Fatalf("got %q", got)
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]chdb.Version{"18.16.1": {18, 16}, "25.3.2.39": {25, 3}, " 24.8 ": {24, 8}} {
		got, err := chdb.ParseVersion(in)
		if err != nil || got != want {
			t.Fatalf("ParseVersion(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := chdb.ParseVersion("dev"); err == nil {
		t.Fatal("accepted a bad version")
	}
}

func TestConfigValidate(t *testing.T) {
	good := chdb.Config{Addr: "127.0.0.1:9000", DB: "tokenscope", DialTimeout: time.Second}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.DB = "x; DROP DATABASE y"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "CLICKHOUSE_DB") {
		t.Fatalf("got %v", err)
	}
	bad = good
	bad.HTTPAddr = "clickhouse"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "CLICKHOUSE_HTTP_ADDR") {
		t.Fatalf("got %v", err)
	}
}

func TestHTTPURL(t *testing.T) {
	for _, tc := range []struct {
		cfg  chdb.Config
		want string
	}{
		{chdb.Config{Addr: "127.0.0.1:9000"}, "http://127.0.0.1:8123"},
		{chdb.Config{Addr: "ch.internal:9440", TLS: true}, "https://ch.internal:8443"},
		{chdb.Config{Addr: "[::1]:9000"}, "http://[::1]:8123"},
		{chdb.Config{Addr: "127.0.0.1:9000", HTTPAddr: "10.0.0.5:18123"}, "http://10.0.0.5:18123"},
	} {
		if got := tc.cfg.HTTPURL(); got != tc.want {
			t.Errorf("%+v: HTTPURL() = %s, want %s", tc.cfg, got, tc.want)
		}
	}
}

// TestMigrateIdempotent applies the real migrations twice on the real server, then writes
// and reads a row through the requests table.
func TestMigrateIdempotent(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	defer db.Close() // Close is safe twice
	first, err := db.Migrate(ctx, schemas.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"001_requests.sql", "002_token_rollups.sql", "003_gpu_rollups.sql", "004_alerts.sql", "005_engine_rollups.sql", "006_host_rollups.sql", "007_layers.sql", "008_feedback.sql", "008_feedback_rollups.sql", "009_outcomes.sql", "010_scores.sql", "011_rollup_outbox.sql", "012_alert_resolve_reason.sql"}
	if !slices.Equal(first.Applied, want) || len(first.Existing) != 0 || len(first.Created) != 9 {
		t.Fatalf("first run: %+v", first)
	}
	again, err := db.Migrate(ctx, schemas.Migrations())
	if err != nil || len(again.Applied)+len(again.Created)+len(again.Existing) != 0 {
		t.Fatalf("second run: %+v, %v", again, err)
	}
	// A migration added later is applied on the next start, alone.
	extra := fstest.MapFS{"999_extra.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS extra (x UInt8) ENGINE = Memory;")}}
	if got, err := db.Migrate(ctx, extra); err != nil || !slices.Equal(got.Applied, []string{"999_extra.sql"}) || !slices.Equal(got.Created, []string{"extra"}) {
		t.Fatalf("extra migration: %+v, %v", got, err)
	}
	var n uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = 'requests'", cfg.DB).Scan(&n); err != nil || n != 1 {
		t.Fatalf("requests table: %d, %v", n, err)
	}
	// A server-side error names the migration.
	broken := fstest.MapFS{"998_broken.sql": {Data: []byte("CREATE TABLE nonsense;")}}
	if _, err := db.Migrate(ctx, broken); err == nil || !strings.Contains(err.Error(), "998_broken.sql") {
		t.Fatalf("got %v", err)
	}
}

// TestMigrateReportsExisting pre-creates two of the tables as a cluster would (a Distributed
// table in front of a local one) and checks the migrator leaves them and says so.
func TestMigrateReportsExisting(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range []string{
		"CREATE TABLE token_rollups_local (window_start DateTime, layer String, requests UInt64, completed UInt64, abandoned UInt64) ENGINE = MergeTree ORDER BY window_start",
		"CREATE TABLE token_rollups AS token_rollups_local ENGINE = Distributed(" + chserver.Cluster + ", " + cfg.DB + ", token_rollups_local)",
		"CREATE TABLE alerts (at DateTime, rule String) ENGINE = MergeTree ORDER BY at",
	} {
		if err := db.Conn().Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	m, err := db.Migrate(ctx, schemas.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	wantExisting := []chdb.Table{{"token_rollups", "Distributed", "002_token_rollups.sql"}, {"alerts", "MergeTree", "004_alerts.sql"}}
	if !slices.Equal(m.Existing, wantExisting) {
		t.Errorf("existing %v, want %v", m.Existing, wantExisting)
	}
	if want := []string{"001_requests.sql", "003_gpu_rollups.sql", "005_engine_rollups.sql", "006_host_rollups.sql", "007_layers.sql", "008_feedback.sql", "008_feedback_rollups.sql", "010_scores.sql", "011_rollup_outbox.sql", "012_alert_resolve_reason.sql"}; !slices.Equal(m.Applied, want) {
		t.Errorf("applied %v, want %v", m.Applied, want)
	}
	if want := []string{"requests", "gpu_rollups", "engine_rollups", "host_rollups", "feedback", "feedback_rollups", "rollup_outbox"}; !slices.Equal(m.Created, want) {
		t.Errorf("created %v, want %v", m.Created, want)
	}
	var engine string
	if err := db.Conn().QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'token_rollups'", cfg.DB).Scan(&engine); err != nil || engine != "Distributed" {
		t.Errorf("token_rollups is now %q, %v", engine, err)
	}
	if again, err := db.Migrate(ctx, schemas.Migrations()); err != nil || len(again.Existing)+len(again.Applied) != 0 {
		t.Errorf("second run: %+v, %v", again, err)
	}
}

// TestProbe checks what the features probe finds on Debian's 18.16 and that a failed
// connection is an error, never a missing feature.
func TestProbe(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f, err := db.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ClickHouse %s has %+v", db.Version(), f)
	if db.Version() == (chdb.Version{Major: 18, Minor: 16}) && f != (chdb.Features{}) {
		t.Errorf("18.16: %+v, want none", f)
	}
	// Twice on the same connections: the probes' temporary tables do not get in the way.
	if again, err := db.Features(ctx); err != nil || again != f {
		t.Errorf("again: %+v, %v", again, err)
	}
	down := errors.New("connection reset")
	if _, err := chdb.Probe(ctx, func(context.Context, string) error { return down }); !errors.Is(err, down) {
		t.Errorf("a failed connection gave %v", err)
	}
	all, err := chdb.Probe(ctx, func(context.Context, string) error { return nil })
	if err != nil || all != (chdb.Features{LowCardinality: true, DateTime64: true, TTL: true}) {
		t.Errorf("a server accepting everything: %+v, %v", all, err)
	}
	none, err := chdb.Probe(ctx, func(context.Context, string) error { return &clickhouse.Exception{Code: 50} })
	if err != nil || none != (chdb.Features{}) {
		t.Errorf("a server refusing everything: %+v, %v", none, err)
	}
}

var update = flag.Bool("update", false, "rewrite testdata/rendered from what the servers get")

// checkRendered renders every migration for f and compares it with testdata/rendered/<server>:
// the DDL each server gets, kept where a reader sees it.
func checkRendered(t *testing.T, server string, f chdb.Features) {
	t.Helper()
	names, err := fs.Glob(schemas.Migrations(), "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("migrations: %v %v", names, err)
	}
	for _, name := range names {
		raw, err := fs.ReadFile(schemas.Migrations(), name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := chdb.Render(name, string(raw), f)
		if err != nil {
			t.Fatal(err)
		}
		golden := filepath.Join("testdata", "rendered", server, name)
		if *update {
			if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
		}
		if got != string(want) {
			t.Errorf("%s renders for ClickHouse %s as\n%s\nnot as %s (go test -run %s -update rewrites it)", name, server, got, golden, t.Name())
		}
	}
}

// TestRenderedFor18 shows the DDL Debian's 18.16 gets, from what the probe finds there.
func TestRenderedFor18(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Version() != (chdb.Version{Major: 18, Minor: 16}) {
		t.Skipf("the server is ClickHouse %s, not 18.16", db.Version())
	}
	f, err := db.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkRendered(t, "18.16", f)
}

// TestMigrateCurrent runs the migrator on a current ClickHouse (chDB, 26.7): the features
// it finds, the DDL it renders (shown in testdata/rendered/26.7), applied as is, twice, and
// a table created beforehand reported as existing.
func TestMigrateCurrent(t *testing.T) {
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if !strings.HasPrefix(cur.Version, "26.7.") {
		t.Fatalf("chDB is ClickHouse %s; the rendering in testdata/rendered/26.7 is for 26.7", cur.Version)
	}
	if err := cur.Exec(ctx, "CREATE TABLE gpu_rollups (window_start DateTime, host String) ENGINE = ReplacingMergeTree ORDER BY (host, window_start)"); err != nil {
		t.Fatal(err)
	}
	m, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if want := (chdb.Features{LowCardinality: true, DateTime64: true, TTL: true}); m.Features != want {
		t.Fatalf("ClickHouse %s: features %+v, want %+v", cur.Version, m.Features, want)
	}
	checkRendered(t, "26.7", m.Features)
	if want := []chdb.Table{{"gpu_rollups", "ReplacingMergeTree", "003_gpu_rollups.sql"}}; !slices.Equal(m.Existing, want) {
		t.Errorf("existing %v, want %v", m.Existing, want)
	}
	if want := []string{"requests", "token_rollups", "alerts", "engine_rollups", "host_rollups", "feedback", "feedback_rollups", "rollup_outbox"}; !slices.Equal(m.Created, want) {
		t.Errorf("created %v, want %v", m.Created, want)
	}
	// What the server made of the DDL: the types, TTL and engines production gets.
	for _, c := range []struct{ sql, want string }{
		{"SELECT type FROM system.columns WHERE database = currentDatabase() AND table = 'requests' AND name = 'ts'", "DateTime64(3, 'UTC')"},
		{"SELECT type FROM system.columns WHERE database = currentDatabase() AND table = 'token_rollups' AND name = 'model'", "LowCardinality(String)"},
		{"SELECT engine FROM system.tables WHERE database = currentDatabase() AND name = 'alerts'", "MergeTree"},
		{"SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND position(create_table_query, 'TTL toDateTime(ts) + toIntervalDay(30)') > 0", "1"},
	} {
		got, err := cur.Strings(ctx, c.sql)
		if err != nil || len(got) != 1 || got[0] != c.want {
			t.Errorf("%s: %v, %v; want %s", c.sql, got, err, c.want)
		}
	}
	again, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations())
	if err != nil || len(again.Applied)+len(again.Existing)+len(again.Created) != 0 {
		t.Fatalf("second run: %+v, %v", again, err)
	}
}

func TestMigrationLog(t *testing.T) {
	var buf strings.Builder
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	chdb.Migration{}.Log(logger, chdb.Version{Major: 26, Minor: 7})
	if buf.Len() != 0 {
		t.Fatalf("nothing done, yet logged %s", buf.String())
	}
	m := chdb.Migration{Applied: []string{"001_requests.sql"}, Created: []string{"requests"},
		Existing: []chdb.Table{{Name: "token_rollups", Engine: "Distributed", Migration: "002_token_rollups.sql"}}}
	m.Log(logger, chdb.Version{Major: 26, Minor: 7})
	for _, want := range []string{`"applied":["001_requests.sql"]`, `"created":["requests"]`, `"existing":["token_rollups (Distributed)"]`, `"server":"26.7"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log %s lacks %s", buf.String(), want)
		}
	}
}
