package fakellm

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func post(t *testing.T, h http.Handler, path, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestProtocols(t *testing.T) {
	s := New(Options{Tokens: 3})
	tests := []struct {
		name, path, body string
		contains         []string
	}{
		{"chat stream with usage", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b c"}]}`,
			[]string{`"delta":{"role":"assistant"`, `"finish_reason":"length"`, `"usage":{"prompt_tokens":3,"completion_tokens":3`, "data: [DONE]\n\n"}},
		{"chat stream without usage", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a b"}]}]}`,
			[]string{"data: [DONE]\n\n"}},
		{"completions", "/v1/completions", `{"model":"m","prompt":"a b","max_tokens":2}`, []string{`"object":"text_completion"`, `"completion_tokens":2`}},
		{"messages stream", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":2,"system":"be brief","messages":[{"role":"user","content":"a"}]}`,
			[]string{"event: message_start", `"input_tokens":3`, "event: ping", "event: content_block_delta", `"output_tokens":2`, "event: message_stop"}},
		{"messages", "/v1/messages", `{"model":"claude","max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, []string{`"type":"message"`, `"output_tokens":4`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := post(t, s, tt.path, tt.body, nil)
			body := rec.Body.String()
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, body)
			}
			for _, want := range tt.contains {
				if !strings.Contains(body, want) {
					t.Fatalf("body lacks %q:\n%s", want, body)
				}
			}
			if strings.Contains(tt.name, "without usage") && strings.Contains(body, `"usage"`) {
				t.Fatalf("usage sent unasked:\n%s", body)
			}
			if again := post(t, s, tt.path, tt.body, nil).Body.String(); again != body {
				t.Fatal("the same request got a different answer")
			}
		})
	}
	if rec := post(t, s, "/v1/chat/completions", `{"messages":[]}`, nil); rec.Code != 400 || !strings.Contains(rec.Body.String(), "model is required") {
		t.Fatalf("no model: %d %s", rec.Code, rec.Body)
	}
}

func TestFailureRates(t *testing.T) {
	s := New(Options{Tokens: 2, ErrorRate: 0.3, RateLimitRate: 0.2, Seed: 9})
	counts := map[int]int{}
	for range 1000 {
		counts[post(t, s, "/v1/chat/completions", `{"model":"m","messages":[]}`, nil).Code]++
	}
	if counts[500] < 250 || counts[500] > 350 || counts[429] < 150 || counts[429] > 250 {
		t.Fatalf("status counts %v for 30%% errors and 20%% rate limits", counts)
	}
}

func TestTimingAndStall(t *testing.T) {
	srv := httptest.NewServer(New(Options{TTFT: 50 * time.Millisecond, TPOT: 10 * time.Millisecond, Tokens: 4}))
	defer srv.Close()
	start := time.Now()
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if took := time.Since(start); took < 80*time.Millisecond {
		t.Fatalf("4 tokens after a 50ms TTFT at 10ms TPOT took only %v", took)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	req.Header.Set("X-Fakellm-Mode", ModeDisconnect)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("a disconnect mode stream ended cleanly")
	}
}
