-- Segmented P50/P95/P99 of TTFT and TPOT (ms) per model × scene × input-token bucket over a
-- time range (segmented percentiles), so long prompts never pollute short ones.
-- Percentiles come from the windows' t-digest centroids merged in SQL, never from averaging
-- per-window percentiles. Parameters: from, to (DateTime).
SELECT model, scene, bucket, n_requests, ttft_p50, ttft_p95, ttft_p99, tpot_p50, tpot_p95, tpot_p99
FROM
(
    SELECT *
    FROM
    (
        SELECT model, scene, bucket, min(bucket_lo) AS lo, sum(requests) AS n_requests
        FROM token_rollups
        WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
        GROUP BY model, scene, bucket
    )
    ANY LEFT JOIN
    (
        SELECT model, scene, bucket,
            toFloat64(quantileTDigestWeighted(0.50)(m, w)) AS ttft_p50,
            toFloat64(quantileTDigestWeighted(0.95)(m, w)) AS ttft_p95,
            toFloat64(quantileTDigestWeighted(0.99)(m, w)) AS ttft_p99
        FROM token_rollups
        ARRAY JOIN ttft_means AS m, ttft_weights AS w
        WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
        GROUP BY model, scene, bucket
    ) USING (model, scene, bucket)
)
ANY LEFT JOIN
(
    SELECT model, scene, bucket,
        toFloat64(quantileTDigestWeighted(0.50)(m, w)) AS tpot_p50,
        toFloat64(quantileTDigestWeighted(0.95)(m, w)) AS tpot_p95,
        toFloat64(quantileTDigestWeighted(0.99)(m, w)) AS tpot_p99
    FROM token_rollups
    ARRAY JOIN tpot_means AS m, tpot_weights AS w
    WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
    GROUP BY model, scene, bucket
) USING (model, scene, bucket)
ORDER BY model, scene, lo
