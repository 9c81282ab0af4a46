package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// ClickHouse writes to tokenscope's tables on behalf of one consumer, whose name marks the
// rows so that a restart can find what it already wrote.
type ClickHouse struct {
	conn     driver.Conn
	consumer string
	// limited is whether the server has max_partitions_per_insert_block, once read.
	limited, checked bool
}

// New returns a writer for consumer.
func New(conn driver.Conn, consumer string) *ClickHouse {
	return &ClickHouse{conn: conn, consumer: consumer}
}

// QueryID returns the query id of an insert of this consumer's: its name, then id, so that
// Settle finds its inserts, all of them or one flush's.
func (c *ClickHouse) QueryID(id string) string { return c.consumer + "/" + id }

// WithQueryID tags the inserts made with ctx as QueryID(id).
func (c *ClickHouse) WithQueryID(ctx context.Context, id string) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithQueryID(c.QueryID(id)))
}

// insertCtx returns ctx with the settings of every insert. With insert_distributed_sync an
// insert into a Distributed table returns only once every shard has its rows (a no-op on
// other engines). With the default, asynchronous distributed inserts, the rows wait in a
// local queue after the insert returned: the ledger, read through the Distributed table,
// would not see them, a restart would write them again, and a shard outage would hide them
// from the settling count. And a flush's rows may fall in any number of monthly partitions
// (events of any time since 2000 are valid; each late one goes to a correction row of its
// window): past max_partitions_per_insert_block (100) the server refuses the insert, and it
// would be refused on every retry, holding the pipeline for good. The limit is lifted on
// the servers that have it (18.16 has not, and refuses a setting it does not know).
func (c *ClickHouse) insertCtx(ctx context.Context) (context.Context, error) {
	if !c.checked {
		limited, err := HasPartitionLimit(ctx, c.conn)
		if err != nil {
			return ctx, err
		}
		c.limited, c.checked = limited, true
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(InsertSettings(c.limited))), nil
}

// InsertSettings are the settings of the aggregator's inserts on a server that has
// max_partitions_per_insert_block (limited) or not; see insertCtx.
func InsertSettings(limited bool) clickhouse.Settings {
	s := clickhouse.Settings{"insert_distributed_sync": 1}
	if limited {
		s["max_partitions_per_insert_block"] = 0
	}
	return s
}

// HasPartitionLimit reports whether the server has max_partitions_per_insert_block.
func HasPartitionLimit(ctx context.Context, conn driver.Conn) (bool, error) {
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.settings WHERE name = 'max_partitions_per_insert_block'").Scan(&n); err != nil {
		return false, fmt.Errorf("cannot read the server's settings: %w", err)
	}
	return n > 0, nil
}

// fullRead makes a read through a Distributed table fail while a shard cannot answer, even
// where the user's profile sets skip_unavailable_shards: the ledger read from the shards
// that answer would leave out what the others store, and a restart would write it again.
func fullRead(ctx context.Context) context.Context {
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"skip_unavailable_shards": 0}))
}

// Settle waits, up to ctx, until no insert of this consumer's whose id (after the consumer's
// name) starts with prefix runs on the server; an empty prefix waits for all of them. An
// insert abandoned by its client (a timeout while the server hung, or a process killed after
// sending it) may still be running, or may start once the server reads its socket again;
// counting a flush's rows, or reading the ledger at start, is only conclusive once it has
// finished.
func (c *ClickHouse) Settle(ctx context.Context, prefix string) error {
	return chdb.Settle(ctx, c.conn, c.QueryID(prefix))
}

// Ledger is a flush's place in the stream: every event of its windows with a stream position
// up to SeqThrough is in its rows or earlier ones. FlushID names the flush's rows.
type Ledger struct {
	SeqThrough uint64
	FlushID    string
}

const tokenColumns = `window_start, window_seconds, kind, env, scene, model, instance, layer, bucket, bucket_lo,
requests, ok, errors, timeouts, canceled, rate_limited, late, estimated, unpriced,
input_tokens, output_tokens, cached_input_tokens, cost_usd, max_itl_ms,
ttft_count, ttft_min, ttft_max, ttft_p50, ttft_p90, ttft_p95, ttft_p99, ttft_means, ttft_weights,
tpot_count, tpot_min, tpot_max, tpot_p50, tpot_p90, tpot_p95, tpot_p99, tpot_means, tpot_weights,
total_count, total_min, total_max, total_p50, total_p90, total_p95, total_p99, total_means, total_weights,
consumer, seq_through, flush_id, written_at, completed, abandoned`

// WriteTokenRollups inserts rows into token_rollups in one batch; bucketLo gives each
// bucket label's lower bound.
func (c *ClickHouse) WriteTokenRollups(ctx context.Context, rows []events.TokenRollup, bucketLo func(string) int64, l Ledger, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO token_rollups ("+tokenColumns+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into token_rollups: %w", err)
	}
	for i := range rows {
		r := &rows[i]
		args := []any{r.WindowStart, uint32(r.WindowSeconds), r.Kind, r.Env, r.Scene, r.Model, r.Instance, string(r.Layer.OrGateway()), r.Bucket, uint32(bucketLo(r.Bucket)),
			r.Requests, r.OK, r.Errors, r.Timeouts, r.Canceled, r.RateLimited, r.Late, r.Estimated, r.Unpriced,
			r.InputTokens, r.OutputTokens, r.CachedInputTokens, r.CostUSD, r.MaxITLMs}
		for _, lat := range []*events.Latency{&r.TTFT, &r.TPOT, &r.Total} {
			args = append(args, lat.Count, lat.Min, lat.Max, lat.P50, lat.P90, lat.P95, lat.P99, lat.Means, lat.Weights)
		}
		args = append(args, c.consumer, l.SeqThrough, l.FlushID, now, r.Completed, r.Abandoned)
		if err := b.Append(args...); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the token_rollups batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into token_rollups: %w", len(rows), err)
	}
	return nil
}

