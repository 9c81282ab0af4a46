-- One row per alert state change (firing, re-sent, resolved), written by the alerter.
-- labels is the alert's label set as a JSON object; the common labels have columns too.
CREATE TABLE IF NOT EXISTS alerts
(
    at              DateTime64(3, 'UTC'),
    fingerprint     String,
    rule            LowCardinality(String),
    state           LowCardinality(String),
    severity        LowCardinality(String),
    labels          String,
    env             LowCardinality(String),
    scene           LowCardinality(String),
    model           LowCardinality(String),
    bucket          LowCardinality(String),
    instance        LowCardinality(String),
    value           Float64,
    threshold       Float64,
    baseline_method LowCardinality(String),
    baseline_center Float64,
    baseline_spread Float64,
    window_start    DateTime,
    starts_at       DateTime,
    ends_at         DateTime,
    summary         String
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (rule, fingerprint, at)
TTL toDateTime(at) + INTERVAL 400 DAY
