package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

const hostColumns = `window_start, window_seconds, kind, host, samples,
mem_samples, mem_total_bytes, mem_used_avg_bytes, mem_used_max_bytes, mem_available_min_bytes,
disk_seconds, disk_read_avg_bps, disk_read_max_bps, disk_write_avg_bps, disk_write_max_bps,
net_seconds, net_rx_avg_bps, net_rx_max_bps, net_tx_avg_bps, net_tx_max_bps,
consumer, seq_through, flush_id, written_at`

// WriteHostRollups inserts rows into host_rollups in one batch.
func (c *ClickHouse) WriteHostRollups(ctx context.Context, rows []events.HostRollup, l Ledger, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO host_rollups ("+hostColumns+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into host_rollups: %w", err)
	}
	for i := range rows {
		r := &rows[i]
		if err := b.Append(r.WindowStart, uint32(r.WindowSeconds), r.Kind, r.Host, r.Samples,
			r.MemSamples, r.MemTotalBytes, r.MemUsedAvgBytes, r.MemUsedMaxBytes, r.MemAvailableMinBytes,
			r.DiskSeconds, r.DiskReadAvgBps, r.DiskReadMaxBps, r.DiskWriteAvgBps, r.DiskWriteMaxBps,
			r.NetSeconds, r.NetRxAvgBps, r.NetRxMaxBps, r.NetTxAvgBps, r.NetTxMaxBps,
			c.consumer, l.SeqThrough, l.FlushID, now); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the host_rollups batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into host_rollups: %w", len(rows), err)
	}
	return nil
}
