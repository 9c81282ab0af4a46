-- The business layer: average turns per conversation, and task completion rate — the
-- share of conversations whose outcome (sent by the app on the last request) is
-- 'completed' among those with an outcome. Parameters: from, to (DateTime), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed). With no
-- conversation in the range: 0 conversations, avg_turns 0 and completion_rate 0.
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
        max(turn) AS turns,
        anyIf(outcome, outcome != '') AS outcome
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND conversation_id != '' AND layer = {layer:String}
    GROUP BY conversation_id
)
