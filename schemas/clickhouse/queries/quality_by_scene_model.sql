-- Satisfaction and quality per scene and model of the rated requests: the share of thumbs
-- up, the mean rating, the mean evaluator quality score, and how many verdicts of each.
-- Verdicts (the verdicts view: feedback and the requests' inline scores) are joined to their
-- requests (verdicts.request_id = requests.event_id) and
-- deduplicated by event_id; those whose request is unknown are left out (see
-- feedback_coverage.sql). Parameters: layer (String: the layer of the requests read, gateway, engine or app), from, to (DateTime, of the rated requests).
SELECT
    scene,
    model,
    countIf(name = 'thumbs') AS thumbs,
    if(countIf(name = 'thumbs') = 0, 0, countIf(name = 'thumbs' AND value > 0) / countIf(name = 'thumbs')) AS thumbs_up,
    countIf(name = 'rating') AS ratings,
    if(countIf(name = 'rating') = 0, 0, sumIf(value, name = 'rating') / countIf(name = 'rating')) AS rating_avg,
    countIf(name = 'quality') AS quality_scores,
    if(countIf(name = 'quality') = 0, 0, sumIf(value, name = 'quality') / countIf(name = 'quality')) AS quality_avg
FROM
(
    SELECT request_id, any(name) AS name, any(value) AS value
    FROM verdicts
    WHERE request_id != '' AND ts >= {from:DateTime}
    GROUP BY event_id, request_id
) AS f
ANY LEFT JOIN
(
    SELECT event_id AS request_id, scene, model, 1 AS known
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String}
) AS r USING request_id
WHERE known = 1
GROUP BY scene, model
ORDER BY scene, model
