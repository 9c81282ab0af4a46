-- Token throughput per minute and model: output tokens/s (what users see streaming) and
-- input tokens/s (prefill load). Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT
    toStartOfMinute(window_start) AS minute,
    model,
    sum(output_tokens) / 60 AS output_tokens_per_s,
    sum(input_tokens) / 60 AS input_tokens_per_s,
    sum(requests) AS n_requests
FROM token_rollups
WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND layer = {layer:String}
GROUP BY minute, model
ORDER BY minute, model
