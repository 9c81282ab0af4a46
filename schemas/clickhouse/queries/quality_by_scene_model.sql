-- Satisfaction and quality per scene and model: the share of thumbs up, the mean rating,
-- the mean evaluator quality score, and how many verdicts of each. Verdicts (the verdicts
-- view: feedback and the requests' inline scores) on a request are joined to it
-- (verdicts.request_id = requests.event_id); verdicts on a conversation only (request_id
-- empty) are joined to its requests by env and conversation_id (a conversation is both, as in
-- conversations.sql; a verdict without env counts for the one env whose requests carry its
-- conversation_id, and for none where two envs do: among the requests read, 7 days either
-- side of the range, so a wider range can find the id in a second env and leave out a
-- verdict a narrower one counts; feedback_coverage.sql counts those left out, as
-- conversation_env_ambiguous), and count for the scene of its first
-- request and the model of its last request (of the least and the greatest event_id among
-- those of the same ts), in the range of its first request only, as conversations.sql counts it (its requests up to 7 days
-- after to count; requests are read from 7 days before from), so that a conversation's
-- rating is never counted in two ranges. The latest verdict of each source on a request or
-- conversation counts: one sent twice counts once, and one changed (sent again under an
-- event_id of its own) counts with its last value only. Verdicts whose request or
-- conversation is unknown are left out (feedback_coverage.sql counts those on an unknown
-- request as unknown_request, those on an unknown conversation as conversation_unknown). ANY LEFT JOIN keeps
-- every verdict of a request on every engine. Parameters: layer (String: the layer of the
-- requests read, gateway, engine or app), from, to (DateTime, of the rated requests).
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
    SELECT scene, model, name, value
    FROM
    (
        -- the latest: of equal ts (whole seconds on 18.16), the greatest event_id (UUIDv7 ids sort
        -- by time); verdicts given up to 7 days after to count, as the business view says
        SELECT request_id, name, argMax(value, (ts, event_id)) AS value
        FROM verdicts
        WHERE request_id != '' AND ts >= {from:DateTime} AND ts < {to:DateTime} + INTERVAL 7 DAY
        GROUP BY request_id, name, source
    ) AS f
    ANY LEFT JOIN
    (
        SELECT event_id AS request_id, scene, model, 1 AS known
        FROM requests
        WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String}
    ) AS r USING request_id
    WHERE known = 1
    UNION ALL
    SELECT scene, model, name, value
    FROM
    (
        -- the latest: of equal ts (whole seconds on 18.16), the greatest event_id (UUIDv7 ids sort
        -- by time); verdicts given up to 7 days after to count, as the business view says
        SELECT env, conversation_id, name, argMax(value, (ts, event_id)) AS value
        FROM
        (
            -- a verdict without env (its sender did not know it) rates the conversation of its
            -- id in the one env that has it; where two envs have it, neither
            SELECT if(verdict_env != '', verdict_env, only_env) AS env, conversation_id, name, value, source, ts, event_id
            FROM
            (
                SELECT env AS verdict_env, conversation_id, name, value, source, ts, event_id
                FROM verdicts
                WHERE request_id = '' AND conversation_id != '' AND ts >= {from:DateTime} AND ts < {to:DateTime} + INTERVAL 7 DAY
            ) AS v
            ANY LEFT JOIN
            (
                SELECT conversation_id, any(env) AS only_env
                FROM requests
                WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} + INTERVAL 7 DAY
                    AND layer = {layer:String} AND conversation_id != ''
                GROUP BY conversation_id
                HAVING uniqExact(env) = 1
            ) AS e USING conversation_id
        )
        GROUP BY env, conversation_id, name, source
    ) AS f
    ANY LEFT JOIN
    (
        SELECT env, conversation_id, argMin(scene, (ts, event_id)) AS scene, argMax(model, (ts, event_id)) AS model, 1 AS known
        FROM requests
        WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} + INTERVAL 7 DAY
            AND layer = {layer:String} AND conversation_id != ''
        GROUP BY env, conversation_id
        HAVING min(ts) >= {from:DateTime} AND min(ts) < {to:DateTime}
    ) AS c USING (env, conversation_id)
    WHERE known = 1
)
GROUP BY scene, model
ORDER BY scene, model
