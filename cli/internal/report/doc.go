// Package report reads the per-bucket table out of ClickHouse's token_rollups: for a time
// range and a model/scene/env filter, P50/P95/P99 of TTFT and TPOT per model × scene ×
// input-token bucket, output tokens per second, and error and timeout rates side by side.
// Percentiles are merged from the windows' t-digest centroids in SQL, never averaged, so
// any range gives the percentile of all its requests. Two ranges compare bucket by bucket:
// the segmented P95 before and after a change.
package report
