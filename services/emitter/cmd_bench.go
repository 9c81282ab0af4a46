package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/bench"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
)

func runBench(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8080", "endpoint base URL (the proxy, a fake LLM, or a provider)")
	protocol := fs.String("protocol", "openai", "openai, openai-completions or anthropic")
	model := fs.String("model", "fake-model", "model name")
	classes := fs.String("prompts", "short=128,medium=1024,long=8192", "prompt classes as name=input tokens")
	requests := fs.Int("requests", 20, "requests per prompt class")
	concurrency := fs.Int("concurrency", 1, "requests in flight at once")
	maxTokens := fs.Int("max-tokens", 256, "max_tokens of each request")
	stream := fs.Bool("stream", true, "stream the responses (SSE)")
	timeout := fs.Duration("timeout", 600*time.Second, "per-request timeout")
	out := fs.String("out", "", "write the JSON result here (default bench-<time>.json)")
	compare := fs.String("compare", "", "a previous JSON result to compare with")
	publish := fs.Bool("publish", true, "publish each request's event to NATS (NATS_* variables)")
	scene := fs.String("scene", "bench", "scene of the published events")
	envName := fs.String("env", "bench", "env of the published events")
	apiKey := fs.String("api-key", "", "API key (default $OPENAI_API_KEY or $ANTHROPIC_API_KEY by protocol)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	proto, err := llmclient.ParseProtocol(*protocol)
	if err != nil {
		return fmt.Errorf("-protocol: %w", err)
	}
	cls, err := bench.ParseClasses(*classes)
	if err != nil {
		return fmt.Errorf("-prompts: %w", err)
	}
	var prev *bench.Result
	if *compare != "" {
		if prev, err = readResult(*compare); err != nil {
			return err
		}
	}
	key := *apiKey
	if key == "" {
		key = environ["OPENAI_API_KEY"]
		if proto.Provider() == "anthropic" {
			key = environ["ANTHROPIC_API_KEY"]
		}
	}
	em, stop, err := publishing(ctx, environ, *publish, stderr)
	if err != nil {
		return fmt.Errorf("%w (run with -publish=false to benchmark without NATS)", err)
	}
	client := &llmclient.Client{BaseURL: *url, APIKey: key, Protocol: proto, HTTP: &http.Client{Timeout: *timeout}}
	res, err := bench.Run(ctx, bench.Options{Client: client, Endpoint: ops.RedactURL(*url), Model: *model, Classes: cls, Requests: *requests,
		Concurrency: *concurrency, MaxTokens: *maxTokens, Stream: *stream, Scene: *scene, Env: *envName, Progress: stderr}, em)
	if stopErr := stop(); err == nil && stopErr != nil {
		err = stopErr
	}
	if err != nil {
		return err
	}
	if err := res.WriteTable(stdout); err != nil {
		return err
	}
	if prev != nil {
		fmt.Fprintln(stdout)
		if err := bench.WriteComparison(stdout, prev, res); err != nil {
			return err
		}
	}
	path := *out
	if path == "" {
		path = "bench-" + res.Started.Format("20060102T150405Z") + ".json"
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode the result: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("cannot write the result: %w", err)
	}
	fmt.Fprintf(stdout, "\nresult written to %s\n", path)
	return nil
}

func readResult(path string) (*bench.Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read -compare file: %w", err)
	}
	var r bench.Result
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("cannot parse -compare file %s: %w", path, err)
	}
	return &r, nil
}
