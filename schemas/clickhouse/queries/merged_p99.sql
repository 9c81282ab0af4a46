-- P99 and P99.9 of TTFT (ms) for one model over any range of windows — an hour, a day, a
-- week — merged from the t-digest centroids: quantilesTDigestWeighted over the means and
-- weights arrays, both levels from one digest. Parameters: from, to (DateTime), model (String), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT samples, toFloat64(q[1]) AS ttft_p99, toFloat64(q[2]) AS ttft_p999
FROM
(
    SELECT sum(arraySum(ttft_weights)) AS samples,
        quantilesTDigestWeightedArray(0.99, 0.999)(ttft_means, ttft_weights) AS q
    FROM token_rollups
    WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND model = {model:String} AND layer = {layer:String}
)
