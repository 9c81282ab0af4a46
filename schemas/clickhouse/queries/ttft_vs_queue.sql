-- The gateway's TTFT p95 beside the inference engine's queue, per minute and host: the
-- requests the proxy (or ingest) saw with instance = the host's gpuwatch name, their TTFT
-- p95 merged from the t-digest centroids, and the engines' queue on that host: queue depth
-- (mean over answered scrapes, weighted by them, and the highest reading) and the queue
-- time p95 in ms, read off the engines' histogram buckets summed over the minute and
-- interpolated within the bucket that holds the rank, as Prometheus's histogram_quantile
-- does (as fine as the buckets; 0 where no request left the queue). When TTFT rises with
-- the queue, requests wait for a batch slot; when it rises alone, look at prefill or the
-- network. The engines of one host must share bucket bounds (one engine kind per host, or
-- filter engine_rollups by name). The TTFT is the gateway layer's only: an engine layer's
-- token rollups are the same requests again. Parameters: from, to (DateTime).
SELECT
    minute,
    host,
    requests,
    ttft_p95_ms,
    queue_depth_avg,
    queue_depth_max,
    if(queue_n > 0, if(b > length(le), le[length(le)], lo + (le[b] - lo) * (rank - below) / c[b]), 0) * 1000 AS queue_p95_ms,
    queue_n AS queue_requests
FROM (
    SELECT minute, host, requests, ttft_p95_ms, queue_depth_avg, queue_depth_max, queue_n, c, le, rank, b,
        if(b <= 1, 0, le[b - 1]) AS lo, if(b <= 1, 0, cum[b - 1]) AS below
    FROM (
        SELECT minute, host, requests, ttft_p95_ms, queue_depth_avg, queue_depth_max, queue_n, c, le, cum, rank,
            arrayFirstIndex(x -> x >= rank, cum) AS b
        FROM (
            SELECT minute, host, requests, ttft_p95_ms, queue_depth_avg, queue_depth_max, queue_n, c, le,
                arrayCumSum(c) AS cum, 0.95 * arraySum(c) AS rank
            FROM (
                SELECT toDateTime(intDiv(toUInt32(window_start), 60) * 60) AS minute, instance AS host, sum(requests) AS requests,
                    toFloat64(quantileTDigestWeightedArrayIf(0.95)(ttft_means, ttft_weights, ttft_count > 0)) AS ttft_p95_ms
                FROM token_rollups
                WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND instance != '' AND layer = 'gateway'
                GROUP BY minute, host
                HAVING sum(ttft_count) > 0
            ) AS gateway ALL INNER JOIN (
                SELECT toDateTime(intDiv(toUInt32(window_start), 60) * 60) AS minute, host,
                    sum(queue_depth_avg * up_samples) / greatest(sum(up_samples), 1) AS queue_depth_avg,
                    max(queue_depth_max) AS queue_depth_max,
                    sum(queue_time_count) AS queue_n,
                    sumForEachIf(queue_time_counts, queue_time_count > 0) AS c,
                    anyIf(queue_time_le, queue_time_count > 0) AS le
                FROM engine_rollups
                WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
                GROUP BY minute, host
                HAVING sum(up_samples) > 0
            ) AS engine USING (minute, host)
        )
    )
)
ORDER BY host, minute
