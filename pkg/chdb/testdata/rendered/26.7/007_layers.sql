-- Layers: where a request was measured. gateway is the emitter's proxy and HTTP ingest (and
-- every row written before this migration), engine the inference engine's own spans, app
-- the calling application's. The same request at two layers is two rows, joined by
-- trace_id (W3C Trace Context) and never summed across layers: every query names the layer
-- it reads. prefill_ms and decode_ms split an engine's time after queue_ms.
-- ADD COLUMN IF NOT EXISTS keeps this safe to run twice and on tables that already have the
-- columns (a cluster's Distributed tables made AS the migrated local ones). Rows already
-- stored read layer 'gateway', trace_id '' and 0 ms.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS layer LowCardinality(String) DEFAULT 'gateway';
ALTER TABLE requests ADD COLUMN IF NOT EXISTS trace_id String DEFAULT '';
ALTER TABLE requests ADD COLUMN IF NOT EXISTS prefill_ms Float64 DEFAULT 0;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS decode_ms Float64 DEFAULT 0;
ALTER TABLE token_rollups ADD COLUMN IF NOT EXISTS layer LowCardinality(String) DEFAULT 'gateway';
