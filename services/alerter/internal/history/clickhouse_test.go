package history

import (
	"context"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// OpenMigrated opens the test ClickHouse with the schema migrated, for the tests of this
// package and of history_test (exported to those only: it is defined in a _test.go file).
// The context ends a minute on, or with the test; the connection closes with the test.
func OpenMigrated(t testing.TB) (context.Context, *chdb.DB, chdb.Config) {
	t.Helper()
	cfg := testbed.ClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db, err := chdb.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	return ctx, db, cfg
}
