-- Inline scores: verdicts a request event carries itself (scores, name to number), stored on
-- the request's own row as two arrays of the same length, score_names[i] scored
-- score_values[i]. Being part of the row, they are stored exactly once with it. Rows stored
-- before this migration read no scores. ADD COLUMN IF NOT EXISTS keeps this safe to run
-- twice, as in 007_layers.sql.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS score_names Array({{lc "String"}});
ALTER TABLE requests ADD COLUMN IF NOT EXISTS score_values Array(Float64);
-- verdicts is every verdict the business queries count: the feedback table's rows, and one
-- row per inline score, as if it were a feedback event of source app on its own request
-- (event_id = the request's event_id + '/' + name, request_id = the request's event_id, ts
-- = the request's ts). It is a view: nothing is stored twice.
CREATE VIEW IF NOT EXISTS verdicts AS
SELECT ts, event_id, request_id, conversation_id, name, value, source, env, scene, model
FROM feedback
UNION ALL
SELECT ts, concat(request_id, '/', name) AS event_id, request_id, conversation_id, name, value, 'app' AS source, env, scene, model
FROM
(
    -- request_id first, in a subquery: an alias event_id beside the column would shadow it
    SELECT ts, event_id AS request_id, conversation_id, score_name AS name, score_value AS value, env, scene, model
    FROM requests
    ARRAY JOIN score_names AS score_name, score_values AS score_value
);
