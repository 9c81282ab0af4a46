// Package otlp receives OpenTelemetry traces (OTLP/HTTP and OTLP/gRPC) and turns the spans
// that describe one LLM request into request events: vLLM's llm_request spans become
// engine-layer events, GenAI client spans (the OpenTelemetry GenAI semantic conventions)
// app-layer events. Other spans are counted and ignored; a span of either kind that lacks
// what an event needs is rejected with its reason, and the others of its batch still go.
package otlp
