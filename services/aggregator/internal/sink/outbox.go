package sink

import (
	"context"
	"fmt"
	"time"
)

// OutboxMsg is one rollup message as published on ROLLUPS.
type OutboxMsg struct {
	Subject, ID string
	Data        []byte
}

// WriteOutbox inserts the messages of the flush l, number flushSeq of stream, into
// rollup_outbox in one batch: written before the flush's rows, so that a flush whose rows
// are stored always has its messages there to publish again.
func (c *ClickHouse) WriteOutbox(ctx context.Context, stream string, l Ledger, flushSeq uint64, msgs []OutboxMsg, now time.Time) error {
	if len(msgs) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO rollup_outbox (consumer, stream, flush_id, flush_seq, seq_through, msg_id, subject, data, written_at)")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into rollup_outbox: %w", err)
	}
	for i := range msgs {
		m := &msgs[i]
		if err := b.Append(c.consumer, stream, l.FlushID, flushSeq, l.SeqThrough, m.ID, m.Subject, string(m.Data), now); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the rollup_outbox batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into rollup_outbox: %w", len(msgs), err)
	}
	return nil
}

// LastFlushSeq returns the highest flush_seq this consumer stored in rollup_outbox for
// stream, 0 when none.
func (c *ClickHouse) LastFlushSeq(ctx context.Context, stream string) (uint64, error) {
	var n uint64
	q := "SELECT max(flush_seq) FROM rollup_outbox WHERE consumer = ? AND stream = ?"
	if err := c.conn.QueryRow(fullRead(ctx), q, c.consumer, stream).Scan(&n); err != nil {
		return 0, fmt.Errorf("cannot read the last flush of %s in rollup_outbox: %w", stream, err)
	}
	return n, nil
}

// Unacknowledged returns, in the order they were published, the messages of this consumer's
// flushes of stream numbered after acked and cut after floor whose rows table stores: the
// flushes whose rollups JetStream may not hold. A flush whose rows are not stored is left
// out: it is cut again, under a new id, when its events come again.
func (c *ClickHouse) Unacknowledged(ctx context.Context, stream, table string, floor, acked uint64) (msgs []OutboxMsg, flushes int, err error) {
	q := `SELECT flush_id, msg_id, subject, data FROM rollup_outbox
WHERE consumer = ? AND stream = ? AND seq_through > ? AND flush_seq > ?
  AND flush_id IN (SELECT flush_id FROM ` + table + ` WHERE consumer = ? AND seq_through > ?)
ORDER BY flush_seq, length(msg_id), msg_id`
	rows, err := c.conn.Query(fullRead(ctx), q, c.consumer, stream, floor, acked, c.consumer, floor)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot read the unacknowledged rollups of %s from rollup_outbox: %w", stream, err)
	}
	defer rows.Close()
	var last string
	for rows.Next() {
		var flushID, id, subject, data string
		if err := rows.Scan(&flushID, &id, &subject, &data); err != nil {
			return nil, 0, fmt.Errorf("cannot read rollup_outbox: %w", err)
		}
		if flushID != last {
			flushes++
			last = flushID
		}
		msgs = append(msgs, OutboxMsg{Subject: subject, ID: id, Data: []byte(data)})
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("cannot read rollup_outbox: %w", err)
	}
	return msgs, flushes, nil
}

// OutboxFlushes is what one daily partition of rollup_outbox holds of one consumer's
// flushes of one stream.
type OutboxFlushes struct {
	Day              uint32 // the partition: toYYYYMMDD(written_at)
	Consumer, Stream string
	LastFlushSeq     uint64    // the highest flush_seq
	Newest           time.Time // the latest written_at
}

// OutboxPartitionsQuery lists, per daily partition of rollup_outbox, every consumer and
// stream with rows there: the flushes a partition holds and how recent they are.
const OutboxPartitionsQuery = `SELECT toYYYYMMDD(written_at) AS day, consumer, stream, max(flush_seq), max(written_at)
FROM rollup_outbox GROUP BY day, consumer, stream ORDER BY day, consumer, stream`

// DropOutboxPartitionSQL drops the daily partition day of rollup_outbox; a partition that
// is not there (another aggregator dropped it) is no error.
func DropOutboxPartitionSQL(day uint32) string {
	return fmt.Sprintf("ALTER TABLE rollup_outbox DROP PARTITION %d", day)
}

// OutboxPartitions reads OutboxPartitionsQuery: rollup_outbox's partitions, of every
// consumer, not only this one's.
func (c *ClickHouse) OutboxPartitions(ctx context.Context) ([]OutboxFlushes, error) {
	rows, err := c.conn.Query(fullRead(ctx), OutboxPartitionsQuery)
	if err != nil {
		return nil, fmt.Errorf("cannot read the partitions of rollup_outbox: %w", err)
	}
	defer rows.Close()
	var out []OutboxFlushes
	for rows.Next() {
		var f OutboxFlushes
		if err := rows.Scan(&f.Day, &f.Consumer, &f.Stream, &f.LastFlushSeq, &f.Newest); err != nil {
			return nil, fmt.Errorf("cannot read the partitions of rollup_outbox: %w", err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the partitions of rollup_outbox: %w", err)
	}
	return out, nil
}

// DropOutboxPartition drops the daily partition day of rollup_outbox.
func (c *ClickHouse) DropOutboxPartition(ctx context.Context, day uint32) error {
	if err := c.conn.Exec(ctx, DropOutboxPartitionSQL(day)); err != nil {
		return fmt.Errorf("cannot drop partition %d of rollup_outbox: %w", day, err)
	}
	return nil
}
