-- The business layer: average turns per conversation, and task completion rate — the
-- share of conversations completed among those whose outcome is known. A conversation's
-- outcome is the last outcome its requests carry (sent by the app on the request event; of
-- equal ts, whole seconds on 18.16, the greatest event_id); a conversation none of whose
-- requests carries one takes its latest task_completed verdict (POST /v1/feedback, the way an
-- app behind the gateway proxy reports it; of equal ts the greatest event_id): value > 0 is
-- completed, value <= 0 abandoned. A task_completed verdict on a request counts for its
-- request's conversation, one on a conversation for that conversation in the verdict's env,
-- one without env for the conversation of its id in the one env that has it (none where two
-- envs do), as in cost_per_satisfied_conversation.sql; verdicts given up to 7 days after the
-- range count. Conversations with neither count in conversations and avg_turns only;
-- completion_rate is completed / (completed + abandoned), and NULL when no conversation's
-- outcome is known (no rate, rather than a rate of 0 that reads as every task failed; a
-- dashboard leaves the point out). An app reports completion
-- one way: where a request carries an outcome, the conversation's verdicts are not read.
-- A conversation belongs to the range of its first
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
    if(countIf(outcome != '') = 0, NULL, countIf(outcome = 'completed') / countIf(outcome != '')) AS completion_rate
FROM
(
    SELECT conversation_id, turns,
        if(req_outcome != '', req_outcome, if(verdicts = 0, '', if(verdict > 0, 'completed', 'abandoned'))) AS outcome
    FROM
    (
        SELECT
            env,
            conversation_id,
            uniqExactIf(turn, turn > 0) + countIf(turn = 0) AS turns,
            argMaxIf(outcome, (ts, event_id), outcome != '') AS req_outcome
        FROM requests
        WHERE ts >= {from:DateTime} - INTERVAL 7 DAY AND ts < {to:DateTime} + INTERVAL 7 DAY
            AND conversation_id != '' AND layer = {layer:String}
        GROUP BY env, conversation_id
        HAVING min(ts) >= {from:DateTime} AND min(ts) < {to:DateTime}
    ) AS c
    ANY LEFT JOIN
    (
        -- the latest task_completed verdict of the conversation: of equal ts (whole seconds on
        -- 18.16), the greatest event_id (UUIDv7 ids sort by time)
        SELECT env, conversation_id, count() AS verdicts, argMax(value, (ts, event_id)) AS verdict
        FROM
        (
            -- a verdict without env (its sender did not know it) is of the conversation of its
            -- id in the one env that has it; where two envs have it, of neither
            SELECT if(verdict_env != '', verdict_env, only_env) AS env, conversation_id, value, ts, event_id
            FROM
            (
                -- a verdict on a request is of its request's conversation, in its request's env
                SELECT if(known = 1, req_env, fb_env) AS verdict_env,
                    if(fb_conversation != '', fb_conversation, req_conversation) AS conversation_id, value, ts, event_id
                FROM
                (
                    SELECT request_id, env AS fb_env, conversation_id AS fb_conversation, value, ts, event_id
                    FROM verdicts
                    WHERE name = 'task_completed' AND ts >= {from:DateTime} AND ts < {to:DateTime} + INTERVAL 7 DAY
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
        GROUP BY env, conversation_id
    ) AS v USING (env, conversation_id)
)
