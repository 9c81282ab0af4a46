// Package checkpoint keeps, in a JetStream key-value bucket, the start of the latest window
// whose alerts the alerter has delivered. Rollups are acknowledged only after that, so a
// restarted alerter that reads the unacknowledged rollups again from the consumer's ack
// floor knows which of their windows it has evaluated already and must not evaluate twice.
package checkpoint
