-- One row per window × env × scene × model × name × source of feedback, by the time the
-- verdicts were given (or a correction of one, like token_rollups): count, sum, how many
-- were positive (value > 0: thumbs up, a task completed) and the t-digest of the values as
-- centroid arrays, mergeable over any range. env, scene and model are what the feedback
-- events carried (empty when they did not); the rated request's own labels are joined in
-- SQL (schemas/clickhouse/queries). Exactly once, and right with plain sum(), as the other
-- rollups.
CREATE TABLE IF NOT EXISTS feedback_rollups
(
    window_start   DateTime,
    window_seconds UInt32,
    kind           LowCardinality(String),
    env            LowCardinality(String),
    scene          LowCardinality(String),
    model          LowCardinality(String),
    name           LowCardinality(String),
    source         LowCardinality(String),
    count          UInt64,
    positive       UInt64,
    late           UInt64,
    sum            Float64,
    value_min      Float64,
    value_max      Float64,
    value_p50      Float64,
    value_p90      Float64,
    value_means    Array(Float64),
    value_weights  Array(UInt64),
    consumer       LowCardinality(String),
    seq_through    UInt64,
    flush_id       String,
    written_at     DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (env, scene, name, window_start)
TTL toDateTime(window_start) + INTERVAL 400 DAY
