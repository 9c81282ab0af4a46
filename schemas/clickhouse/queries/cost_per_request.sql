-- Cost in USD per model × scene, and per request (AGG_PRICES; unpriced counts requests of
-- models missing from the price table). Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT
    model, scene,
    sum(requests) AS n_requests,
    sum(cost_usd) AS total_cost_usd,
    sum(cost_usd) / sum(requests) AS cost_per_request_usd,
    sum(unpriced) AS unpriced_requests
FROM token_rollups
WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND layer = {layer:String}
GROUP BY model, scene
ORDER BY model, scene
