// Package ops serves what every tokenscope service answers on HTTP_ADDR — /healthz,
// /readyz and /metrics — bounds the client connections a service holds open, and bounds
// the label values that become metric labels.
package ops
