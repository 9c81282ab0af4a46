// Package sink writes rollups and request events to ClickHouse, one batch insert per table per
// flush with named columns, and reads back the exactly-once ledger: which stream positions the
// stored rows already cover.
package sink
