// Package demo runs the whole of tokenscope on one machine without Docker: NATS and a
// private ClickHouse, the four services, a fake LLM behind the emitter's proxy with a replay
// of real traffic through it, and a simulated scene with a recurring incident, then shows
// the per-bucket table live and prints alerts as the alerter sends them.
package demo
