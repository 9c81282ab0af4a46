-- One row per window × host × GPU (or a correction of one, like token_rollups). energy_j is
-- the energy used in the window: the sum of its samples' energy_used_j (gpuwatch's counter
-- delta since the GPU's previous sample, so plain sum() over windows and corrections is
-- exact across restarts); a sample without energy_used_j adds its counter's delta since the
-- GPU's previous sample, and a GPU without a counter its power integrated over the interval.
CREATE TABLE IF NOT EXISTS gpu_rollups
(
    window_start      DateTime,
    window_seconds    UInt32,
    kind              LowCardinality(String),
    host              LowCardinality(String),
    gpu_index         UInt16,
    gpu_uuid          LowCardinality(String),
    gpu_name          LowCardinality(String),
    samples           UInt64,
    util_avg          Float64,
    util_max          Float64,
    mem_used_max      UInt64,
    mem_total         UInt64,
    power_avg_w       Float64,
    power_max_w       Float64,
    energy_j          Float64,
    temp_max_c        Float64,
    sm_clock_avg_mhz  Float64,
    throttled_samples UInt64,
    consumer          LowCardinality(String),
    seq_through       UInt64,
    flush_id          String,
    written_at        DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (host, gpu_index, window_start)
TTL toDateTime(window_start) + INTERVAL 400 DAY
