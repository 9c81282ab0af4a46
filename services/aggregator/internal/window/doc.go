// Package window keeps tumbling event-time windows of request events per env × scene ×
// model × input bucket (× instance), with t-digests of TTFT, TPOT and total latency, and
// hands closed windows out as rollups. It tracks, for each window, the stream positions it
// holds, so the pipeline knows what it may acknowledge and what a restart must skip.
//
// Time: a window [s, s+W) closes once the watermark passes s+W+lateness. The watermark is
// the latest request end (ts + total_ms) seen, never ahead of the caller's clock, and it
// moves on with the clock while no events arrive, so a quiet stream still closes its
// windows. An event for a closed window goes into a correction of it — counted as late,
// never dropped.
package window
