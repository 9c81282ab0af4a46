// Package intake reads rollups from the ROLLUPS stream with a durable consumer, gathers
// them per window, and hands each window to the engine once no rollup of it has arrived
// for the settle time (the aggregator writes a window's rollups in one burst). Messages are
// acknowledged only after their window has been evaluated and its alerts sent, so a crash
// re-evaluates the window instead of losing it; the Nats-Msg-Id of each alert makes the
// second send a no-op. Undecodable rollups are terminated, dead-lettered and counted.
package intake
