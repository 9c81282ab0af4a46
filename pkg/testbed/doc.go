// Package testbed starts the real servers tokenscope's tests run against: an in-process
// nats-server with JetStream on a free port, and a private clickhouse-server process from
// Debian's package on free ports in a temporary folder (or the server at CLICKHOUSE_ADDR
// when that is set). Locally a missing clickhouse-server skips the test with the command
// that installs it; under CI=true it fails.
package testbed
