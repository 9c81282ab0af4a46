package chdb_test

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

func TestRenderDegradesOnOldServers(t *testing.T) {
	src := "CREATE TABLE IF NOT EXISTS t (ts {{dt64 3}}, m {{lc \"String\"}}) ENGINE = MergeTree ORDER BY ts {{ttl \"ts\" 30}};"
	old, err := chdb.Render("x.sql", src, chdb.FeaturesOf(chdb.Version{Major: 18, Minor: 16}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(old, "{}") || strings.Contains(old, "LowCardinality") || strings.Contains(old, "DateTime64") || strings.Contains(old, "TTL") {
		t.Fatalf("18.16 DDL uses newer features: %s", old)
	}
	cur, err := chdb.Render("x.sql", src, chdb.FeaturesOf(chdb.Version{Major: 25, Minor: 3}))
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
	if len(first) == 0 || first[0] != "001_requests.sql" {
		t.Fatalf("applied %v", first)
	}
	again, err := db.Migrate(ctx, schemas.Migrations())
	if err != nil || len(again) != 0 {
		t.Fatalf("second run applied %v, %v", again, err)
	}
	// A migration added later is applied on the next start, alone.
	extra := fstest.MapFS{"999_extra.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS extra (x UInt8) ENGINE = Memory;")}}
	if got, err := db.Migrate(ctx, extra); err != nil || len(got) != 1 {
		t.Fatalf("extra migration: %v, %v", got, err)
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
