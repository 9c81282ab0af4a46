-- Cost per conversation and per satisfied conversation, per scene: what a happy user
-- costs. A conversation is satisfied when its verdicts named name (thumbs, rating, …) on
-- any of its requests or on the conversation itself average at least satisfied_at;
-- conversations without such a verdict are counted apart (unrated). Verdicts (the verdicts
-- view: feedback and the requests' inline scores): the latest verdict of each source on a
-- request or conversation counts (one sent twice counts once, a changed one with its last
-- value only). Conversations are counted whole, in the range of their first request, as in
-- conversations.sql (their requests up to 7 days after to count; requests are read from 7
-- days before from). Parameters: layer (String: the layer of the requests read, gateway,
-- engine or app), from, to (DateTime: the range the conversations start in), name (String),
-- satisfied_at (Float64).
-- A conversation is its env and conversation_id (as in conversations.sql), counted for the
-- scene of its first request (of the least event_id among those of the same ts). A verdict
-- on a request rates its request's conversation (the request's env and conversation_id, or
-- the verdict's conversation_id where it names one); a verdict on a
-- conversation only, that conversation in the verdict's env; one without env (its sender did
-- not know it), the conversation of its id in the one env that has it, and none where two
-- envs do (among the requests read, 7 days either side of the range: a wider range can find
-- the id in a second env and leave out a verdict a narrower one counts; feedback_coverage.sql
-- counts those left out, as conversation_env_ambiguous: give a conversation verdict its env).
SELECT
    scene,
    count() AS conversations,
    sum(cost_usd) / count() AS cost_per_conversation,
    countIf(rated = 1) AS rated_conversations,
    countIf(rated = 1 AND verdict >= {satisfied_at:Float64}) AS satisfied_conversations,
    if(countIf(rated = 1 AND verdict >= {satisfied_at:Float64}) = 0, 0,
       sumIf(cost_usd, rated = 1) / countIf(rated = 1 AND verdict >= {satisfied_at:Float64})) AS cost_per_satisfied_conversation
FROM
(
    SELECT conversation_id, scene, cost_usd, if(verdicts > 0, 1, 0) AS rated, verdict
    FROM
    (
        SELECT env, conversation_id, argMin(scene, (ts, event_id)) AS scene, sum(cost_usd) AS cost_usd
        FROM requests
        WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} + INTERVAL 7 DAY
            AND layer = {layer:String} AND conversation_id != ''
        GROUP BY env, conversation_id
        HAVING min(ts) >= {from:DateTime} AND min(ts) < {to:DateTime}
    ) AS c
    ANY LEFT JOIN
    (
        SELECT env, conversation_id, count() AS verdicts, avg(value) AS verdict
        FROM
        (
            -- the latest: of equal ts (whole seconds on 18.16), the greatest event_id (UUIDv7 ids sort
            -- by time); verdicts given up to 7 days after to count, as the business view says
            SELECT request_id, env, conversation_id, argMax(value, (ts, event_id)) AS value
            FROM
            (
                -- a verdict without env (its sender did not know it) rates the conversation of its
                -- id in the one env that has it; where two envs have it, neither
                SELECT request_id, if(verdict_env != '', verdict_env, only_env) AS env, conversation_id, value, source, ts, event_id
                FROM
                (
                    -- a verdict on a request rates its request's conversation, in its request's env
                    SELECT request_id, if(known = 1, req_env, fb_env) AS verdict_env,
                        if(fb_conversation != '', fb_conversation, req_conversation) AS conversation_id, value, source, ts, event_id
                    FROM
                    (
                        SELECT request_id, env AS fb_env, conversation_id AS fb_conversation, value, source, ts, event_id
                        FROM verdicts
                        WHERE name = {name:String} AND ts >= {from:DateTime} AND ts < {to:DateTime} + INTERVAL 7 DAY
                    ) AS f
                    ANY LEFT JOIN
                    (
                        SELECT event_id AS request_id, env AS req_env, conversation_id AS req_conversation, 1 AS known
                        FROM requests
                        WHERE ts >= {from:DateTime} AND ts < {to:DateTime} + INTERVAL 7 DAY
                            AND layer = {layer:String} AND conversation_id != ''
                    ) AS r USING request_id
                ) AS fr
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
            WHERE conversation_id != ''
            GROUP BY request_id, env, conversation_id, source
        )
        GROUP BY env, conversation_id
    ) AS v USING (env, conversation_id)
)
GROUP BY scene
ORDER BY scene
