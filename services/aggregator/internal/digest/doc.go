// Package digest keeps latency distributions as merging t-digests (Dunning and Ertl, "Computing
// extremely accurate quantiles using t-digests", 2019) with integer weights, so that merged
// counts are exact, and with storage that grows only as samples arrive and is reused after
// Reset, so that the aggregator's hot path does not allocate.
//
// It replaces influxdata/tdigest v0.0.1, whose AddCentroidList drops one centroid each time its
// buffer fills (60 digests of 10k samples merged kept 68k of 600k) and which allocates about
// 18 KB per digest up front at compression 100 — over the aggregator's 64 KB budget for a
// series of three digests. The scale function is the same (k1, arcsine), so the centroids mean
// what ClickHouse's quantileTDigestWeighted expects.
package digest
