package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/nodetest"
)

// otlpRig serves the emitter with both OTLP receivers on free ports and the ingest token
// "tok"; it returns the base URL, the two receiver addresses and the stream.
func otlpRig(t *testing.T) (base, httpAddr, grpcAddr string, js jetstream.JetStream, stop func()) {
	t.Helper()
	httpAddr, grpcAddr = freeAddr(t), freeAddr(t)
	base, js, stop = serveRig(t, "EMITTER_INGEST_TOKEN=tok", "EMITTER_OTLP_HTTP_ADDR="+httpAddr, "EMITTER_OTLP_GRPC_ADDR="+grpcAddr)
	return base, httpAddr, grpcAddr, js, stop
}

// emitVLLMSpans ends n llm_request spans shaped as vLLM's (vllm/tracing.py attribute names,
// start at the request's arrival) and extra spans of no LLM kind.
func emitVLLMSpans(tr trace.Tracer, n, extra int) {
	arrival := time.Now().Add(-5 * time.Second)
	for i := range n {
		_, span := tr.Start(context.Background(), "llm_request", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrival))
		span.SetAttributes(
			attribute.String("gen_ai.response.model", "meta-llama/Llama-3.1-8B-Instruct"),
			attribute.String("gen_ai.request.id", fmt.Sprintf("cmpl-%d", i)),
			attribute.Int("gen_ai.request.max_tokens", 256),
			attribute.Int("gen_ai.usage.prompt_tokens", 100+i),
			attribute.Int("gen_ai.usage.completion_tokens", 20),
			attribute.Float64("gen_ai.latency.time_in_queue", 0.010),
			attribute.Float64("gen_ai.latency.time_to_first_token", 0.120),
			attribute.Float64("gen_ai.latency.e2e", 0.900),
			attribute.Float64("gen_ai.latency.time_in_model_prefill", 0.100),
			attribute.Float64("gen_ai.latency.time_in_model_decode", 0.780),
			attribute.Float64("gen_ai.latency.time_in_model_inference", 0.880),
		)
		span.End(trace.WithTimestamp(arrival.Add(900 * time.Millisecond)))
	}
	for range extra {
		_, span := tr.Start(context.Background(), "scheduler_step")
		span.End()
	}
}

// emitGenAISpans ends n chat spans as the OpenTelemetry GenAI instrumentations write them,
// one in five an error, and extra tool-call spans (not requests).
func emitGenAISpans(tr trace.Tracer, n, extra int) {
	for i := range n {
		start := time.Now().Add(-3 * time.Second)
		_, span := tr.Start(context.Background(), "chat gpt-4o", trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start))
		span.SetAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			attribute.String("gen_ai.provider.name", "openai"),
			attribute.String("gen_ai.request.model", "gpt-4o"),
			attribute.String("gen_ai.response.model", "gpt-4o-2024-08-06"),
			attribute.StringSlice("gen_ai.response.finish_reasons", []string{"stop"}),
		)
		if i%5 == 4 {
			span.SetAttributes(attribute.String("error.type", "RateLimitError"))
			span.SetStatus(codes.Error, "429")
		} else {
			span.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", 300), attribute.Int("gen_ai.usage.output_tokens", 40))
		}
		span.End(trace.WithTimestamp(start.Add(1500 * time.Millisecond)))
	}
	for range extra {
		_, span := tr.Start(context.Background(), "execute_tool get_weather")
		span.SetAttributes(attribute.String("gen_ai.operation.name", "execute_tool"))
		span.End()
	}
}

func provider(t *testing.T, exp sdktrace.SpanExporter, attrs ...attribute.KeyValue) *sdktrace.TracerProvider {
	t.Helper()
	res, err := resource.New(context.Background(), resource.WithAttributes(attrs...))
	if err != nil {
		t.Fatal(err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithMaxExportBatchSize(64)), sdktrace.WithResource(res))
}

// layerCounts reads every message of LLM_EVENTS and counts the events per layer.
func layerCounts(t *testing.T, js jetstream.JetStream) map[events.Layer]int {
	t.Helper()
	counts, _ := layerEvents(t, js)
	return counts
}

