// Package bench is the baseline measurement to take before and after every configuration
// change: short, medium and long prompts, N requests each, against an endpoint
// of either protocol, summarised as P50/P95/P99 of TTFT, TPOT and total per input bucket,
// saved as JSON and compared with a previous run.
package bench
