// Package record writes the ALERTS stream into ClickHouse's alerts table, one row per alert
// state change, exactly once.
//
// It reads ALERTS with a durable consumer of its own and acknowledges a message only once
// its row is stored, so a ClickHouse outage, or a restart during one, only delays the rows:
// the stream keeps the alerts until the table has them. A row's key is the alert message's
// Nats-Msg-Id, <fingerprint>-<state>-<at>, which the table holds as its fingerprint, state
// and at columns. Before inserting a batch the recorder reads which of its keys the table
// already has, after waiting for any earlier attempt of the same batch to finish on the
// server, and inserts only the others: a batch stored but not acknowledged (a crash, a lost
// ack) and delivered again writes nothing twice, and neither does a consumer replaying the
// whole stream.
package record
