-- One row per alert state change (firing, re-sent, resolved), written by the alerter.
-- labels is the alert's label set as a JSON object; the common labels have columns too.
CREATE TABLE IF NOT EXISTS alerts
(
    at              {{dt64 3}},
    fingerprint     String,
    rule            {{lc "String"}},
    state           {{lc "String"}},
    severity        {{lc "String"}},
    labels          String,
    env             {{lc "String"}},
    scene           {{lc "String"}},
    model           {{lc "String"}},
    bucket          {{lc "String"}},
    instance        {{lc "String"}},
    value           Float64,
    threshold       Float64,
    baseline_method {{lc "String"}},
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
{{ttl "at" 400}}
