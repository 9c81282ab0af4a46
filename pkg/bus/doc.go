// Package bus connects to NATS and sets up JetStream the way every tokenscope service
// needs it: the six streams created or updated idempotently with file storage, retention
// limits and a duplicate window, and durable pull consumers.
package bus
