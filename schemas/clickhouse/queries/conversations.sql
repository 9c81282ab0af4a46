-- The business layer: average turns per conversation, and task completion rate — the
-- share of conversations whose outcome (sent by the app, the last one reported counts; of
-- equal ts, whole seconds on 18.16, the greatest event_id) is 'completed' among those with an
-- outcome. A conversation belongs to the range of its first
-- request and counts whole: its requests up to 7 days after to count too, and one whose
-- first request lies before from is left to that range. Requests are read from 7 days
-- before from: a conversation silent for longer than that before the range counts as
-- starting in it. turns counts the distinct turn numbers the requests carry (the
-- X-Tokenscope-Turn header, or the event's turn), and each request without one as a turn of
-- its own. Parameters: from, to (DateTime), layer (String: gateway, engine or app; the same
-- requests seen at two layers are never summed). avg_turns is 0 when no conversation started.
-- A conversation is its env and conversation_id: the same id in two envs (staging numbering
-- its conversations as prod does) is two conversations; one id's requests in two scenes are
-- one conversation (a chat whose turns call a search scene).
SELECT
    count() AS conversations,
    if(count() = 0, 0, avg(turns)) AS avg_turns,
    countIf(outcome = 'completed') AS completed,
    countIf(outcome = 'abandoned') AS abandoned,
    if(countIf(outcome != '') = 0, 0, countIf(outcome = 'completed') / countIf(outcome != '')) AS completion_rate
FROM
(
    SELECT
        conversation_id,
        uniqExactIf(turn, turn > 0) + countIf(turn = 0) AS turns,
        argMaxIf(outcome, (ts, event_id), outcome != '') AS outcome
    FROM requests
    WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} + INTERVAL 7 DAY
        AND conversation_id != '' AND layer = {layer:String}
    GROUP BY env, conversation_id
    HAVING min(ts) >= {from:DateTime} AND min(ts) < {to:DateTime}
)
