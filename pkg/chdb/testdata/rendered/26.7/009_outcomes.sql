-- Business outcomes in token rollups: how many of the window's requests reported outcome
-- completed or abandoned (request events' outcome field), so completion rate =
-- sum(completed) / (sum(completed) + sum(abandoned)) over any range of windows, with plain
-- sum() as every count here. Requests without an outcome count in neither. ADD COLUMN IF
-- NOT EXISTS keeps this safe to run twice; rows written before it read 0.
ALTER TABLE token_rollups ADD COLUMN IF NOT EXISTS completed UInt64 DEFAULT 0;
ALTER TABLE token_rollups ADD COLUMN IF NOT EXISTS abandoned UInt64 DEFAULT 0;
