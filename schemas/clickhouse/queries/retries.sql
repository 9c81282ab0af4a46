-- Retries: a conversation repeating a turn after that turn timed out or failed — the user
-- (or the app) asking again. Per scene: turns attempted more than once after a timeout or
-- an error, the conversations that had one, and the share of conversations with a retry.
-- A conversation is its env and conversation_id, as in conversations.sql: the same id's turn in
-- two envs is two turns, neither a retry of the other. A conversation counts for the scene of
-- its first request with a turn in the range (its retried turns with it, whatever scene they
-- were asked again in). A turn's first request is the earliest (of
-- equal ts, whole seconds on 18.16, the least event_id: UUIDv7 ids sort by time). Parameters: layer (String: the layer of the requests read, gateway, engine or app), from, to (DateTime).
SELECT
    scene,
    count() AS conversations,
    sum(turns_retried) AS retried_turns,
    countIf(turns_retried > 0) AS conversations_with_retry,
    countIf(turns_retried > 0) / count() AS retry_rate
FROM
(
    -- a conversation counts once, for the scene of its first request (a chat whose turns
    -- call a search scene is the chat's), as in cost_per_satisfied_conversation.sql
    SELECT env, conversation_id, argMin(turn_scene, (first_ts, first_id)) AS scene, sum(retried) AS turns_retried
    FROM
    (
        SELECT
            env,
            conversation_id,
            turn,
            min(ts) AS first_ts,
            argMin(event_id, (ts, event_id)) AS first_id,
            argMin(scene, (ts, event_id)) AS turn_scene,
            if(count() > 1 AND argMin(status, (ts, event_id)) IN ('timeout', 'error'), 1, 0) AS retried
        FROM requests
        WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String} AND conversation_id != '' AND turn > 0
        GROUP BY env, conversation_id, turn
    )
    GROUP BY env, conversation_id
)
GROUP BY scene
ORDER BY scene
