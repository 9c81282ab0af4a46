-- resolve_reason: why a resolved alert resolved (normal, silent, within_sla; see
-- schemas/alert.schema.json). Firing rows, and rows written before this migration, read ''.
-- ADD COLUMN IF NOT EXISTS keeps this safe to run twice and on tables that already have it.
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS resolve_reason String DEFAULT '';
