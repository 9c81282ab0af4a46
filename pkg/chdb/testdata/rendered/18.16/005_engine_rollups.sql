-- One row per window × host × engine endpoint (name) × model, or a correction of one
-- (kind = 'correction': samples that arrived after their window was written), like
-- gpu_rollups. Rows only ever add: counts and the counter sums (tokens, prefix-cache queries
-- and hits, preemptions) are right with plain sum() without FINAL; the *_avg gauges merge
-- weighted by up_samples. The prefix-cache hit rate of any range is
-- sum(prefix_cache_hits) / sum(prefix_cache_queries). Histograms (seconds) keep their
-- bounds (*_le) and per-bucket counts (*_counts, not cumulative, one more than the bounds,
-- the last above the highest bound), so any range of rows with the same bounds merges with
-- sumForEach(*_counts); *_p50/p95/p99 are interpolated within buckets as Prometheus's
-- histogram_quantile does. consumer and seq_through are the aggregator's exactly-once
-- ledger, as in token_rollups.
CREATE TABLE IF NOT EXISTS engine_rollups
(
    window_start            DateTime,
    window_seconds          UInt32,
    kind                    String,
    host                    String,
    engine                  String,
    name                    String,
    model                   String,
    samples                 UInt64,
    up_samples              UInt64,
    down_samples            UInt64,
    queue_depth_avg         Float64,
    queue_depth_max         Float64,
    running_avg             Float64,
    running_max             Float64,
    kv_cache_usage_avg      Float64,
    kv_cache_usage_max      Float64,
    cache_hit_rate_avg      Float64,
    prefix_cache_queries    Float64,
    prefix_cache_hits       Float64,
    preemptions             Float64,
    prompt_tokens           Float64,
    generation_tokens       Float64,
    prompt_tokens_per_s     Float64,
    generation_tokens_per_s Float64,
    queue_time_le           Array(Float64),
    queue_time_counts       Array(Float64),
    queue_time_sum          Float64,
    queue_time_count        Float64,
    queue_time_p50          Float64,
    queue_time_p95          Float64,
    queue_time_p99          Float64,
    ttft_le                 Array(Float64),
    ttft_counts             Array(Float64),
    ttft_sum                Float64,
    ttft_count              Float64,
    ttft_p50                Float64,
    ttft_p95                Float64,
    ttft_p99                Float64,
    prefill_le              Array(Float64),
    prefill_counts          Array(Float64),
    prefill_sum             Float64,
    prefill_count           Float64,
    prefill_p50             Float64,
    prefill_p95             Float64,
    prefill_p99             Float64,
    decode_le               Array(Float64),
    decode_counts           Array(Float64),
    decode_sum              Float64,
    decode_count            Float64,
    decode_p50              Float64,
    decode_p95              Float64,
    decode_p99              Float64,
    consumer                String,
    seq_through             UInt64,
    flush_id                String,
    written_at              DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (host, engine, name, model, window_start)

