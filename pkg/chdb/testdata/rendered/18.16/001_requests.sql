-- One row per valid request event, written by the aggregator (AGG_STORE_REQUESTS).
-- The template calls lc, dt64 and ttl are filled in by the migrator according to the
-- server: LowCardinality, DateTime64 and TTL where the server has them, plain types where
-- it does not (Debian's ClickHouse 18.16).
CREATE TABLE IF NOT EXISTS requests
(
    ts                  DateTime,
    event_id            String,
    env                 String,
    scene               String,
    model               String,
    instance            String,
    tenant              String,
    provider            String,
    bucket              String,
    input_tokens        UInt32,
    output_tokens       UInt32,
    cached_input_tokens UInt32,
    tokens_estimated    UInt8,
    ttft_ms             Float64,
    total_ms            Float64,
    tpot_ms             Nullable(Float64),
    max_itl_ms          Float64,
    queue_ms            Float64,
    status              String,
    error_code          String,
    http_status         UInt16,
    stream              UInt8,
    conversation_id     String,
    turn                UInt32,
    outcome             String,
    cost_usd            Float64,
    consumer            String,
    stream_seq          UInt64
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (env, scene, model, ts)

