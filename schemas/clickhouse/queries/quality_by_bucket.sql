-- Quality percentiles per model × scene × input bucket: P10, P50 and P90 (exact) of the
-- verdicts named name (quality, rating, …) on the requests of the range, with how many
-- verdicts each holds. Verdicts (the verdicts view: feedback and the requests' inline
-- scores) are joined to their requests (verdicts.request_id = requests.event_id), given
-- up to 7 days after to; the latest verdict of each source on a request counts (a changed one with
-- its last value only); verdicts on a conversation only, or whose request is unknown, are
-- left out (see quality_by_scene_model.sql, feedback_coverage.sql). ANY LEFT JOIN keeps
-- every verdict of a request on every engine. Parameters: layer (String: the layer of the
-- requests read, gateway, engine or app), from, to (DateTime, of the rated requests), name
-- (String, e.g. quality).
SELECT
    model,
    scene,
    bucket,
    count() AS verdicts,
    quantileExact(0.1)(value) AS value_p10,
    quantileExact(0.5)(value) AS value_p50,
    quantileExact(0.9)(value) AS value_p90
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
    SELECT event_id AS request_id, model, scene, bucket, 1 AS known
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String}
) AS r USING request_id
WHERE known = 1
GROUP BY model, scene, bucket
ORDER BY model, scene, bucket
