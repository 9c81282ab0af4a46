-- Cost and length of each conversation (requests carrying conversation_id), most expensive
-- first. Parameters: from, to (DateTime), limit (UInt32), layer (String:
-- gateway, engine or app; the same requests seen at two layers are never summed).
SELECT
    conversation_id,
    count() AS requests,
    max(turn) AS turns,
    sum(cost_usd) AS cost_usd,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens
FROM requests
WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND conversation_id != '' AND layer = {layer:String}
GROUP BY conversation_id
ORDER BY cost_usd DESC, conversation_id
LIMIT {limit:UInt32}
