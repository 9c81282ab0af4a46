// Package ops serves what every tokenscope service answers on HTTP_ADDR — /healthz,
// /readyz and /metrics — and bounds the label values that become metric labels.
package ops
