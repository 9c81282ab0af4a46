package proxy

import (
	"bytes"
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// responsesJS calls the Responses API with the OpenAI SDK: a stream iterated, one through the
// SDK's stream helper, one not streamed, and a stream that fails with an error event.
const responsesJS = `
import OpenAI from "openai";
const base = process.argv[1];
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "sk-test", maxRetries: 0 });
const input = "say something short please";
const out = {};
{
  const s = await openai.responses.create({ model: "gpt-5-mini", input, max_output_tokens: 6, stream: true });
  const evs = [];
  for await (const e of s) evs.push(e);
  out.stream = evs;
}
{
  const s = openai.responses.stream({ model: "gpt-5-mini", input: [{ role: "user", content: input }], max_output_tokens: 6 });
  for await (const e of s) {}
  const r = await s.finalResponse();
  out.final = { text: r.output_text, status: r.status, usage: r.usage };
}
out.whole = await openai.responses.create({ model: "gpt-5-mini", input, max_output_tokens: 6 });
{
  const s = await openai.responses.create({ model: "gpt-5-mini", input, stream: true }, { headers: { "X-Fakellm-Mode": "sse-error" } });
  const types = [];
  for await (const e of s) types.push(e.type);
  out.failed = types;
}
console.log(JSON.stringify(out));
`

// TestResponsesWithOpenAISDK: the OpenAI SDK's Responses API calls get what a direct call
// gets, and each is one event, its tokens the usage of response.completed (or of the body),
// a stream ended by an error event an error.
func TestResponsesWithOpenAISDK(t *testing.T) {
	needNode(t)
	r := newRig(t, fakellm.Options{Tokens: 6, TTFT: 20 * time.Millisecond, TPOT: time.Millisecond}, nil)
	run := func(base string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", "--input-type=module", "-e", responsesJS, base)
		cmd.Dir = sdkDir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node (responses) %s: %v\n%s", base, err, stderr.String())
		}
		return out
	}
	direct, via := run(r.fake.URL), run(r.proxy.URL)
	if !bytes.Equal(direct, via) {
		t.Fatalf("the SDK saw another answer through the proxy:\nvia    %s\ndirect %s", via, direct)
	}
	if !bytes.Contains(via, []byte(`"status":"completed","usage":{"input_tokens":4`)) || !bytes.Contains(via, []byte(`"error"]`)) {
		t.Fatalf("the SDK saw %s", via)
	}
	for _, want := range []struct {
		stream bool
		status events.Status
		code   string
	}{{true, events.StatusOK, ""}, {true, events.StatusOK, ""}, {false, events.StatusOK, ""}, {true, events.StatusError, "server_error"}} {
		ev := r.cap.next(t)
		if ev.Provider != "openai" || ev.Model != "gpt-5-mini" || ev.Stream != want.stream || ev.Status != want.status || ev.ErrorCode != want.code {
			t.Fatalf("event %+v, want stream %v %s %q", ev, want.stream, want.status, want.code)
		}
		if want.status == events.StatusOK && (ev.TokensEstimated || ev.InputTokens != 4 || ev.OutputTokens != 6) {
			t.Fatalf("tokens %d/%d estimated %v, want the usage's 4/6", ev.InputTokens, ev.OutputTokens, ev.TokensEstimated)
		}
		if want.stream && want.status == events.StatusOK && (ev.TTFTMs < 15 || ev.TotalMs < ev.TTFTMs) {
			t.Fatalf("ttft %.1f total %.1f: TTFT must be the first delta's", ev.TTFTMs, ev.TotalMs)
		}
	}
	if n := testutil.ToFloat64(r.p.m.passthrough); n != 0 {
		t.Fatalf("%v Responses calls forwarded unmeasured", n)
	}
}
