-- Cost and length of each conversation (requests carrying conversation_id), most expensive
-- first. A conversation belongs to the range of its first request and counts whole: its
-- requests up to 7 days after to count too, and one whose first request lies before from is
-- left to that range. Requests are read from 7 days before from: a conversation silent for
-- longer than that before the range counts as starting in it. turns counts the distinct
-- turn numbers the requests carry (the X-Tokenscope-Turn header, or the event's turn), and
-- each request without one as a turn of its own. Parameters: from, to (DateTime), limit
-- (UInt32), layer (String: gateway, engine or app; the same requests seen at two layers
-- are never summed).
-- A conversation is its env and conversation_id: the same id in two envs (staging numbering
-- its conversations as prod does) is two conversations; one id's requests in two scenes are
-- one conversation (a chat whose turns call a search scene), each row naming its env.
SELECT
    env,
    conversation_id,
    count() AS requests,
    uniqExactIf(turn, turn > 0) + countIf(turn = 0) AS turns,
    sum(cost_usd) AS cost_usd,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens
FROM requests
WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} + INTERVAL 7 DAY
    AND conversation_id != '' AND layer = {layer:String}
GROUP BY env, conversation_id
HAVING min(ts) >= {from:DateTime} AND min(ts) < {to:DateTime}
ORDER BY cost_usd DESC, env, conversation_id
LIMIT {limit:UInt32}
