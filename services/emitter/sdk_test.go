package main

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/tokenscope/tokenscope/services/emitter/internal/nodetest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// sdkDir holds the Node project that drives endpoints with the official SDKs.
const sdkDir = "testdata/sdk"

func needNode(t *testing.T) { nodetest.Need(t, sdkDir) }

func runSDK(t *testing.T, base string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "run.mjs", base)
	cmd.Dir = sdkDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node run.mjs %s: %v\n%s", base, err, stderr.String())
	}
	return out
}

// TestOfficialSDKs drives the proxy with the openai and @anthropic-ai/sdk packages and checks
// that what the SDKs return is identical to a direct call, and that each call became an event.
func TestOfficialSDKs(t *testing.T) {
	needNode(t)
	// 6 tokens: the SDKs' max_tokens 6 lets the fake stop on its own, the completion's 4 cuts it short.
	officialSDKs(t, fakellm.Options{TTFT: 5 * time.Millisecond, Tokens: 6}, func(string) {})
}

// TestOfficialSDKsDetached is TestOfficialSDKs with streams that last long enough for the
// proxy to take them off net/http (internal/proxy, detach.go) and give their connections back
// for the SDKs' next requests.
func TestOfficialSDKsDetached(t *testing.T) {
	needNode(t)
	officialSDKs(t, fakellm.Options{TTFT: 5 * time.Millisecond, TPOT: 150 * time.Millisecond, Tokens: 6}, func(base string) {
		if n := metric(t, base, "emitter_proxy_detached_streams_total"); n != 3 {
			t.Fatalf("%v streams detached, want the 3 streamed calls'", n)
		}
	})
}

// officialSDKs runs the SDK comparison against a fake answering as opts says, then check.
func officialSDKs(t *testing.T, opts fakellm.Options, check func(base string)) {
	base, js, stop := serveRigWith(t, opts)
	defer stop()
	fakeURL := fakeUpstream(t, base)

	direct := runSDK(t, fakeURL)
	via := runSDK(t, base)
	if !bytes.Equal(direct, via) {
		t.Fatalf("the SDKs saw different results through the proxy:\nvia   %s\ndirect %s", via, direct)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(via, &got); err != nil {
		t.Fatal(err)
	}
	if s := string(got["openai_stream"]); strings.Contains(s, `"usage":{`) {
		t.Fatalf("the usage chunk the proxy asked for reached the client: %s", s)
	}
	if s := string(got["openai_stream_usage"]); !strings.Contains(s, `"usage":{`) {
		t.Fatalf("the usage chunk the client asked for is missing: %s", s)
	}
	if s := string(got["openai_429"]); !strings.Contains(s, `"status":429`) || !strings.Contains(s, "RateLimitError") {
		t.Fatalf("429 seen by the SDK as %s", s)
	}
	if s := string(got["anthropic_final"]); !strings.Contains(s, `"output_tokens":6`) || !strings.Contains(s, `"stop_reason":"end_turn"`) {
		t.Fatalf("anthropic final message %s", s)
	}

	waitMsgs(t, js, 7)
	st, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[string]int{}
	for seq := uint64(1); seq <= 7; seq++ {
		m, err := st.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev events.RequestEvent
		if err := events.UnmarshalRequest(m.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Scene != "sdk" || (ev.Status == events.StatusOK && ev.TokensEstimated) {
			t.Fatalf("event %+v", ev)
		}
		statuses[string(ev.Status)+"/"+ev.ErrorCode]++
	}
	if statuses["ok/"] != 6 || statuses["error/429"] != 1 {
		t.Fatalf("statuses %v", statuses)
	}
	check(base)
}

// TestCurl checks the proxy with curl, streamed (-N, no buffering) and not, with and without
// compression: the bytes curl prints must equal a direct call's.
func TestCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl is required under CI")
		}
		t.Skip("curl not found")
	}
	base, js, stop := serveRig(t)
	defer stop()
	fake := fakeUpstream(t, base)
	curl := func(url string, args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "curl", append([]string{"-sS", "-N", "--fail-with-body", url}, args...)...).Output()
		if err != nil {
			t.Fatalf("curl %s %v: %v\n%s", url, args, err, out)
		}
		return out
	}
	cases := [][]string{
		{"/v1/chat/completions", "-H", "Authorization: Bearer sk-x", "-d", `{"model":"gpt-4o","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", "-H", "x-api-key: sk-ant", "-H", "anthropic-version: 2023-06-01", "-d", `{"model":"claude-x","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", "--compressed", "-H", "X-Fakellm-Mode: gzip", "-d", `{"model":"gpt-4o","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`},
		// Long enough for the proxy to take the stream off net/http (internal/proxy, detach.go).
		{"/v1/chat/completions", "-H", "X-Fakellm-TPOT: 100ms", "-H", "X-Fakellm-Tokens: 8", "-d", `{"model":"gpt-4o","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, c := range cases {
		direct := curl(fake+c[0], c[1:]...)
		via := curl(base+c[0], c[1:]...)
		if !bytes.Equal(direct, via) || len(via) == 0 {
			t.Fatalf("curl %v via proxy:\n%s\ndirect:\n%s", c, via, direct)
		}
	}
	waitMsgs(t, js, uint64(len(cases)))
	if n := metric(t, base, "emitter_proxy_detached_streams_total"); n != 1 {
		t.Fatalf("%v streams detached, want the slow one", n)
	}
}
