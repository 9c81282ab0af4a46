-- One row per alert state change (firing, re-sent, resolved), written by the alerter.
-- labels is the alert's label set as a JSON object; the common labels have columns too.
CREATE TABLE IF NOT EXISTS alerts
(
    at              DateTime,
    fingerprint     String,
    rule            String,
    state           String,
    severity        String,
    labels          String,
    env             String,
    scene           String,
    model           String,
    bucket          String,
    instance        String,
    value           Float64,
    threshold       Float64,
    baseline_method String,
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

