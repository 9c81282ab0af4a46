-- One row per window × host (or a correction of one, like gpu_rollups): memory, disk and
-- network of a GPU host from its host samples. Disk and network means are bytes moved ÷
-- the seconds the rates covered (disk_seconds, net_seconds), so windows merge exactly with
-- sum(avg × seconds) / sum(seconds); memory means merge with mem_samples as weights. A
-- reading no sample of the window had is 0 with a 0 count.
CREATE TABLE IF NOT EXISTS host_rollups
(
    window_start            DateTime,
    window_seconds          UInt32,
    kind                    String,
    host                    String,
    samples                 UInt64,
    mem_samples             UInt64,
    mem_total_bytes         UInt64,
    mem_used_avg_bytes      Float64,
    mem_used_max_bytes      UInt64,
    mem_available_min_bytes UInt64,
    disk_seconds            Float64,
    disk_read_avg_bps       Float64,
    disk_read_max_bps       Float64,
    disk_write_avg_bps      Float64,
    disk_write_max_bps      Float64,
    net_seconds             Float64,
    net_rx_avg_bps          Float64,
    net_rx_max_bps          Float64,
    net_tx_avg_bps          Float64,
    net_tx_max_bps          Float64,
    consumer                String,
    seq_through             UInt64,
    flush_id                String,
    written_at              DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (host, window_start)

