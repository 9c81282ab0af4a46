package chdb_test

import (
	"context"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/chserver"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// connExec is a chdb.Executor over a native connection, for MigrateOn.
type connExec struct{ conn driver.Conn }

func (c connExec) Exec(ctx context.Context, sql string) error { return c.conn.Exec(ctx, sql) }

func (c connExec) Insert(ctx context.Context, insert string, row ...any) error {
	b, err := c.conn.PrepareBatch(ctx, insert)
	if err != nil {
		return err
	}
	if err := b.Append(row...); err != nil {
		return err
	}
	return b.Send()
}

func (c connExec) Strings(ctx context.Context, sql string) ([]string, error) {
	rows, err := c.conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// beforeLayers is the migrations a deployment had before 007_layers.sql.
func beforeLayers(t *testing.T) fs.FS {
	t.Helper()
	old := fstest.MapFS{}
	for _, name := range []string{"001_requests.sql", "002_token_rollups.sql", "003_gpu_rollups.sql", "004_alerts.sql"} {
		raw, err := fs.ReadFile(schemas.Migrations(), name)
		if err != nil {
			t.Fatal(err)
		}
		old[name] = &fstest.MapFile{Data: raw}
	}
	return old
}

var layerColumns = []string{"requests.layer", "requests.trace_id", "requests.prefill_ms", "requests.decode_ms", "token_rollups.layer"}

// scoreColumns are what 010_scores.sql adds.
var scoreColumns = []string{"requests.score_names", "requests.score_values"}

// outcomeColumns are what 009_outcomes.sql adds.
var outcomeColumns = []string{"token_rollups.completed", "token_rollups.abandoned"}

// alertColumns are what 012_alert_resolve_reason.sql adds.
var alertColumns = []string{"alerts.resolve_reason"}

// checkLayersMigration upgrades a deployment made before the layers to the current
// migrations on x: the columns are added, rows stored before read as the gateway's, and
// running it again, or a copy of it under another name (a second service migrating at
// once), changes nothing.
func checkLayersMigration(t *testing.T, x chdb.Executor, db, server, settings string) {
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, x, db, server, beforeLayers(t)); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"INSERT INTO requests (ts, event_id, env, scene, model, status) SELECT toDateTime('2026-11-30 10:00:00'), 'old', 'prod', 'chat', 'm', 'ok'",
		"INSERT INTO token_rollups (window_start, env, scene, model, requests) SELECT toDateTime('2026-11-30 10:00:00'), 'prod', 'chat', 'm', 3",
	} {
		if err := x.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	m, err := chdb.MigrateOn(ctx, x, db, server, schemas.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if wantAdded := slices.Concat(layerColumns, outcomeColumns, scoreColumns, alertColumns); !slices.Contains(m.Applied, "007_layers.sql") || !slices.Contains(m.Applied, "009_outcomes.sql") || !slices.Contains(m.Applied, "010_scores.sql") || !slices.Equal(m.Added, wantAdded) {
		t.Fatalf("upgrade: applied %v, added %v; want 007_layers.sql, 009_outcomes.sql and 010_scores.sql adding %v", m.Applied, m.Added, wantAdded)
	}
	for q, want := range map[string]string{
		"SELECT concat(layer, '|', trace_id, '|', toString(prefill_ms), '|', toString(decode_ms)) FROM requests WHERE event_id = 'old'" + settings: "gateway||0|0",
		"SELECT layer FROM token_rollups":                           "gateway",
		"SELECT toString(completed + abandoned) FROM token_rollups": "0",
		"SELECT type FROM system.columns WHERE database = currentDatabase() AND table = 'requests' AND name = 'trace_id'": "String",
		"SELECT toString(length(score_names) + length(score_values)) FROM requests WHERE event_id = 'old'" + settings:     "0",
		"SELECT toString(count()) FROM verdicts": "0",
	} {
		if got, err := x.Strings(ctx, q); err != nil || len(got) != 1 || got[0] != want {
			t.Errorf("%s: %q, %v; want %q", q, got, err, want)
		}
	}
	// A request's inline scores read through verdicts as feedback of source app on it.
	for _, q := range []string{
		"INSERT INTO requests (ts, event_id, env, scene, model, status, conversation_id, score_names, score_values) SELECT toDateTime('2026-11-30 10:00:01'), 'r1', 'prod', 'chat', 'm', 'ok', 'c1', ['quality', 'thumbs'], [0.5, 1]",
		"INSERT INTO feedback (ts, event_id, request_id, name, value, source) SELECT toDateTime('2026-11-30 11:00:00'), 'f1', 'r1', 'thumbs', 0, 'user'",
	} {
		if err := x.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	got, err := x.Strings(ctx, "SELECT concat(event_id, '|', request_id, '|', conversation_id, '|', name, '|', toString(value), '|', source, '|', scene, '|', toString(toDateTime(ts))) FROM verdicts ORDER BY event_id")
	if want := []string{"f1|r1||thumbs|0|user||2026-11-30 11:00:00", "r1/quality|r1|c1|quality|0.5|app|chat|2026-11-30 10:00:01", "r1/thumbs|r1|c1|thumbs|1|app|chat|2026-11-30 10:00:01"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("verdicts: %q, %v; want %q", got, err, want)
	}
	if again, err := chdb.MigrateOn(ctx, x, db, server, schemas.Migrations()); err != nil || len(again.Applied)+len(again.Added) != 0 {
		t.Fatalf("second run: %+v, %v", again, err)
	}
	raw, _ := fs.ReadFile(schemas.Migrations(), "007_layers.sql")
	twin := fstest.MapFS{"007_layers_twin.sql": {Data: raw}}
	if got, err := chdb.MigrateOn(ctx, x, db, server, twin); err != nil || len(got.Applied)+len(got.Added) != 0 {
		t.Fatalf("the same columns again: %+v, %v", got, err)
	}
}

// TestMigrateLayers18 upgrades a deployment on Debian's 18.16, which cannot parse ADD
// COLUMN IF NOT EXISTS.
func TestMigrateLayers18(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// 18.16 returns no rows for a query that selects a column added after a part was
	// written while PREWHERE (here moved from WHERE) filters on a column the part has; the
	// current engine does not (see schemas/README.md).
	checkLayersMigration(t, connExec{db.Conn()}, cfg.DB, db.Version().String(), " SETTINGS optimize_move_to_prewhere = 0")
}

// TestMigrateLayersCurrent upgrades a deployment on a current ClickHouse (chDB, 26.7).
func TestMigrateLayersCurrent(t *testing.T) {
	cur := testbed.CurrentClickHouse(t)
	checkLayersMigration(t, cur, cur.DB, cur.Version, "")
}

// TestMigrateLayersDistributed adds the layer columns to a cluster's Distributed table only
// once the node's local table under it has them: before that the migration fails, naming
// the statement to run on every node, and is tried again at the next start.
func TestMigrateLayersDistributed(t *testing.T) {
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx, beforeLayers(t)); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"RENAME TABLE token_rollups TO token_rollups_local",
		"CREATE TABLE token_rollups AS token_rollups_local ENGINE = Distributed(" + chserver.Cluster + ", " + cfg.DB + ", token_rollups_local)",
	} {
		if err := db.Conn().Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	_, err = db.Migrate(ctx, schemas.Migrations())
	want := "ALTER TABLE " + cfg.DB + ".token_rollups_local ADD COLUMN layer"
	if err == nil || !strings.Contains(err.Error(), "007_layers.sql") || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want an error naming 007_layers.sql and %q", err, want)
	}
	for _, stmt := range []string{
		"ALTER TABLE token_rollups_local ADD COLUMN layer String DEFAULT 'gateway'",
		"ALTER TABLE token_rollups_local ADD COLUMN completed UInt64 DEFAULT 0",
		"ALTER TABLE token_rollups_local ADD COLUMN abandoned UInt64 DEFAULT 0",
	} {
		if err := db.Conn().Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	m, err := db.Migrate(ctx, schemas.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.Applied, "007_layers.sql") || !slices.Equal(m.Added, slices.Concat([]string{"token_rollups.layer"}, outcomeColumns, scoreColumns, alertColumns)) {
		t.Fatalf("after the local table: applied %v, added %v", m.Applied, m.Added)
	}
	var n uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM token_rollups WHERE layer = 'gateway'").Scan(&n); err != nil {
		t.Fatalf("the Distributed table cannot read layer: %v", err)
	}
}
