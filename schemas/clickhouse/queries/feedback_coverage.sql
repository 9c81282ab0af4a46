-- How much feedback there is and how much of it could be tied to a request: verdicts
-- (one per event_id), duplicate rows stored, verdicts on a request_id that requests does
-- not hold (kept, never dropped: the request may be older than the table's TTL, from
-- another env, or not yet stored), verdicts on a conversation only, and the verdicts that
-- came inline, as scores on their request event (from the verdicts view; their ts is the
-- request's). Parameters: from, to (DateTime, when the verdicts were given).
SELECT
    count() AS verdicts,
    sum(copies) - count() AS duplicate_rows,
    countIf(request_id != '' AND request_id NOT IN (SELECT event_id FROM requests WHERE ts < {to:DateTime})) AS unknown_request,
    countIf(request_id = '') AS conversation_only,
    countIf(source = 'app') AS inline_scores
FROM
(
    SELECT event_id, any(request_id) AS request_id, any(source) AS source, count() AS copies
    FROM verdicts
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime}
    GROUP BY event_id
)
