-- Where the time of a request goes, layer by layer: one trace, or every trace of a range per
-- input bucket, split into app → gateway → queue → prefill → decode. The layers' events of a
-- request share its W3C trace id (the proxy forwards or starts the traceparent; the engine's
-- and the app's OpenTelemetry spans carry it). Each trace is one row per layer first, never
-- summed across layers; then
--   app_ms      = the app's total − the gateway's (the network and the client's side),
--   gateway_ms  = the gateway's total − the engine's (the proxy and the way to the engine),
--   queue_ms, prefill_ms, decode_ms = the engine's own split, and engine_other_ms what is left
--   of the engine's total,
-- each averaged over the traces that have the layers it needs (with_app, with_engine say how
-- many), so a trace missing a layer never counts as zero. nan where no trace has them.
-- Parameters: from, to (DateTime), trace_id (String: one trace, or '' for every trace of the
-- range), bucket (String: one input bucket, or '' for all; a trace's bucket is its gateway
-- event's, else its engine's, else its app's).
SELECT trace_bucket AS bucket,
    count() AS traces,
    countIf(has_app AND has_gateway) AS with_app,
    countIf(has_gateway AND has_engine) AS with_engine,
    avgIf(app_total - gateway_total, has_app AND has_gateway) AS app_ms,
    avgIf(gateway_total - engine_total, has_gateway AND has_engine) AS gateway_ms,
    avgIf(engine_queue, has_engine) AS queue_ms,
    avgIf(engine_prefill, has_engine) AS prefill_ms,
    avgIf(engine_decode, has_engine) AS decode_ms,
    avgIf(engine_total - engine_queue - engine_prefill - engine_decode, has_engine) AS engine_other_ms,
    avgIf(app_ttft, has_app) AS app_ttft_ms,
    avgIf(gateway_ttft, has_gateway) AS gateway_ttft_ms,
    avgIf(engine_ttft, has_engine) AS engine_ttft_ms
FROM
(
    SELECT trace_id,
        countIf(layer = 'app') > 0 AS has_app,
        countIf(layer = 'gateway') > 0 AS has_gateway,
        countIf(layer = 'engine') > 0 AS has_engine,
        anyIf(total_ms, layer = 'app') AS app_total,
        anyIf(total_ms, layer = 'gateway') AS gateway_total,
        anyIf(total_ms, layer = 'engine') AS engine_total,
        anyIf(ttft_ms, layer = 'app') AS app_ttft,
        anyIf(ttft_ms, layer = 'gateway') AS gateway_ttft,
        anyIf(ttft_ms, layer = 'engine') AS engine_ttft,
        anyIf(queue_ms, layer = 'engine') AS engine_queue,
        anyIf(prefill_ms, layer = 'engine') AS engine_prefill,
        anyIf(decode_ms, layer = 'engine') AS engine_decode,
        if(has_gateway, anyIf(bucket, layer = 'gateway'), if(has_engine, anyIf(bucket, layer = 'engine'), anyIf(bucket, layer = 'app'))) AS trace_bucket
    FROM requests
    WHERE ts >= {from:DateTime} AND ts < {to:DateTime} AND trace_id != '' AND ({trace_id:String} = '' OR trace_id = {trace_id:String})
        AND layer IN ('app', 'gateway', 'engine')
    GROUP BY trace_id
)
WHERE {bucket:String} = '' OR trace_bucket = {bucket:String}
GROUP BY trace_bucket
ORDER BY toUInt64OrZero(extract(trace_bucket, '^[0-9]+')), trace_bucket
