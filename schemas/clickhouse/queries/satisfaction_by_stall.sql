-- User satisfaction by the longest gap between two streamed tokens (max_itl_ms) of the
-- rated request: a stream that stalls loses users even when its first token was fast.
-- Bands: no gap measured (not streamed), <= 100 ms, <= 500 ms, <= 2 s, > 2 s. Read from the verdicts
-- view (feedback and inline scores), joined as satisfaction_by_ttft_band.sql, the latest verdict of each source on a request counting. Parameters: layer (String: the layer of the requests read, gateway, engine or app), from, to (DateTime), name
-- (String), satisfied_at (Float64).
SELECT
    multiIf(max_itl_ms = 0, '0: not streamed', max_itl_ms <= 100, '1: <= 100 ms', max_itl_ms <= 500, '2: <= 500 ms',
            max_itl_ms <= 2000, '3: <= 2 s', '4: > 2 s') AS stall_band,
    count() AS verdicts,
    avg(value >= {satisfied_at:Float64}) AS satisfied,
    avg(value) AS mean_value
FROM
(
    -- the latest: of equal ts (whole seconds on 18.16), the greatest event_id (UUIDv7 ids sort
    -- by time); verdicts given up to 7 days after to count, as the business view says
    SELECT request_id, argMax(value, (ts, event_id)) AS value
    FROM verdicts
    WHERE name = {name:String} AND request_id != '' AND ts >= {from:DateTime} AND ts < {to:DateTime} + INTERVAL 7 DAY
    GROUP BY request_id, source
) AS f
ANY LEFT JOIN
(
    SELECT event_id AS request_id, max_itl_ms, 1 AS known
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String}
) AS r USING request_id
WHERE known = 1
GROUP BY stall_band
ORDER BY stall_band
