// Package notify delivers alert state changes: JSON on alerts.<severity>.<rule> in the
// ALERTS stream (Nats-Msg-Id = fingerprint, state and time, so a restart that evaluates a
// window again cannot send twice), one row per change in ClickHouse's alerts table, and,
// when configured, a POST to an Alertmanager's /api/v2/alerts so teams route tokenscope
// alerts with what they already run.
package notify
