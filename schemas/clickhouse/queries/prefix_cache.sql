-- Prefix-cache hit rate per model: cached input tokens ÷ input tokens.
-- Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT
    model,
    sum(cached_input_tokens) AS cached_tokens,
    sum(input_tokens) AS all_input_tokens,
    if(sum(input_tokens) = 0, 0, sum(cached_input_tokens) / sum(input_tokens)) AS cache_hit_rate
FROM token_rollups
WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND layer = {layer:String}
GROUP BY model
ORDER BY model
