-- Error rate and timeout rate side by side per model × scene: a timeout (no answer, or a
-- stream that stalled) is never counted as an error, and a client hanging up (canceled) is
-- neither. Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT
    model, scene,
    sum(requests) AS n_requests,
    sum(errors) / sum(requests) AS error_rate,
    sum(timeouts) / sum(requests) AS timeout_rate,
    sum(canceled) / sum(requests) AS canceled_rate,
    sum(rate_limited) / sum(requests) AS rate_limited_rate
FROM token_rollups
WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND layer = {layer:String}
GROUP BY model, scene
ORDER BY model, scene
