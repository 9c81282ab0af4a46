// Package notify delivers alert state changes: JSON on alerts.<severity>.<rule> in the
// ALERTS stream, published synchronously (each waits for JetStream's acknowledgement, and
// a failure is returned so the caller holds the window's rollups unacknowledged;
// Nats-Msg-Id = fingerprint, transition and window, so a retry or a window evaluated again
// cannot publish twice), one row per change in ClickHouse's alerts table, and, when
// configured, a POST to an Alertmanager's /api/v2/alerts so teams route tokenscope alerts
// with what they already run.
package notify
