-- Feedback: users' and evaluators' verdicts on requests and conversations, written by the
-- aggregator from the FEEDBACK stream. One row per feedback event; no free text (a comment
-- is kept as its length only). A verdict sent again with the same event_id is stored once
-- while the aggregator remembers the id (AGG_FEEDBACK_DEDUP ids); the cookbook's queries
-- keep the latest verdict (by ts) of each source on a request or conversation, so even a
-- duplicate past that memory counts once there, and a changed verdict (sent under an
-- event_id of its own) counts with its last value only.
-- A verdict is tied to the request it rates at query time, by request_id = requests.event_id:
-- feedback arrives hours after its request, and one whose request is unknown is kept.
CREATE TABLE IF NOT EXISTS feedback
(
    ts              DateTime64(3, 'UTC'),
    event_id        String,
    request_id      String,
    conversation_id String,
    name            LowCardinality(String),
    value           Float64,
    source          LowCardinality(String),
    env             LowCardinality(String),
    scene           LowCardinality(String),
    model           LowCardinality(String),
    comment_length  UInt32,
    consumer        LowCardinality(String),
    stream_seq      UInt64
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (name, ts)
TTL toDateTime(ts) + INTERVAL 400 DAY
