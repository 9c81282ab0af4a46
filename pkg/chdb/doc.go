// Package chdb connects to ClickHouse and migrates tokenscope's tables. The migrator applies
// schemas/clickhouse/*.sql in order, idempotently, adapting the DDL to the server: current
// ClickHouse gets LowCardinality, DateTime64 and TTL; Debian's 18.16 gets the same tables
// without them.
package chdb
