-- Retries: a conversation repeating a turn after that turn timed out or failed — the user
-- (or the app) asking again. Per scene: turns attempted more than once after a timeout or
-- an error, the conversations that had one, and the share of conversations with a retry.
-- A conversation is its env and conversation_id, as in conversations.sql: the same id's turn in
-- two envs is two turns, neither a retry of the other. A turn's first request is the earliest (of
-- equal ts, whole seconds on 18.16, the least event_id: UUIDv7 ids sort by time). Parameters: layer (String: the layer of the requests read, gateway, engine or app), from, to (DateTime).
SELECT
    scene,
    uniqExact(env, conversation_id) AS conversations,
    countIf(retried = 1) AS retried_turns,
    uniqExactIf(env, conversation_id, retried = 1) AS conversations_with_retry,
    uniqExactIf(env, conversation_id, retried = 1) / uniqExact(env, conversation_id) AS retry_rate
FROM
(
    SELECT
        env,
        conversation_id,
        any(scene) AS scene,
        turn,
        if(count() > 1 AND argMin(status, (ts, event_id)) IN ('timeout', 'error'), 1, 0) AS retried
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND layer = {layer:String} AND conversation_id != '' AND turn > 0
    GROUP BY env, conversation_id, turn
)
GROUP BY scene
ORDER BY scene
