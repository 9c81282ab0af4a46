package report

import (
	"context"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestQueriesOnCurrent sends the queries a report sends, for each filter of TestQuery, to
// 18.16 (parameters bound by chdb.Bind) and to ClickHouse 26.7 (chDB, parameters bound by
// the server) over the same rows, and requires the same answers: the same columns, types
// and counts exactly, the t-digest quantiles within 3 % (26.7 reads singleton centroids
// exactly where 18.16 interpolates between them).
func TestQueriesOnCurrent(t *testing.T) {
	db := openDB(t)
	base := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	insert(t, db, knownWindows(base)...)
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	if err := testbed.CopyTables(ctx, db.Conn(), db.Name(), cur, "token_rollups"); err != nil {
		t.Fatal(err)
	}
	quantiles := []string{"ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "tpot_p99"}
	r := Range{From: base, To: base.Add(30 * time.Minute)}
	for _, f := range []Filter{{}, {Env: "prod"}, {Model: "llama"}, {Scene: "chat"}, {Model: "qwen", Env: "staging"}, {Model: "it's"}, {Layer: "engine"}} {
		span, table, unbound, params, err := queries(r, f)
		if err != nil {
			t.Fatal(err)
		}
		layers, layersUnbound, layersParams, err := layersQuery(r, f)
		if err != nil {
			t.Fatal(err)
		}
		for i, q := range []string{span, table, layers} {
			unbound := append(unbound[:], layersUnbound)
			if i == 2 {
				params = layersParams
			}
			want, err := testbed.Query(ctx, db.Conn(), q)
			if err != nil {
				t.Fatalf("18.16: %v\n%s", err, q)
			}
			got, err := cur.Query(unbound[i], params)
			if err != nil {
				t.Fatalf("ClickHouse %s: %v\n%s", cur.Version, err, unbound[i])
			}
			if err := testbed.Compare(want, got, 1e-9, quantiles...); err != nil {
				t.Errorf("filter %+v: ClickHouse %s answers otherwise than 18.16: %v\n%s", f, cur.Version, err, unbound[i])
			}
			if err := testbed.Compare(want, got, 0.03); err != nil {
				t.Errorf("filter %+v: ClickHouse %s's quantiles are not within 3%% of 18.16's: %v", f, cur.Version, err)
			}
			if i == 1 && f == (Filter{Env: "prod"}) && len(got.Rows) != 3 {
				t.Errorf("the prod table has %d rows on ClickHouse %s, want 3", len(got.Rows), cur.Version)
			}
		}
	}
}
