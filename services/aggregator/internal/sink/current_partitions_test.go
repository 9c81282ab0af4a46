package sink

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestInsertsOverManyPartitionsOnCurrent: on the current ClickHouse, a flush whose rows fall
// in more than 100 partitions (raw requests from 150 days, rollups of 150 months: valid
// events, each late one a correction of its window) is refused with TOO_MANY_PARTS under the
// default max_partitions_per_insert_block, and would be on every retry. With the settings
// the aggregator inserts with (InsertSettings) both are stored. chDB listens on no port, so
// the inserts run through it with those settings in a SETTINGS clause.
func TestInsertsOverManyPartitionsOnCurrent(t *testing.T) {
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	has, err := cur.Strings(ctx, "SELECT count() FROM system.settings WHERE name = 'max_partitions_per_insert_block'")
	if err != nil || len(has) != 1 || has[0] != "1" {
		t.Fatalf("the current engine has max_partitions_per_insert_block: %v %v", has, err)
	}
	settings := InsertSettings(true)
	var names []string
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	var clause []string
	for _, k := range names {
		clause = append(clause, fmt.Sprintf("%s = %v", k, settings[k]))
	}
	with := " SETTINGS " + strings.Join(clause, ", ")
	start := time.Date(2010, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for _, c := range []struct{ table, insert string }{
		{"requests", fmt.Sprintf("INSERT INTO requests (ts, event_id, consumer, stream_seq) SELECT toDateTime(%d + number * 86400), toString(number), 'agg', number + 1 FROM numbers(150)", start)},
		{"token_rollups", fmt.Sprintf("INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, requests, consumer, seq_through, flush_id) SELECT addMonths(toDateTime(%d), toInt32(number)), 15, 'correction', 'prod', 'chat', 'm', 1, 'agg', 150, 'f' FROM numbers(150)", start)},
	} {
		if err := cur.Exec(ctx, c.insert); err == nil || !strings.Contains(err.Error(), "TOO_MANY_PARTS") {
			t.Fatalf("%s: plain insert of 150 partitions: %v, want TOO_MANY_PARTS (the case this guards against)", c.table, err)
		}
		// Stored: what the tables' TTL keeps of such old rows is another matter.
		if err := cur.Exec(ctx, c.insert+with); err != nil {
			t.Fatalf("%s: insert with the aggregator's settings: %v", c.table, err)
		}
	}
}

// TestInsertsOverManyPartitions: on this server (18.16 knows no partition limit, and
// refuses a setting it does not know) a batch of raw requests from 150 days and token rollups
// of 150 months are stored by the writers.
func TestInsertsOverManyPartitions(t *testing.T) {
	db, w := openWriter(t, "agg-days")
	ctx := context.Background()
	r := w.NewBuffer()
	for i := range 150 {
		ev := sampleEvent()
		ev.TS = time.Date(2010, 1, 1, 12, 0, 0, 0, time.UTC).AddDate(0, 0, i)
		r.Add(&ev, "500-2000", 0, uint64(i+1))
	}
	if err := w.Write(ctx, r, "days-1"); err != nil {
		t.Fatal(err)
	}
	var n uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM requests WHERE consumer = 'agg-days'").Scan(&n); err != nil || n != 150 {
		t.Fatalf("%d requests stored (%v), want 150", n, err)
	}
}