const gpuColumns = `window_start, window_seconds, kind, host, gpu_index, gpu_uuid, gpu_name, samples,
util_avg, util_max, mem_used_max, mem_total, power_avg_w, power_max_w, energy_j, temp_max_c,
sm_clock_avg_mhz, throttled_samples, consumer, seq_through, flush_id, written_at`

// WriteGPURollups inserts rows into gpu_rollups in one batch.
func (c *ClickHouse) WriteGPURollups(ctx context.Context, rows []events.GPURollup, l Ledger, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO gpu_rollups ("+gpuColumns+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into gpu_rollups: %w", err)
	}
	for i := range rows {
		r := &rows[i]
		if err := b.Append(r.WindowStart, uint32(r.WindowSeconds), r.Kind, r.Host, uint16(r.GPUIndex), r.GPUUUID, r.GPUName, r.Samples,
			r.UtilAvg, r.UtilMax, r.MemUsedMax, r.MemTotal, r.PowerAvgW, r.PowerMaxW, r.EnergyJ, r.TempMaxC,
			r.SMClockAvg, r.Throttled, c.consumer, l.SeqThrough, l.FlushID, now); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the gpu_rollups batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into gpu_rollups: %w", len(rows), err)
	}
	return nil
}

// RowsOfFlush counts the rows a flush left in table, to settle an insert whose outcome is
// unknown (the connection broke after sending): a batch insert is one part, all or nothing.
func (c *ClickHouse) RowsOfFlush(ctx context.Context, table, flushID string) (uint64, error) {
	var n uint64
	q := "SELECT count() FROM " + table + " WHERE consumer = ? AND flush_id = ?"
	if err := c.conn.QueryRow(fullRead(ctx), q, c.consumer, flushID).Scan(&n); err != nil {
		return 0, fmt.Errorf("cannot count the rows of flush %s in %s: %w", flushID, table, err)
	}
	return n, nil
}

// RequestSeqsIn returns, in order, the stream positions of this consumer's stored requests in
// [lo, hi]: what an earlier attempt at a batch stored, all of it, none, or, through a
// Distributed table whose shards did not all take their rows, a part.
func (c *ClickHouse) RequestSeqsIn(ctx context.Context, lo, hi uint64) ([]uint64, error) {
	q := "SELECT stream_seq FROM requests WHERE consumer = ? AND stream_seq >= ? AND stream_seq <= ? ORDER BY stream_seq"
	rows, err := c.conn.Query(fullRead(ctx), q, c.consumer, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("cannot list stored requests: %w", err)
	}
	defer rows.Close()
	var seqs []uint64
	for rows.Next() {
		var seq uint64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("cannot list stored requests: %w", err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot list stored requests: %w", err)
	}
	return seqs, nil
}

// Done reads the ledger of table back: per window length and window start, the highest
// stream position whose events its rows cover, for rows past afterSeq (the consumer's ack
// floor). Rows of another length than today's are those of an earlier AGG_WINDOW: the events
// they cover are stored too.
func (c *ClickHouse) Done(ctx context.Context, table string, afterSeq uint64) (map[time.Duration]map[time.Time]uint64, error) {
	q := "SELECT window_seconds, window_start, max(seq_through) FROM " + table + " WHERE consumer = ? AND seq_through > ? GROUP BY window_seconds, window_start"
	rows, err := c.conn.Query(fullRead(ctx), q, c.consumer, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("cannot read the ledger of %s: %w", table, err)
	}
	defer rows.Close()
	done := map[time.Duration]map[time.Time]uint64{}
	for rows.Next() {
		var seconds uint32
		var start time.Time
		var seq uint64
		if err := rows.Scan(&seconds, &start, &seq); err != nil {
			return nil, fmt.Errorf("cannot read the ledger of %s: %w", table, err)
		}
		width := time.Duration(seconds) * time.Second
		if done[width] == nil {
			done[width] = map[time.Time]uint64{}
		}
		done[width][start.UTC()] = seq
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the ledger of %s: %w", table, err)
	}
	return done, nil
}

// StoredRequests returns, in order, the stream positions of this consumer's stored requests
// after afterSeq (the replay floor): the requests ledger. It lists what was stored, position
// by position, so a position that never reached the table — whatever the reason — is written
// when it comes again, and no high-water mark claims it.
func (c *ClickHouse) StoredRequests(ctx context.Context, afterSeq uint64) ([]uint64, error) {
	rows, err := c.conn.Query(fullRead(ctx), "SELECT stream_seq FROM requests WHERE consumer = ? AND stream_seq > ? ORDER BY stream_seq", c.consumer, afterSeq)
	if err != nil {
		return nil, fmt.Errorf("cannot read the requests ledger: %w", err)
	}
	defer rows.Close()
	var seqs []uint64
	for rows.Next() {
		var seq uint64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("cannot read the requests ledger: %w", err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the requests ledger: %w", err)
	}
	return seqs, nil
}
