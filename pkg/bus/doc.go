// Package bus connects to NATS and sets up JetStream the way every tokenscope service
// needs it: its streams created or updated idempotently with file storage, retention
// limits and a duplicate window, and durable pull consumers.
package bus