// layerEvents reads every message of LLM_EVENTS, counts the events per layer and returns
// how many events of each layer each trace has.
func layerEvents(t *testing.T, js jetstream.JetStream) (map[events.Layer]int, map[string]map[events.Layer]int) {
	t.Helper()
	traces := map[string]map[events.Layer]int{}
	ctx := context.Background()
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[events.Layer]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		raw, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev events.RequestEvent
		if err := events.UnmarshalRequest(raw.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("stored an invalid event: %v", err)
		}
		if raw.Header.Get(jetstream.MsgIDHeader) != ev.EventID {
			t.Fatalf("stored %v %+v", raw.Header, ev)
		}
		if l := ev.Layer.OrGateway(); l != events.LayerGateway && !events.ValidTraceID(ev.TraceID) {
			t.Fatalf("a span's event without its trace: %+v", ev)
		}
		if traces[ev.TraceID] == nil {
			traces[ev.TraceID] = map[events.Layer]int{}
		}
		traces[ev.TraceID][ev.Layer.OrGateway()]++
		counts[ev.Layer.OrGateway()]++
	}
	return counts, traces
}

// TestOTLPGoExporters: the OpenTelemetry Go SDK's own exporters, gRPC for vLLM-shaped spans
// (vLLM's default) and HTTP/protobuf with gzip for GenAI spans, land as events in
// LLM_EVENTS with exact counts per layer; other spans are ignored and counted.
func TestOTLPGoExporters(t *testing.T) {
	base, httpAddr, grpcAddr, js, stop := otlpRig(t)
	defer stop()
	ctx := context.Background()
	auth := map[string]string{"authorization": "Bearer tok"}

	gexp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(grpcAddr), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithHeaders(auth), otlptracegrpc.WithCompressor("gzip"))
	if err != nil {
		t.Fatal(err)
	}
	engine := provider(t, gexp, attribute.String("service.name", "vllm"), attribute.String("deployment.environment.name", "test"),
		attribute.String("host.name", "gpu-1"))
	emitVLLMSpans(engine.Tracer("vllm.entrypoints"), 150, 9)

	hexp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(httpAddr), otlptracehttp.WithInsecure(),
		otlptracehttp.WithHeaders(auth), otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	app := provider(t, hexp, attribute.String("service.name", "support-bot"), attribute.String("deployment.environment", "test"))
	emitGenAISpans(app.Tracer("opentelemetry.instrumentation.openai_v2"), 100, 11)

	// Shutdown exports what is left and fails if an export did.
	if err := engine.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := app.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitMsgs(t, js, 250)
	got := layerCounts(t, js)
	if got[events.LayerEngine] != 150 || got[events.LayerApp] != 100 || got[events.LayerGateway] != 0 {
		t.Fatalf("events per layer %v, want engine 150, app 100", got)
	}
	if n := metric(t, base, "emitter_otlp_spans_ignored_total"); n != 20 {
		t.Fatalf("%v spans ignored, want 20", n)
	}
}

// TestOTLPExportersWithoutToken: the exporters see the refusal, and nothing is published.
func TestOTLPExportersWithoutToken(t *testing.T) {
	_, httpAddr, grpcAddr, js, stop := otlpRig(t)
	defer stop()
	ctx := context.Background()
	gexp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(grpcAddr), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	hexp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(httpAddr), otlptracehttp.WithInsecure(),
		otlptracehttp.WithHeaders(map[string]string{"Authorization": "Bearer wrong"}),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	emitVLLMSpans(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("t"), 1, 0)
	for name, exp := range map[string]sdktrace.SpanExporter{"grpc": gexp, "http": hexp} {
		if err := exp.ExportSpans(ctx, rec.Ended()); err == nil {
			t.Fatalf("%s: the export without the token succeeded", name)
		}
	}
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Fatalf("%d events published", info.State.Msgs)
	}
}

// otelDir holds the Node project that exports spans with the OpenTelemetry JavaScript SDK.
const otelDir = "testdata/otel"

