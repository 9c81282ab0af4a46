package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a stdout the command writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFakeLLMSchedulerFlags: the scheduler flags turn on vLLM's /metrics; bad values are refused.
func TestFakeLLMSchedulerFlags(t *testing.T) {
	if err := runFakeLLM(context.Background(), []string{"-max-batch", "-1"}, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "-max-batch") {
		t.Fatalf("-max-batch -1: error %v", err)
	}
	for _, bad := range []string{"-error-rate", "-stall-rate"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // accepted, it would serve
		err := runFakeLLM(ctx, []string{"-addr", "127.0.0.1:0", bad, "NaN"}, nil, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Fatalf("%s NaN: error %v", bad, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runFakeLLM(ctx, []string{"-addr", "127.0.0.1:0", "-max-batch", "2", "-kv-tokens", "4096", "-prefix-cache", "-model-name", "llama"}, nil, out, io.Discard)
	}()
	addr := regexp.MustCompile(`http://[0-9.:]+`)
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		base = addr.FindString(out.String())
	}
	if base == "" {
		t.Fatalf("the fake never said where it listens: %q", out.String())
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `vllm:num_requests_waiting{engine="0",model_name="llama"} 0`) {
		t.Fatalf("/metrics: %d\n%s", resp.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
