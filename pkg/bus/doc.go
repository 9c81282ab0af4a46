// Package bus connects to NATS and sets up JetStream the way every tokenscope service
// needs it: its streams created or updated idempotently with file storage, retention
// limits and a duplicate window, and durable pull consumers. On a NATS cluster still
// forming as the services start (no meta leader yet, or too few servers known to place the
// replicas), creating the streams and buckets is retried for up to FormingPatience.
package bus
