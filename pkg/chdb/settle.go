package chdb

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Settle waits, up to ctx, until no query whose id starts with prefix runs on the server.
// An insert abandoned by its client (a timeout while the server hung, a process killed after
// sending it) may still be running, or may start once the server reads its socket again:
// what it stored is known only once it has ended.
func Settle(ctx context.Context, conn driver.Conn, prefix string) error {
	for {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.processes WHERE startsWith(query_id, ?)", prefix).Scan(&n); err != nil {
			return fmt.Errorf("cannot look for running inserts: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
