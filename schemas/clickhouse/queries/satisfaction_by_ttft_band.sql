-- User satisfaction by the TTFT band of the request each verdict rates (<= 500 ms, <= 2 s,
-- <= 5 s, > 5 s: the design's thresholds). Verdicts are read from the verdicts view: the
-- feedback table and the requests' own inline scores (each one verdict of source app on its
-- request). A verdict is joined to its request at query time (verdicts.request_id =
-- requests.event_id; ANY LEFT JOIN keeps every verdict of a request on every engine), so
-- one given hours later still counts
-- for the request's band; verdicts whose request is unknown are left out here (see
-- feedback_coverage.sql). The latest verdict of each source on a request counts: one sent
-- twice counts once, and one changed (sent again under an event_id of its own) counts with
-- its last value only.
-- satisfied is the share of verdicts with value >= satisfied_at (1 for thumbs, 4 for a
-- 1–5 rating). Parameters: layer (String: the layer of the requests read, gateway, engine or app), from, to (DateTime, of the rated requests), name (String,
-- e.g. thumbs), satisfied_at (Float64).
SELECT
    multiIf(ttft_ms <= 500, '1: <= 500 ms', ttft_ms <= 2000, '2: <= 2 s', ttft_ms <= 5000, '3: <= 5 s', '4: > 5 s') AS ttft_band,
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
    SELECT event_id AS request_id, ttft_ms, 1 AS known
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String}
) AS r USING request_id
WHERE known = 1
GROUP BY ttft_band
ORDER BY ttft_band
