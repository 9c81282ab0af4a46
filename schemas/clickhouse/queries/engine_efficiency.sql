-- Efficiency where the work is done, per host and window: the inference engines' own token
-- throughput, from their counters (so it holds for traffic that never passed through the
-- proxy), ÷ the host's mean GPU utilisation (%, over its GPUs, weighted by samples), and
-- tokens per joule of the GPUs' energy. Every engine and model on the host adds up; the GPU
-- side needs gpu_rollups of the same window length. 0 where the GPUs report no utilisation
-- or no energy. Parameters: from, to (DateTime).
SELECT
    window_start,
    host,
    generation_tokens,
    generation_tokens + prompt_tokens AS total_tokens,
    generation_tokens / seconds AS generation_tokens_per_s,
    (generation_tokens + prompt_tokens) / seconds AS total_tokens_per_s,
    gpus,
    util_pct AS gpu_util_pct,
    energy_j,
    if(util_pct > 0, generation_tokens / seconds / util_pct, 0) AS generation_tokens_per_s_per_util_pct,
    if(util_pct > 0, (generation_tokens + prompt_tokens) / seconds / util_pct, 0) AS total_tokens_per_s_per_util_pct,
    if(energy_j > 0, generation_tokens / energy_j, 0) AS generation_tokens_per_joule,
    if(energy_j > 0, (generation_tokens + prompt_tokens) / energy_j, 0) AS total_tokens_per_joule
FROM (
    SELECT window_start, host, seconds, generation_tokens, prompt_tokens, gpus, util_pct, energy_j FROM (
        SELECT window_start, host, max(window_seconds) AS seconds,
            sum(generation_tokens) AS generation_tokens, sum(prompt_tokens) AS prompt_tokens
        FROM engine_rollups
        WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
        GROUP BY window_start, host
    ) AS engine_side ALL INNER JOIN (
        SELECT window_start, host, uniqExact(gpu_index) AS gpus,
            sum(util_avg * samples) / greatest(sum(samples), 1) AS util_pct, sum(energy_j) AS energy_j
        FROM gpu_rollups
        WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
        GROUP BY window_start, host
    ) AS gpu_side USING (window_start, host)
)
ORDER BY host, window_start
