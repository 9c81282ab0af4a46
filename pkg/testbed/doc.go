// Package testbed starts the real servers tokenscope's tests run against: an in-process
// nats-server with JetStream on a free port, and a private clickhouse-server process from
// Debian's package on free ports in a temporary folder (or the server at CLICKHOUSE_ADDR
// when that is set). Locally a missing clickhouse-server skips the test with the command
// that installs it; under CI=true it fails.
//
// CurrentClickHouse is a current ClickHouse (chDB: ClickHouse 26.7 embedded in libchdb, run
// in a Node.js process the test talks to over pipes; installed by make chdb) on which tests
// run the production DDL and queries; CopyTables fills it with the rows the pipeline wrote
// to 18.16, and Query and Compare put the two servers' answers side by side. chDB listens on
// no port, so the services' own connections are tested against 18.16 only.
package testbed
