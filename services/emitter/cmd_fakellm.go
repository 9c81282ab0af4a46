package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

func runFakeLLM(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	for name, v := range map[string]int{"max-batch": o.MaxBatch, "kv-tokens": o.KVTokens, "max-waiting": o.MaxWaiting} {
		if v < 0 {
			return fmt.Errorf("-%s=%d must not be negative", name, v)
		}
	}
	for name, v := range map[string]float64{"error-rate": o.ErrorRate, "rate-limit-rate": o.RateLimitRate, "stall-rate": o.StallRate, "disconnect-rate": o.DisconnectRate} {
		if v < 0 || v > 1 {
			return fmt.Errorf("-%s=%g must be between 0 and 1", name, v)
		}
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
	fmt.Fprintf(stdout, "fake LLM on http://%s (OpenAI: /v1/chat/completions, /v1/completions; Anthropic: /v1/messages)\n", ln.Addr())
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
