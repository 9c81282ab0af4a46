// Package stack starts what a local tokenscope needs on one machine without Docker: an
// embedded nats-server with JetStream, a private clickhouse-server from Debian's package on
// its own ports and folder, and the service binaries as child processes with their logs in
// files. Everything it starts it stops, children in reverse order of starting.
package stack
