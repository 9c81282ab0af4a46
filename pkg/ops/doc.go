// Package ops serves what every tokenscope service answers on HTTP_ADDR — /healthz,
// /readyz and /metrics — bounds the client connections a service holds open, bounds
// the label values that become metric labels, and redacts the endpoint URLs services
// log (RedactURL).
package ops
