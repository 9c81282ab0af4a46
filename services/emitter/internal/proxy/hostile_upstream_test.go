package proxy

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// hostileScript is an upstream that sends the pieces of a case, flushing each, sleeping where a
// piece is "", gzipped when the case says so.
func hostileScript(t *testing.T, cases map[string]struct {
	gzip   bool
	sse    bool
	pieces []string
}) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c, ok := cases[r.Header.Get("X-Case")]
		if !ok {
			http.Error(w, "no case", http.StatusBadRequest)
			return
		}
		ct := "application/json"
		if c.sse {
			ct = "text/event-stream"
		}
		w.Header().Set("Content-Type", ct)
		var out io.Writer = w
		var zw *gzip.Writer
		if c.gzip {
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
			out = zw
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for _, p := range c.pieces {
			if p == "" {
				time.Sleep(800 * time.Millisecond)
				continue
			}
			_, _ = io.WriteString(out, p)
			if zw != nil {
				_ = zw.Flush()
			}
			w.(http.Flusher).Flush()
		}
		if zw != nil {
			_ = zw.Close()
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// TestBegunPerProtocol: until the first content event, a silence longer than the idle
// timeout (within the upstream timeout) is a wait, whatever came before it: a role-only
// chunk and a keep-alive comment, Anthropic's message_start and ping, a Responses stream's
// opening events, gzipped or not; a raw (unmeasured) body's head. After the first content,
// the same silence is a stall, on the gzip path too.
func TestBegunPerProtocol(t *testing.T) {
	const (
		role     = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n: ping\n\n"
		content  = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
		aStart   = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n"
		aContent = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		rStart   = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\",\"usage\":null}}\n\n"
		rDelta   = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n"
		rDone    = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n"
	)
	cases := map[string]struct {
		gzip   bool
		sse    bool
		pieces []string
	}{
		"chat":                      {false, true, []string{role, "", content}},
		"anthropic":                 {false, true, []string{aStart, "", aContent}},
		"responses":                 {false, true, []string{rStart, "", rDelta + rDone}},
		"responses gzip":            {true, true, []string{rStart, "", rDelta + rDone}},
		"responses body":            {true, false, []string{"", `{"object":"response","status":"completed","output":[],"usage":{"input_tokens":3,"output_tokens":1}}`}},
		"stall after first":         {true, true, []string{rStart + rDelta, "", rDone}},
		"silent after [DONE]":       {false, true, []string{role + content, ""}},
		"silent after message_stop": {false, true, []string{aStart + aContent, ""}},
		"raw":                       {false, false, []string{"", `{"data":[]}`}},
		"raw stall":                 {false, false, []string{`{"data":`, "", `[]}`}},
	}
	bothClients(t, func(t *testing.T, transport bool) {
		up := hostileScript(t, cases)
		p, cap, _ := newTestProxy(t, up.URL+"/v1", func(c *Config) {
			c.UpstreamTimeout = 3 * time.Second
			c.IdleTimeout = 300 * time.Millisecond
		})
		r := &rig{proxy: serveProxy(t, p, nil, nil), p: p, cap: cap}
		if transport {
			r.viaTransport()
		}
		for _, c := range []struct {
			name, path, body string
			status           events.Status
			code             string
		}{
			{"chat", chatPath, chatBody(true, ""), events.StatusOK, ""},
			{"anthropic", messagesPath, `{"model":"claude-haiku","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, events.StatusOK, ""},
			{"responses", responsesPath, `{"model":"gpt-5","stream":true,"input":"hi"}`, events.StatusOK, ""},
			{"responses gzip", responsesPath, `{"model":"gpt-5","stream":true,"input":"hi"}`, events.StatusOK, ""},
			{"responses body", responsesPath, `{"model":"gpt-5","input":"hi"}`, events.StatusOK, ""},
			{"stall after first", responsesPath, `{"model":"gpt-5","stream":true,"input":"hi"}`, events.StatusTimeout, CodeStreamIdle},
			// Silent once the answer is whole, the body never ended: it is ended for the client.
			{"silent after [DONE]", chatPath, chatBody(true, ""), events.StatusOK, ""},
			{"silent after message_stop", messagesPath, `{"model":"claude-haiku","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, events.StatusOK, ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				via := call(t, r.proxy.URL, c.path, c.body, map[string]string{"X-Case": c.name})
				if via.status != 200 || (c.status == events.StatusOK && via.err != nil) {
					t.Fatalf("client: %d %v", via.status, via.err)
				}
				ev := r.cap.next(t)
				if ev.Status != c.status || ev.ErrorCode != c.code {
					t.Fatalf("event %s %q, want %s %q", ev.Status, ev.ErrorCode, c.status, c.code)
				}
				if c.status == events.StatusOK && (ev.InputTokens != 3 || ev.OutputTokens != 1 || ev.TokensEstimated) {
					t.Fatalf("tokens %d/%d estimated %v, want 3/1", ev.InputTokens, ev.OutputTokens, ev.TokensEstimated)
				}
			})
		}
		// Unmeasured: a GET of a background response's stream, say, waits for its first
		// byte as a measured answer waits for its first token; after it, a stall is cut.
		t.Run("raw", func(t *testing.T) {
			via := call(t, r.proxy.URL, "/v1/embeddings", `{"model":"e","input":"hi"}`, map[string]string{"X-Case": "raw"})
			if via.status != 200 || via.err != nil || string(via.body) != `{"data":[]}` {
				t.Fatalf("client: %d %q %v: a raw body's first byte may come as late as a measured one's", via.status, via.body, via.err)
			}
		})
		t.Run("raw stall", func(t *testing.T) {
			via := call(t, r.proxy.URL, "/v1/embeddings", `{"model":"e","input":"hi"}`, map[string]string{"X-Case": "raw stall"})
			if via.err == nil {
				t.Fatalf("client: %d %q: a raw body silent after its first byte is not cut", via.status, via.body)
			}
		})
	})
}
