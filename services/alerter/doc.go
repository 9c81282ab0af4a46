// Command alerter turns tokenscope's rollups into alerts people can trust: seasonal
// dynamic thresholds per env × scene × model × input bucket (the same time-of-day slot on
// each of the previous days, mean ± k·σ or median ± k·MAD), static SLA rules (TTFT p95
// over 2 s / 5 s and the like) where a series has too little history or traffic, GPU
// efficiency and saturation rules per host, and Prometheus' alert lifecycle (pending, firing, resolved; sent once,
// re-sent, resolved once). Alerts go to alerts.<severity>.<rule> in the ALERTS stream, to
// ClickHouse's alerts table and, optionally, to an Alertmanager.
//
// With no arguments it serves; every setting is an environment variable (see config.go
// and README.md).
package main
