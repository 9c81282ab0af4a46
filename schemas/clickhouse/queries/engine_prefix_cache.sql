-- The engines' prefix-cache hit rate beside the gateway's, per host: the engines count the
-- prompt tokens they looked up and found in their prefix cache (vLLM's
-- prefix_cache_queries and prefix_cache_hits; hit rate = hits ÷ queries over the range,
-- never an average of per-window rates); the gateway sees the cached_input_tokens the
-- provider reported, ÷ input_tokens, of the requests with instance = the host. The two
-- differ where the engine caches what the API does not report, or the gateway sees traffic
-- the engine does not (and the other way round). SGLang exports only a ratio: its mean,
-- weighted by answered scrapes, is engine_hit_rate_gauge. The gateway's side reads the gateway
-- layer only: an engine layer's token rollups are the same requests again. Parameters: from,
-- to (DateTime).
SELECT
    host,
    engine_queries,
    engine_hits,
    if(engine_queries > 0, engine_hits / engine_queries, 0) AS engine_hit_rate,
    engine_hit_rate_gauge,
    gateway_requests,
    gateway_input_tokens,
    gateway_cached_tokens,
    if(gateway_input_tokens > 0, gateway_cached_tokens / gateway_input_tokens, 0) AS gateway_cached_share
FROM (
    SELECT host, sum(prefix_cache_queries) AS engine_queries, sum(prefix_cache_hits) AS engine_hits,
        sum(cache_hit_rate_avg * up_samples) / greatest(sum(up_samples), 1) AS engine_hit_rate_gauge
    FROM engine_rollups
    WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
    GROUP BY host
    HAVING sum(up_samples) > 0
) AS engine ALL INNER JOIN (
    SELECT instance AS host, sum(requests) AS gateway_requests, sum(input_tokens) AS gateway_input_tokens,
        sum(cached_input_tokens) AS gateway_cached_tokens
    FROM token_rollups
    WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime} AND instance != '' AND layer = 'gateway'
    GROUP BY host
) AS gateway USING (host)
ORDER BY host
