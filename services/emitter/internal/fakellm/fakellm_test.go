package fakellm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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
			[]string{`"delta":{"role":"assistant"`, `"finish_reason":"stop"`, `"usage":{"prompt_tokens":3,"completion_tokens":3`, "data: [DONE]\n\n"}},
		{"chat stream without usage", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a b"}]}]}`,
			[]string{"data: [DONE]\n\n"}},
		{"completions", "/v1/completions", `{"model":"m","prompt":"a b","max_tokens":2}`, []string{`"object":"text_completion"`, `"completion_tokens":2`}},
		{"messages stream", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":2,"system":"be brief","messages":[{"role":"user","content":"a"}]}`,
			[]string{"event: message_start", `"input_tokens":3`, "event: ping", "event: content_block_delta", `"output_tokens":2`, "event: message_stop"}},
		{"messages", "/v1/messages", `{"model":"claude","max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, []string{`"type":"message"`, `"output_tokens":3`}},
		{"responses stream", "/v1/responses", `{"model":"m","stream":true,"instructions":"be brief","input":"a b"}`,
			[]string{"event: response.created", "event: response.output_text.delta", `"sequence_number":6}`, "event: response.completed", `"status":"completed"`, `"usage":{"input_tokens":4,`, `"output_tokens":3`}},
		{"responses cut by max_output_tokens", "/v1/responses", `{"model":"m","max_output_tokens":2,"input":[{"role":"user","content":[{"type":"input_text","text":"a b"}]}]}`,
			[]string{`"object":"response"`, `"status":"incomplete"`, `"incomplete_details":{"reason":"max_output_tokens"}`, `"input_tokens":2,`, `"output_tokens":2`}},
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

// TestGoldenOutput pins the fake's bytes: clients' fixtures and the direct-versus-proxy
// comparisons rely on them staying the same. UPDATE_GOLDEN=1 rewrites testdata/golden.
func TestGoldenOutput(t *testing.T) {
	s := New(Options{Tokens: 4})
	cases := []struct{ name, path, body, mode string }{
		{"chat_stream", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"a b c"}]}`, ""},
		{"chat_stream_usage", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a \"b\" c"}]}`, ""},
		{"chat_whole", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"a b c"}]}`, ""},
		{"completions_stream_usage", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"a b","stream":true,"stream_options":{"include_usage":true}}`, ""},
		{"completions_whole", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"a b"}`, ""},
		{"messages_stream", "/v1/messages", `{"model":"claude-x","stream":true,"max_tokens":3,"system":"be brief","messages":[{"role":"user","content":"a"}]}`, ""},
		{"messages_whole", "/v1/messages", `{"model":"claude-x","max_tokens":3,"messages":[{"role":"user","content":"a"}]}`, ""},
		{"chat_stream_malformed", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"a"}]}`, ModeMalformed},
		{"chat_stream_sse_error", "/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"a"}]}`, ModeSSEError},
		{"messages_stream_sse_error", "/v1/messages", `{"model":"claude-x","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, ModeSSEError},
		{"chat_ratelimit", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"a"}]}`, ModeRateLimit},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.mode != "" {
				hdr["X-Fakellm-Mode"] = c.mode
			}
			rec := post(t, s, c.path, c.body, hdr)
			got := fmt.Sprintf("%d %s\n\n%s", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
			path := filepath.Join("testdata", "golden", c.name+".txt")
			if os.Getenv("UPDATE_GOLDEN") == "1" {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("output changed:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestStopReason: the fake ends like a model, with end_turn / stop when it stops at the
// length it chose, and max_tokens / length only when the request's limit cuts it short.
func TestStopReason(t *testing.T) {
	s := New(Options{Tokens: 5})
	f := func(name, path, body, tokensHeader, want, wantTokens string) {
		t.Helper()
		hdr := map[string]string{}
		if tokensHeader != "" {
			hdr["X-Fakellm-Tokens"] = tokensHeader
		}
		got := post(t, s, path, body, hdr).Body.String()
		if !strings.Contains(got, want) || !strings.Contains(got, wantTokens) {
			t.Fatalf("%s: body lacks %s or %s:\n%s", name, want, wantTokens, got)
		}
	}
	const msg = `"messages":[{"role":"user","content":"hi"}]`
	// Claude Code asks for up to 32,000 tokens: the fake says its 5 and stops on its own.
	f("messages, limit above", "/v1/messages", `{"model":"claude","max_tokens":32000,`+msg+`}`, "", `"stop_reason":"end_turn"`, `"output_tokens":5`)
	f("messages stream, limit above", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":32000,`+msg+`}`, "", `"stop_reason":"end_turn"`, `"output_tokens":5}`)
	f("messages, limit equal", "/v1/messages", `{"model":"claude","max_tokens":5,`+msg+`}`, "", `"stop_reason":"end_turn"`, `"output_tokens":5`)
	f("messages, limit below", "/v1/messages", `{"model":"claude","max_tokens":2,`+msg+`}`, "", `"stop_reason":"max_tokens"`, `"output_tokens":2`)
	f("messages stream, limit below", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":2,`+msg+`}`, "", `"stop_reason":"max_tokens"`, `"output_tokens":2}`)
	f("messages, header over limit", "/v1/messages", `{"model":"claude","max_tokens":7,`+msg+`}`, "9", `"stop_reason":"max_tokens"`, `"output_tokens":9`)
	f("messages, header at limit", "/v1/messages", `{"model":"claude","max_tokens":9,`+msg+`}`, "9", `"stop_reason":"end_turn"`, `"output_tokens":9`)
	f("messages, header under limit", "/v1/messages", `{"model":"claude","max_tokens":70,`+msg+`}`, "9", `"stop_reason":"end_turn"`, `"output_tokens":9`)
	f("chat, no limit", "/v1/chat/completions", `{"model":"gpt",`+msg+`}`, "", `"finish_reason":"stop"`, `"completion_tokens":5`)
	f("chat, max_completion_tokens below", "/v1/chat/completions", `{"model":"gpt","max_completion_tokens":3,`+msg+`}`, "", `"finish_reason":"length"`, `"completion_tokens":3`)
	f("chat stream, limit below", "/v1/chat/completions", `{"model":"gpt","stream":true,"stream_options":{"include_usage":true},"max_tokens":3,`+msg+`}`, "", `"finish_reason":"length"`, `"completion_tokens":3`)
	f("chat stream, limit above", "/v1/chat/completions", `{"model":"gpt","stream":true,"stream_options":{"include_usage":true},"max_tokens":300,`+msg+`}`, "", `"finish_reason":"stop"`, `"completion_tokens":5`)
	f("completions, limit below", "/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`, "", `"finish_reason":"length"`, `"completion_tokens":1`)
	f("completions stream, limit above", "/v1/completions", `{"model":"m","prompt":"a","stream":true,"stream_options":{"include_usage":true},"max_tokens":100}`, "", `"finish_reason":"stop"`, `"completion_tokens":5`)
}

// TestBodyBounded: a request body over MaxBody is refused with 413, not read into memory
// whole.
func TestBodyBounded(t *testing.T) {
	srv := httptest.NewServer(New(Options{Tokens: 1}))
	defer srv.Close()
	body := io.MultiReader(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`), io.LimitReader(zeros{}, MaxBody), strings.NewReader(`"}]}`))
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

// TestControlHeadersBounded: a control header outside its bound, or one that does not
// parse, is answered 400 naming the header and quoting (the start of) its value, in the
// protocol's error shape, before anything is streamed or allocated for it.
func TestControlHeadersBounded(t *testing.T) {
	s := New(Options{Tokens: 2})
	long := strings.Repeat("9", 10_000)
	tests := []struct {
		name  string
		path  string
		hdr   map[string]string
		quote string // what the message must quote; "" when it is the value itself
	}{
		{"tokens over the maximum", "/v1/chat/completions", map[string]string{"X-Fakellm-Tokens": "1000001"}, ""},
		{"tokens far over", "/v1/messages", map[string]string{"X-Fakellm-Tokens": "9223372036854775807"}, ""},
		{"tokens overflowing int", "/v1/chat/completions", map[string]string{"X-Fakellm-Tokens": long}, strings.Repeat("9", maxQuoted) + "…"},
		{"tokens zero", "/v1/completions", map[string]string{"X-Fakellm-Tokens": "0"}, ""},
		{"tokens negative", "/v1/chat/completions", map[string]string{"X-Fakellm-Tokens": "-5"}, ""},
		{"tokens not a number", "/v1/chat/completions", map[string]string{"X-Fakellm-Tokens": "lots"}, ""},
		{"cached negative", "/v1/chat/completions", map[string]string{"X-Fakellm-Cached": "-1"}, ""},
		{"cached over", "/v1/messages", map[string]string{"X-Fakellm-Cached": "1000001"}, ""},
		{"ttft over", "/v1/chat/completions", map[string]string{"X-Fakellm-TTFT": "11m"}, ""},
		{"ttft negative", "/v1/chat/completions", map[string]string{"X-Fakellm-TTFT": "-1s"}, ""},
		{"tpot over", "/v1/chat/completions", map[string]string{"X-Fakellm-TPOT": "2562047h"}, ""},
		{"tpot not a duration", "/v1/messages", map[string]string{"X-Fakellm-TPOT": "fast"}, ""},
		{"mode unknown", "/v1/chat/completions", map[string]string{"X-Fakellm-Mode": "explode"}, ""},
		{"mode with invalid UTF-8", "/v1/chat/completions", map[string]string{"X-Fakellm-Mode": "\xff\xfe" + strings.Repeat("x", 100)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := post(t, s, tt.path, `{"model":"m","stream":true,"messages":[]}`, tt.hdr)
			body := rec.Body.String()
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %.200s", rec.Code, body)
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type, Message string
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatalf("the error body is not JSON: %v: %s", err, body)
			}
			if e.Error.Type != "invalid_request_error" {
				t.Fatalf("error type %q", e.Error.Type)
			}
			for name, v := range tt.hdr {
				if !strings.Contains(e.Error.Message, name) {
					t.Fatalf("the message does not name %s: %s", name, e.Error.Message)
				}
				quote := tt.quote
				if quote == "" && len(v) <= maxQuoted {
					quote = v
				}
				if quote != "" && !strings.Contains(e.Error.Message, quote) {
					t.Fatalf("the message does not quote %q: %s", quote, e.Error.Message)
				}
			}
			if len(body) > 512 {
				t.Fatalf("a %d-byte error body: the value is not cut short", len(body))
			}
		})
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
	req.Header.Add("X-Fakellm-Tokens", "2")
	req.Header.Add("X-Fakellm-Tokens", "900000")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `\"2, 900000\"`) {
		t.Fatalf("a header given twice: %d %s", rec.Code, rec.Body)
	}
}

// TestAnswerDurationBounded: headers that each stay within their bound but together would
// keep a stream open for days are refused; the flags alone are the operator's choice.
func TestAnswerDurationBounded(t *testing.T) {
	s := New(Options{Tokens: 2, TPOT: 10 * time.Second})
	f := func(hdr map[string]string, want int) {
		t.Helper()
		rec := post(t, s, "/v1/chat/completions", `{"model":"m","messages":[]}`, hdr)
		if rec.Code != want {
			t.Fatalf("%v: status %d, want %d: %s", hdr, rec.Code, want, rec.Body)
		}
		if want == 400 && !strings.Contains(rec.Body.String(), "over the 1h0m0s maximum") {
			t.Fatalf("%v: %s", hdr, rec.Body)
		}
	}
	f(map[string]string{"X-Fakellm-Tokens": "1000000", "X-Fakellm-TPOT": "10s"}, 400)
	f(map[string]string{"X-Fakellm-Tokens": "362"}, 400) // with -tpot 10s: 3610 s
	f(map[string]string{"X-Fakellm-TTFT": "10m", "X-Fakellm-Tokens": "400", "X-Fakellm-TPOT": "8s"}, 400)
	f(map[string]string{"X-Fakellm-Tokens": "3", "X-Fakellm-TPOT": "0s", "X-Fakellm-TTFT": "0s"}, 200)
	f(map[string]string{"X-Fakellm-Mode": "", "X-Fakellm-TPOT": "0s"}, 200) // empty: no header
}
