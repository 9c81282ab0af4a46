// Package history reads the past back at start: the baselines of the last days from
// ClickHouse's token_rollups and gpu_rollups (aggregated per baseline step in SQL, with
// percentiles merged from the digests' centroids, never averaged), and the alerts that were
// firing from the ALERTS stream, so a restart neither forgets a week of baselines nor fires
// an alert again.
package history
