-- The aggregator's rollup messages, one row per message as it is published on ROLLUPS
-- (subject, Nats-Msg-Id, JSON), stored for each flush in one insert before the flush's rows.
-- A flush whose rows are stored but whose messages JetStream had not acknowledged when the
-- aggregator stopped (killed, or NATS away) is published again from here at the next start,
-- under the same message ids. flush_seq numbers a consumer's flushes of one stream in order;
-- the aggregator keeps the last one JetStream acknowledged in its NATS bucket. Rows are
-- needed only until then: the aggregator drops a day's partition once every flush in it is
-- acknowledged. No TTL: it would drop a flush still waiting for its aggregator to start.
CREATE TABLE IF NOT EXISTS rollup_outbox
(
    consumer    LowCardinality(String),
    stream      LowCardinality(String),
    flush_id    String,
    flush_seq   UInt64,
    seq_through UInt64,
    msg_id      String,
    subject     String,
    data        String,
    written_at  DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(written_at)
ORDER BY (consumer, stream, flush_seq)
