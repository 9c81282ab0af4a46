package fakellm

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// spanTimes is what one finished request's llm_request span reports.
type spanTimes struct {
	arrived, end                 time.Time
	queue, ttft, prefill, decode time.Duration
}

// exportSpan ends one llm_request span for a request that ran to its end, shaped as vLLM's
// (vllm/tracing.py): a server span from arrival to the end, parented on the request's
// traceparent, with the engine's latencies in seconds.
func (s *Server) exportSpan(r *http.Request, p *plan, t spanTimes) {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
	_, span := s.opts.Tracer.Start(ctx, "llm_request", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(t.arrived))
	span.SetAttributes(
		attribute.String("gen_ai.response.model", p.model),
		attribute.String("gen_ai.request.id", p.id),
		attribute.Int("gen_ai.usage.prompt_tokens", p.input),
		attribute.Int("gen_ai.usage.completion_tokens", p.output),
		attribute.Float64("gen_ai.latency.time_in_queue", t.queue.Seconds()),
		attribute.Float64("gen_ai.latency.time_to_first_token", t.ttft.Seconds()),
		attribute.Float64("gen_ai.latency.e2e", t.end.Sub(t.arrived).Seconds()),
		attribute.Float64("gen_ai.latency.time_in_model_prefill", t.prefill.Seconds()),
		attribute.Float64("gen_ai.latency.time_in_model_decode", t.decode.Seconds()),
		attribute.Float64("gen_ai.latency.time_in_model_inference", (t.prefill+t.decode).Seconds()),
	)
	if p.maxTokens > 0 {
		span.SetAttributes(attribute.Int("gen_ai.request.max_tokens", p.maxTokens))
	}
	span.End(trace.WithTimestamp(t.end))
}

// modelTimes are a finished request's times under the latency model (no scheduler): no
// queue, the model's TTFT as prefill, the rest decoding.
func modelTimes(p *plan, arrived, end time.Time) spanTimes {
	t := spanTimes{arrived: arrived, end: end, ttft: p.ttft, prefill: p.ttft}
	if total := end.Sub(arrived); total > p.ttft {
		t.decode = total - p.ttft
	} else {
		t.ttft, t.prefill = total, total
	}
	return t
}

// engineTimes are a finished request's times as the scheduler measured them.
func engineTimes(rec EngineRecord, arrived, end time.Time) spanTimes {
	return spanTimes{arrived: arrived, end: end, queue: rec.Queue, ttft: rec.TTFT, prefill: rec.Prefill, decode: rec.Decode}
}
