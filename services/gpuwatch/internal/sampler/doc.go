// Package sampler ticks on wall-clock multiples of the interval, takes one sample per GPU
// from a source, and publishes each to gpu.sample.<host> with a Nats-Msg-Id of
// host/uuid/ts, so a retried publish is dropped by JetStream instead of counted twice.
package sampler
