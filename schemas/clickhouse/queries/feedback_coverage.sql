-- How much feedback there is and how much of it could be tied to a request: verdicts (the
-- latest of each source on a request or conversation, as the other queries count them),
-- duplicate rows stored (the same event_id twice), verdicts on a request_id that requests
-- does not hold (kept, never dropped: the request may be older than the table's TTL, from
-- another env, not yet stored, or more than 7 days older than from: requests are read from
-- then, so that the scan is bounded), verdicts on a conversation only, the verdicts that came
-- inline, as scores on their request event (source app, from the verdicts view; their ts is
-- the request's), and superseded: verdicts replaced by a later one of the same source (a
-- changed verdict, sent under an event_id of its own). A verdict on a conversation only rates
-- its env and conversation_id (the same id in two envs is two conversations, as in
-- conversations.sql); one without env rates the conversation of its id in the one env whose
-- requests (from 7 days before from) have it. The business queries leave out a verdict on a
-- conversation only whose conversation they cannot find: conversation_env_ambiguous counts
-- those without env whose id requests of two or more envs carry (each a verdict apart from
-- those with an env), and conversation_unknown those whose conversation (the verdict's env,
-- or for one without env any env, and its conversation_id) no request carries, both among the
-- requests read (7 days before from up to to). Parameters: from, to (DateTime, when the
-- verdicts were given).
SELECT
    count() AS verdicts,
    sum(copies) - sum(ids) AS duplicate_rows,
    countIf(request_id != '' AND request_id NOT IN (SELECT event_id FROM requests WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime})) AS unknown_request,
    countIf(request_id = '') AS conversation_only,
    countIf(source = 'app') AS inline_scores,
    sum(ids) - count() AS superseded,
    countIf(request_id = '' AND placed_env = '' AND envs >= 2) AS conversation_env_ambiguous,
    countIf(request_id = '' AND NOT (placed_env = '' AND envs >= 2) AND (placed_env, conversation) NOT IN
        (SELECT env, conversation_id FROM requests WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} AND conversation_id != '')) AS conversation_unknown
FROM
(
    SELECT request_id, if(request_id = '', conversation_id, '') AS conversation, if(request_id = '', env, '') AS placed_env, source,
        max(env_count) AS envs, count() AS copies, uniqExact(event_id) AS ids
    FROM
    (
        -- a verdict on a conversation without env rates the conversation of its id in the one
        -- env whose requests (7 days before from to to) have it, as the business queries place it
        SELECT request_id, conversation_id, if(verdict_env != '', verdict_env, if(env_count = 1, only_env, '')) AS env, name, source, event_id, env_count
        FROM
        (
            SELECT request_id, conversation_id, env AS verdict_env, name, source, event_id
            FROM verdicts
            WHERE ts >= {from:DateTime} AND ts < {to:DateTime}
        ) AS v
        ANY LEFT JOIN
        (
            SELECT conversation_id, any(env) AS only_env, uniqExact(env) AS env_count
            FROM requests
            WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} AND conversation_id != ''
            GROUP BY conversation_id
        ) AS e USING conversation_id
    )
    GROUP BY request_id, conversation, placed_env, name, source
)
