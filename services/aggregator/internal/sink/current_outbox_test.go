package sink

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestOutboxSweepSQLOnCurrent: on the current ClickHouse, the sweep's statements work on
// rollup_outbox as the migrator makes it there: the partitions query lists
// each day × consumer × stream with its last flush and newest row, a day's partition is
// dropped whole and the others kept, and dropping a partition that is gone is no error.
func TestOutboxSweepSQLOnCurrent(t *testing.T) {
	cur := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for i, r := range []struct {
		consumer string
		seq      uint64
		daysAgo  int
	}{{"agg-1", 1, 3}, {"agg-1", 2, 3}, {"agg-2", 5, 3}, {"agg-1", 3, 2}} {
		at := now.AddDate(0, 0, -r.daysAgo)
		insert := fmt.Sprintf("INSERT INTO rollup_outbox (consumer, stream, flush_id, flush_seq, seq_through, msg_id, subject, data, written_at) VALUES ('%s', 'LLM_EVENTS', 'f%d', %d, %d, 'f%d-0', 'rollup.tokens.prod.chat', '{}', toDateTime(%d))",
			r.consumer, i, r.seq, i+1, i, at.Unix())
		if err := cur.Exec(ctx, insert); err != nil {
			t.Fatal(err)
		}
	}
	day := func(daysAgo int) uint32 {
		res, err := cur.Query(fmt.Sprintf("SELECT toYYYYMMDD(toDateTime(%d))", now.AddDate(0, 0, -daysAgo).Unix()), nil)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(res.Rows[0][0].(uint64))
	}
	res, err := cur.Query(OutboxPartitionsQuery, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]any{
		{uint64(day(3)), "agg-1", "LLM_EVENTS", uint64(2), now.AddDate(0, 0, -3)},
		{uint64(day(3)), "agg-2", "LLM_EVENTS", uint64(5), now.AddDate(0, 0, -3)},
		{uint64(day(2)), "agg-1", "LLM_EVENTS", uint64(3), now.AddDate(0, 0, -2)},
	}
	if fmt.Sprint(res.Rows) != fmt.Sprint(want) {
		t.Fatalf("partitions %v, want %v", res.Rows, want)
	}
	for _, d := range []uint32{day(3), day(3), day(10)} { // the second and third are gone or never were
		if err := cur.Exec(ctx, DropOutboxPartitionSQL(d)); err != nil {
			t.Fatalf("%s: %v", DropOutboxPartitionSQL(d), err)
		}
	}
	if n, err := cur.Strings(ctx, "SELECT count() FROM rollup_outbox"); err != nil || len(n) != 1 || n[0] != "1" {
		t.Fatalf("%v rows left (%v), want the other day's 1", n, err)
	}
}
