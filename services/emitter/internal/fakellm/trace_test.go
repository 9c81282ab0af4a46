package fakellm

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestSpans: each request that ran to its end gives one llm_request span, parented on the
// traceparent it came with, with the scheduler's queue and prefill under the scheduler and
// the latency model's otherwise; a failed request gives none.
func TestSpans(t *testing.T) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name       string
		opts       Options
		concurrent int
		wantQueue  bool
	}{
		{"latency model", Options{TTFT: 30 * time.Millisecond, TPOT: 5 * time.Millisecond, Tokens: 4}, 1, false},
		// One slot for two requests: the second waits for the first.
		{"scheduler", Options{TTFT: 30 * time.Millisecond, TPOT: 5 * time.Millisecond, Tokens: 4, MaxBatch: 1}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tc.opts.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("fakellm")
			srv := httptest.NewServer(New(tc.opts))
			defer srv.Close()
			var wg sync.WaitGroup
			for i := range tc.concurrent {
				wg.Add(1)
				go func() {
					defer wg.Done()
					stream := i%2 == 0
					body := `{"model":"m","max_tokens":8,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `,"messages":[{"role":"user","content":"a b c d"}]}`
					req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("traceparent", parent)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}()
			}
			wg.Wait()
			// A failed request: no span.
			req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
			req.Header.Set("X-Fakellm-Mode", "error")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
			spans := rec.Ended()
			if len(spans) != tc.concurrent {
				t.Fatalf("%d spans, want %d", len(spans), tc.concurrent)
			}
			var maxQueue float64
			for _, sp := range spans {
				if sp.Name() != "llm_request" || sp.SpanKind() != trace.SpanKindServer {
					t.Fatalf("span %q kind %v", sp.Name(), sp.SpanKind())
				}
				if sp.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sp.Parent().SpanID().String() != "00f067aa0ba902b7" {
					t.Fatalf("parent %v", sp.Parent())
				}
				a := map[attribute.Key]attribute.Value{}
				for _, kv := range sp.Attributes() {
					a[kv.Key] = kv.Value
				}
				if a["gen_ai.response.model"].AsString() != "m" || a["gen_ai.usage.prompt_tokens"].AsInt64() != 4 ||
					a["gen_ai.usage.completion_tokens"].AsInt64() != 4 || a["gen_ai.request.max_tokens"].AsInt64() != 8 {
					t.Fatalf("attributes %v", a)
				}
				ttft, e2e := a["gen_ai.latency.time_to_first_token"].AsFloat64(), a["gen_ai.latency.e2e"].AsFloat64()
				prefill, decode := a["gen_ai.latency.time_in_model_prefill"].AsFloat64(), a["gen_ai.latency.time_in_model_decode"].AsFloat64()
				queue := a["gen_ai.latency.time_in_queue"].AsFloat64()
				if ttft < 0.025 || e2e < ttft || prefill <= 0 || decode <= 0 || queue < 0 || ttft+1e-9 < queue+prefill-0.005 {
					t.Fatalf("ttft %g e2e %g queue %g prefill %g decode %g", ttft, e2e, queue, prefill, decode)
				}
				if got := sp.EndTime().Sub(sp.StartTime()).Seconds(); got < e2e-1e-6 || got > e2e+1e-6 {
					t.Fatalf("span of %gs, e2e %gs", got, e2e)
				}
				maxQueue = max(maxQueue, queue)
			}
			if tc.wantQueue != (maxQueue > 0.02) {
				t.Fatalf("longest queue %gs", maxQueue)
			}
		})
	}
}