// TestOTLPNodeExporter: @opentelemetry/exporter-trace-otlp-http from Node (OTLP/JSON, its
// default) sends vLLM-shaped and GenAI spans; they land in LLM_EVENTS with exact counts per
// layer. Without node it skips, except under CI=true.
func TestOTLPNodeExporter(t *testing.T) {
	nodetest.Need(t, otelDir)
	base, httpAddr, _, js, stop := otlpRig(t)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "run.mjs", "http://"+httpAddr+"/v1/traces", "tok", "120", "80", "15")
	cmd.Dir = otelDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node run.mjs: %v\n%s", err, stderr.String())
	}
	var res struct{ Exports, Failed int }
	if err := json.Unmarshal(out, &res); err != nil || res.Exports == 0 || res.Failed != 0 {
		t.Fatalf("node exports %s (%v)\n%s", out, err, stderr.String())
	}
	waitMsgs(t, js, 200)
	got := layerCounts(t, js)
	if got[events.LayerEngine] != 120 || got[events.LayerApp] != 80 {
		t.Fatalf("events per layer %v, want engine 120, app 80", got)
	}
	if n := metric(t, base, "emitter_otlp_spans_ignored_total"); n != 15 {
		t.Fatalf("%v spans ignored, want 15", n)
	}
}

// BenchmarkOTLPIngestNATS posts OTLP/HTTP protobuf requests of 1,000 vLLM llm_request spans
// each to POST /v1/traces from four clients and counts the spans per second until all of
// them are stored in LLM_EVENTS by the real NATS, as BenchmarkIngestNATS does for NDJSON.
// The bodies are encoded before the clock starts (ptraceotlp, what the collector's exporter
// sends); client, emitter and nats-server share the process and the machine's cores.
// Run it with -benchtime=200x.
func BenchmarkOTLPIngestNATS(b *testing.B) {
	httpAddr := freeAddr(b)
	_, js, stop := serveRig(b, "EMITTER_PUBLISH_BUFFER=1000000", "EMITTER_PUBLISH_BUFFER_BYTES=1073741824", "EMITTER_OTLP_HTTP_ADDR="+httpAddr)
	defer stop()
	const batch = 1000
	bodies := make([][]byte, b.N)
	arrival := pcommon.NewTimestampFromTime(time.Now().Add(-time.Minute))
	for k := range bodies {
		td := ptrace.NewTraces()
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", "vllm")
		rs.Resource().Attributes().PutStr("deployment.environment.name", "prod")
		rs.Resource().Attributes().PutStr("host.name", "gpu-node-1")
		spans := rs.ScopeSpans().AppendEmpty().Spans()
		spans.EnsureCapacity(batch)
		for i := range batch {
			s := spans.AppendEmpty()
			s.SetName("llm_request")
			s.SetKind(ptrace.SpanKindServer)
			var tid pcommon.TraceID
			binary.BigEndian.PutUint64(tid[:8], uint64(k)+1)
			binary.BigEndian.PutUint64(tid[8:], uint64(i)+1)
			s.SetTraceID(tid)
			s.SetSpanID(pcommon.SpanID{1, 2, 3, 4, 5, 6, 7, 8})
			s.SetStartTimestamp(arrival)
			s.SetEndTimestamp(arrival + 3_300_000_000)
			a := s.Attributes()
			a.PutStr("gen_ai.response.model", "meta-llama/Llama-3.1-70B-Instruct")
			a.PutStr("gen_ai.request.id", fmt.Sprintf("cmpl-%d-%d", k, i))
			a.PutInt("gen_ai.request.max_tokens", 256)
			a.PutInt("gen_ai.usage.prompt_tokens", 1024)
			a.PutInt("gen_ai.usage.completion_tokens", 128)
			a.PutDouble("gen_ai.latency.time_in_queue", 0.012)
			a.PutDouble("gen_ai.latency.time_to_first_token", 0.2105)
			a.PutDouble("gen_ai.latency.e2e", 3.30025)
			a.PutDouble("gen_ai.latency.time_in_model_prefill", 0.19)
			a.PutDouble("gen_ai.latency.time_in_model_decode", 3.08)
			a.PutDouble("gen_ai.latency.time_in_model_inference", 3.27)
		}
		body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		if err != nil {
			b.Fatal(err)
		}
		bodies[k] = body
	}
	url := "http://" + httpAddr + "/v1/traces"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var next, retries atomic.Int64
	b.SetParallelism(2) // four clients with GOMAXPROCS 2
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), selfCPU()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := bodies[next.Add(1)-1]
			// A 503 means the publish buffer is full: back off and send the request again,
			// as an OTLP exporter does; JetStream drops what got through twice.
			for {
				resp, err := client.Post(url, "application/x-protobuf", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
				if resp.StatusCode != 503 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				retries.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	n := int(next.Load())
	waitMsgs(b, js, uint64(n*batch))
	b.ReportMetric(float64(n*batch)/time.Since(start).Seconds(), "spans/s")
	b.ReportMetric(float64((selfCPU()-cpu0).Microseconds())/float64(n*batch), "cpu-µs/span")
	b.ReportMetric(float64(retries.Load()), "retried-requests")
}

// startFakeLLM runs `emitter fakellm` with args and environ and returns its base URL and a
// stop function that waits for it to end (flushing its spans).
func startFakeLLM(t *testing.T, environ map[string]string, args ...string) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runFakeLLM(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), environ, out, io.Discard)
	}()
	addr := regexp.MustCompile(`http://[0-9.:]+`)
	for deadline := time.Now().Add(10 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		base = addr.FindString(out.String())
	}
	if base == "" {
		cancel()
		t.Fatalf("the fake never said where it listens: %q", out.String())
	}
	return base, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestFakeLLMSpansThroughTheProxy: the fake, given the emitter's OTLP endpoint, exports an
