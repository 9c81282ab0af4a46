// Package chdb connects to ClickHouse and migrates tokenscope's tables. The migrator applies
// schemas/clickhouse/*.sql in order, idempotently, adapting the DDL to what the server is
// found to do (Probe: a temporary table of each type, the MergeTree setting behind TTL), not
// to its version number: current ClickHouse gets LowCardinality, DateTime64 and TTL;
// Debian's 18.16 gets the same tables without them (testdata/rendered holds both). A table
// that already exists — a cluster's Distributed table created by hand, say — is left as it
// is and reported with its engine (Migration.Existing). Bind fills in {name:Type} query
// parameters for servers that cannot bind them (18.16).
package chdb
