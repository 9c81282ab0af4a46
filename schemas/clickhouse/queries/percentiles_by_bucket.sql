-- Segmented P50/P95/P99 of TTFT and TPOT (ms) per model × scene × input-token bucket over a
-- time range (segmented percentiles), so long prompts never pollute short ones.
-- Percentiles come from the windows' t-digest centroids merged in SQL — one digest per row
-- and metric, quantilesTDigestWeighted over the centroid arrays (the -Array combinator takes
-- means and weights pairwise) — never from averaging per-window percentiles. nan where a
-- bucket has no sample (only failed requests, say). Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT model, scene, bucket, n_requests,
    toFloat64(ttft[1]) AS ttft_p50, toFloat64(ttft[2]) AS ttft_p95, toFloat64(ttft[3]) AS ttft_p99,
    toFloat64(tpot[1]) AS tpot_p50, toFloat64(tpot[2]) AS tpot_p95, toFloat64(tpot[3]) AS tpot_p99
FROM
(
    SELECT model, scene, bucket, min(bucket_lo) AS lo, sum(requests) AS n_requests,
        quantilesTDigestWeightedArray(0.50, 0.95, 0.99)(ttft_means, ttft_weights) AS ttft,
        quantilesTDigestWeightedArray(0.50, 0.95, 0.99)(tpot_means, tpot_weights) AS tpot
    FROM token_rollups
    WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND layer = {layer:String}
    GROUP BY model, scene, bucket
)
ORDER BY model, scene, lo
