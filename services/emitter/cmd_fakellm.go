package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

func runFakeLLM(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fakellm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "listen address")
	var o fakellm.Options
	fs.DurationVar(&o.TTFT, "ttft", 200*time.Millisecond, "time to the first token")
	fs.DurationVar(&o.PrefillPer1K, "prefill-per-1k", 20*time.Millisecond, "TTFT added per 1,000 input tokens")
	fs.DurationVar(&o.TPOT, "tpot", 20*time.Millisecond, "time per output token")
	fs.IntVar(&o.Tokens, "tokens", 64, "output tokens it says before it stops on its own (fewer when the request's max_tokens is lower)")
	fs.Float64Var(&o.ErrorRate, "error-rate", 0, "fraction of requests answered 500")
	fs.Float64Var(&o.RateLimitRate, "rate-limit-rate", 0, "fraction of requests answered 429")
	fs.Float64Var(&o.StallRate, "stall-rate", 0, "fraction of streams that hang halfway")
	fs.Float64Var(&o.DisconnectRate, "disconnect-rate", 0, "fraction of streams cut halfway")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed for the failure draws")
	fs.IntVar(&o.MaxBatch, "max-batch", 0, "scheduler: requests running at once, the rest queue (0 with the scheduler on: 256)")
	fs.IntVar(&o.KVTokens, "kv-tokens", 0, "scheduler: KV-cache capacity in tokens; overflow preempts the newest request (0 with the scheduler on: 2^20)")
	fs.BoolVar(&o.PrefixCache, "prefix-cache", false, "scheduler: cache prompt prefixes in 16-token blocks, skipping their prefill")
	fs.IntVar(&o.MaxWaiting, "max-waiting", 4096, "scheduler: requests queued before it answers 503")
	fs.StringVar(&o.ModelName, "model-name", "fake-model", "scheduler: the model_name label on /metrics")
	otlpEndpoint := fs.String("otlp-endpoint", "", "export an llm_request span per request, as vLLM does, to this OTLP receiver (http://host:4318; with none, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT turns it on)")
	otlpProtocol := fs.String("otlp-protocol", "http/protobuf", "OTLP protocol of -otlp-endpoint: http/protobuf or grpc")
	otlpToken := fs.String("otlp-token", "", "bearer token for the OTLP receiver (default $EMITTER_INGEST_TOKEN, which keeps it off the command line)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for name, v := range map[string]int{"max-batch": o.MaxBatch, "kv-tokens": o.KVTokens, "max-waiting": o.MaxWaiting} {
		if v < 0 {
			return fmt.Errorf("-%s=%d must not be negative", name, v)
		}
	}
	for name, v := range map[string]float64{"error-rate": o.ErrorRate, "rate-limit-rate": o.RateLimitRate, "stall-rate": o.StallRate, "disconnect-rate": o.DisconnectRate} {
		if !(v >= 0 && v <= 1) { // NaN too
			return fmt.Errorf("-%s=%g must be between 0 and 1", name, v)
		}
	}
	endpoint := *otlpEndpoint
	if endpoint == "" {
		endpoint = cmp.Or(environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"], environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
	}
	if endpoint != "" {
		tp, err := spanExporter(ctx, endpoint, *otlpProtocol, cmp.Or(*otlpToken, environ["EMITTER_INGEST_TOKEN"]))
		if err != nil {
			return err
		}
		// What is still batched goes out at the end.
		defer func() {
			shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(shut); err != nil {
				fmt.Fprintf(stderr, "cannot export the last spans: %v\n", err)
			}
		}()
		o.Tracer = tp.Tracer("github.com/tokenscope/tokenscope/services/emitter/fakellm")
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", *addr, err)
	}
	mux := http.NewServeMux()
	fake := fakellm.New(o)
	mux.Handle("/v1/", fake)
	mux.Handle("GET /metrics", fake) // vLLM's engine metrics when the scheduler is on, else 404
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "fake LLM on http://%s (OpenAI: /v1/chat/completions, /v1/completions, /v1/responses; Anthropic: /v1/messages)\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("fake LLM stopped: %w", err)
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("cannot shut down the fake LLM: %w", err)
	}
	return nil
}

// spanExporter returns a tracer provider batching spans to the OTLP receiver at endpoint,
// with the resource the OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES variables describe
// (service.name fakellm unless they say otherwise) and the host's name.
func spanExporter(ctx context.Context, endpoint, protocol, token string) (*sdktrace.TracerProvider, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("-otlp-endpoint=%q must be an http:// or https:// URL", ops.RedactURL(endpoint))
	}
	var headers map[string]string
	if token != "" {
		headers = map[string]string{"authorization": "Bearer " + token}
	}
	var exp sdktrace.SpanExporter
	switch protocol {
	case "http/protobuf":
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces" // as OTEL_EXPORTER_OTLP_ENDPOINT is read
		}
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()), otlptracehttp.WithHeaders(headers))
	case "grpc":
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(u.String()), otlptracegrpc.WithHeaders(headers))
	default:
		return nil, fmt.Errorf("-otlp-protocol=%q must be http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot make the OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "fakellm")), resource.WithHost(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("cannot describe the fake's resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
