// Package enginee2e tests the engine layer end to end: the fake engine's scheduler (here,
// where its exact measurements can be read), the gpuwatch binary scraping it, and the
// aggregator binary writing engine_rollups, over the real NATS and ClickHouse.
package enginee2e
