-- One row per window × env × scene × model × input bucket (× instance), or a correction of
-- one (kind = 'correction': events that arrived after their window was written, or a
-- window's remainder after a restart). Rows only ever add: plain sum() over any columns of
-- counts is right without FINAL. Latencies are in ms. Merge percentiles over any range with
-- quantilesTDigestWeighted over ARRAY JOIN of the centroid arrays, never by averaging.
-- consumer and seq_through are the aggregator's exactly-once ledger: every event of this
-- window with a stream sequence up to seq_through is counted in this or an earlier row.
CREATE TABLE IF NOT EXISTS token_rollups
(
    window_start        DateTime,
    window_seconds      UInt32,
    kind                LowCardinality(String),
    env                 LowCardinality(String),
    scene               LowCardinality(String),
    model               LowCardinality(String),
    instance            LowCardinality(String),
    bucket              LowCardinality(String),
    bucket_lo           UInt32,
    requests            UInt64,
    ok                  UInt64,
    errors              UInt64,
    timeouts            UInt64,
    canceled            UInt64,
    rate_limited        UInt64,
    late                UInt64,
    estimated           UInt64,
    unpriced            UInt64,
    input_tokens        UInt64,
    output_tokens       UInt64,
    cached_input_tokens UInt64,
    cost_usd            Float64,
    max_itl_ms          Float64,
    ttft_count          UInt64,
    ttft_min            Float64,
    ttft_max            Float64,
    ttft_p50            Float64,
    ttft_p90            Float64,
    ttft_p95            Float64,
    ttft_p99            Float64,
    ttft_means          Array(Float64),
    ttft_weights        Array(UInt64),
    tpot_count          UInt64,
    tpot_min            Float64,
    tpot_max            Float64,
    tpot_p50            Float64,
    tpot_p90            Float64,
    tpot_p95            Float64,
    tpot_p99            Float64,
    tpot_means          Array(Float64),
    tpot_weights        Array(UInt64),
    total_count          UInt64,
    total_min            Float64,
    total_max            Float64,
    total_p50            Float64,
    total_p90            Float64,
    total_p95            Float64,
    total_p99            Float64,
    total_means          Array(Float64),
    total_weights        Array(UInt64),
    consumer            LowCardinality(String),
    seq_through         UInt64,
    flush_id            String,
    written_at          DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (env, scene, model, bucket, window_start)
TTL toDateTime(window_start) + INTERVAL 400 DAY
