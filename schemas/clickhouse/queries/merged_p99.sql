-- P99 and P99.9 of TTFT (ms) for one model over any range of windows — an hour, a day, a
-- week — merged from the t-digest centroids. Parameters: from, to (DateTime), model (String).
SELECT
    sum(w) AS samples,
    toFloat64(quantileTDigestWeighted(0.99)(m, w)) AS ttft_p99,
    toFloat64(quantileTDigestWeighted(0.999)(m, w)) AS ttft_p999
FROM token_rollups
ARRAY JOIN ttft_means AS m, ttft_weights AS w
WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND model = {model:String}
