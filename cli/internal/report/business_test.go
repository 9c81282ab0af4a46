package report

import (
	"context"
	"io/fs"
	"math"
	"testing"

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
