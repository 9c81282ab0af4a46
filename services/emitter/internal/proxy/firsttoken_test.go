package proxy

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// TestSilentBeforeTheFirstToken: a stream whose upstream sent its head (and opening events)
// at once but whose first token takes longer than the idle timeout (a long prefill, a queue,
// a model reasoning before it answers) is not cut while within the upstream timeout; after
// its first token, a silence as long as the idle timeout cuts it.
func TestSilentBeforeTheFirstToken(t *testing.T) { bothClients(t, testSilentBeforeTheFirstToken) }

func testSilentBeforeTheFirstToken(t *testing.T, transport bool) {
	r := newRig(t, fakellm.Options{TPOT: time.Millisecond, Tokens: 4}, func(c *Config) {
		c.UpstreamTimeout = 5 * time.Second
		c.IdleTimeout = 400 * time.Millisecond
	})
	if transport {
		r.viaTransport()
	}
	anth := `{"model":"claude-haiku","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi there"}]}`
	responses := `{"model":"gpt-5","max_output_tokens":4,"stream":true,"input":"hi there"}`
	for _, c := range []struct{ name, path, body string }{
		{"openai", chatPath, chatBody(true, "")}, {"anthropic", messagesPath, anth}, {"responses", responsesPath, responses},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The fake sends its head and opening events after TTFT/2, its first token TTFT/2 later.
			via := call(t, r.proxy.URL, c.path, c.body, map[string]string{"X-Fakellm-TTFT": "2s"})
			if via.err != nil || via.status != 200 {
				t.Fatalf("client: %d %v", via.status, via.err)
			}
			ev := r.cap.next(t)
			if ev.Status != events.StatusOK || ev.TTFTMs < 1900 {
				t.Fatalf("event %s %q ttft %.0f ms: a first token within the upstream timeout is no stall", ev.Status, ev.ErrorCode, ev.TTFTMs)
			}
		})
	}
	// Still cut when silent past the upstream timeout before its first token, and when silent
	// for the idle timeout after it.
	r2 := newRig(t, fakellm.Options{TPOT: time.Millisecond, Tokens: 8}, func(c *Config) {
		c.UpstreamTimeout = 2 * time.Second
		c.IdleTimeout = 300 * time.Millisecond
	})
	if transport {
		r2.viaTransport()
	}
	for _, c := range []struct {
		name string
		hdr  map[string]string
	}{
		{"no first token within the upstream timeout", map[string]string{"X-Fakellm-TTFT": "2400ms"}}, // the head at 1.2 s
		{"a stall after the first token", map[string]string{"X-Fakellm-Mode": fakellm.ModeStall}},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			call(t, r2.proxy.URL, chatPath, chatBody(true, ""), c.hdr)
			ev := r2.cap.next(t)
			if ev.Status != events.StatusTimeout || ev.ErrorCode != CodeStreamIdle {
				t.Fatalf("event %s %q, want timeout %s", ev.Status, ev.ErrorCode, CodeStreamIdle)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("cut after %v", took)
			}
		})
	}
}
