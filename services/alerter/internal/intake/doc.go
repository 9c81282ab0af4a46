// Package intake reads rollups from the ROLLUPS stream with a durable consumer, gathers
// them per window, and hands each window to the engine once no rollup of it has arrived
// for the settle time (the aggregator writes a window's rollups in one burst), oldest
// first.
//
// A window's rollups are acknowledged only once it is delivered: its alerts acknowledged
// by JetStream on the ALERTS stream (their rows are written from there, package record) and
// a checkpoint saying the window is done saved.
// A step that fails is retried with backoff and no later window is evaluated meanwhile, so
// alerts leave in order and nothing is acknowledged before it is durable.
//
// With partitioned aggregators a settled window also waits until every aggregator whose
// watermark (rollup.watermark.<consumer>) the intake has read has passed it, so a partition
// that lags, restarted or replaying, has its rollups evaluated with the others' instead of
// counted late. The wait is bounded by WatermarkTimeout; an aggregator that makes a window
// time out is logged, counted and not waited for until its watermark moves again.
//
// At start the consumer is reset to its ack floor, so the windows a stopped alerter held
// come again at once and in stream order, instead of after AckWait behind newer windows;
// rollups of windows up to the checkpoint are acknowledged as redelivered, never evaluated
// twice. A crash before the checkpoint re-evaluates the window; the alerts' Nats-Msg-Id
// makes their second publish a no-op. Undecodable rollups are terminated, dead-lettered
// and counted.
package intake