// llm_request span for each request; through the proxy each request is then two events, a
// gateway one and an engine one, both of the trace the client started. The receiver's token
// is -otlp-token, or EMITTER_INGEST_TOKEN from the environment (kept off the command line).
func TestFakeLLMSpansThroughTheProxy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		environ map[string]string
	}{
		{"latency model, http/protobuf", []string{"-otlp-protocol", "http/protobuf", "-otlp-token", "tok"}, nil},
		{"scheduler, grpc", []string{"-otlp-protocol", "grpc", "-max-batch", "1", "-otlp-token", "tok"}, nil},
		{"token from the environment", []string{"-otlp-protocol", "http/protobuf"}, map[string]string{"EMITTER_INGEST_TOKEN": "tok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
			endpoint := "http://" + httpAddr
			if tc.args[1] == "grpc" {
				endpoint = "http://" + grpcAddr
			}
			fake, stopFake := startFakeLLM(t, tc.environ, append([]string{"-ttft", "20ms", "-tpot", "2ms", "-tokens", "5",
				"-otlp-endpoint", endpoint}, tc.args...)...)
			base, js, stop := serveRig(t, "EMITTER_INGEST_TOKEN=tok", "EMITTER_OTLP_HTTP_ADDR="+httpAddr,
				"EMITTER_OTLP_GRPC_ADDR="+grpcAddr, "EMITTER_UPSTREAM_URL="+fake)
			defer stop()
			const n = 6 // and one more without a traceparent: the proxy starts its trace
			for i := range n + 1 {
				traceID := fmt.Sprintf("%032x", i+1)
				req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(
					`{"model":"llama","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"a b c"}]}`))
				if i < n {
					req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			stopFake() // flushes the batched spans
			waitMsgs(t, js, 2*(n+1))
			got, traces := layerEvents(t, js)
			if got[events.LayerGateway] != n+1 || got[events.LayerEngine] != n+1 {
				t.Fatalf("events per layer %v, want %d gateway and %d engine", got, n+1, n+1)
			}
			// The proxy forwards the client's traceparent, or starts one: both layers of a
			// request share its trace.
			for i := range n {
				if id := fmt.Sprintf("%032x", i+1); traces[id] == nil {
					t.Fatalf("no events of trace %s: %v", id, traces)
				}
			}
			for id, tr := range traces {
				if len(traces) != n+1 || tr[events.LayerEngine] != 1 || tr[events.LayerGateway] != 1 {
					t.Fatalf("trace %s has %v, want one gateway and one engine event (%v)", id, tr, traces)
				}
			}
		})
	}
}
