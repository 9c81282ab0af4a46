package meter

import (
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestResponsesTypeWinsOverEventName: OpenAI's SDKs read a Responses event by its JSON
// type, not by its event: line, so the meter must too: a response.completed sent under
// another event name still ends the stream with its usage, and an error event under another
// name still fails it.
func TestResponsesTypeWinsOverEventName(t *testing.T) {
	const delta = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"
	tests := []struct {
		name, stream string
		status       events.Status
		code         string
		usage        Usage
		estimated    bool
	}{
		{"completed under a delta's name", delta + "event: response.output_text.delta\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}\n\n",
			events.StatusOK, "", Usage{9, 4, 0}, false},
		{"error under another name", delta + "event: response.in_progress\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"m\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}\n\n",
			events.StatusError, "server_error", Usage{9, 4, 0}, false},
		{"failed under an item's name", delta + "event: response.output_item.done\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\"},\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}\n\n",
			events.StatusError, "server_error", Usage{9, 4, 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, OpenAIResponses, tt.stream)
			if st, code := r.Status(true); st != tt.status || code != tt.code {
				t.Errorf("status %s %q, want %s %q", st, code, tt.status, tt.code)
			}
			if r.Usage != tt.usage || r.Estimated != tt.estimated {
				t.Errorf("usage %+v estimated %v, want %+v %v", r.Usage, r.Estimated, tt.usage, tt.estimated)
			}
		})
	}
}

// TestEscapedErrorObject: the decoder reads "\u0065rror" as "error", as the clients do, so
// the fast path must not vouch for a chunk whose object is written so.
func TestEscapedErrorObject(t *testing.T) {
	const chunk = `{"object":"\u0065rror","message":"boom","type":"InternalServerError","code":500}`
	if _, ok := openAIFast([]byte(chunk)); ok {
		t.Fatalf("openAIFast vouched for %s", chunk)
	}
	r := feedSSE(t, OpenAIChat, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: "+chunk+"\n\ndata: [DONE]\n\n")
	if st, code := r.Status(true); st != events.StatusError || code != "InternalServerError" {
		t.Fatalf("status %s %q, want error InternalServerError", st, code)
	}
}

// TestNotErrorChunks: text that merely spells an error, in content, in a tool call's
// arguments (a string, or an object as some servers send), or an object member below the
// top, is no error.
func TestNotErrorChunks(t *testing.T) {
	for _, chunk := range []string{
		`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"{\"object\":\"error\",\"error\":\"x\"}"}}]}`,
		`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"error\":\"e\",\"object\":\"error\"}"}}]}}]}`,
		`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":{"error":"e","object":"error"}}}]}}]}`,
		`{"object":"chat.completion.chunk","choices":[{"index":0,"object":"error","delta":{"content":"hi"},"logprobs":{"error":"x"}}]}`,
	} {
		r := feedSSE(t, OpenAIChat, "data: "+chunk+"\n\ndata: [DONE]\n\n")
		if st, code := r.Status(true); st != events.StatusOK || r.ContentEvents != 1 {
			t.Errorf("%s: status %s %q, %d content events, want ok and 1", chunk, st, code, r.ContentEvents)
		}
	}
}

// TestRealZerosAndSplitCounts: a count of zero is a count, not an absent one; Anthropic's
// output count in message_delta with the input in message_start is a whole usage.
func TestRealZerosAndSplitCounts(t *testing.T) {
	tests := []struct {
		name   string
		proto  Protocol
		stream string
		usage  Usage
	}{
		{"chat: completion_tokens 0", OpenAIChat, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":0}}\n\ndata: [DONE]\n\n", Usage{5, 0, 0}},
		{"completions: prompt_tokens 0", OpenAICompletions, "data: {\"choices\":[{\"text\":\"x\",\"index\":0}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n", Usage{0, 3, 0}},
		{"responses: output_tokens 0", OpenAIResponses, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n", Usage{5, 0, 0}},
		{"anthropic: input in message_start, output in message_delta", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", Usage{24, 9, 4}},
		{"anthropic: output_tokens 0", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":0}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", Usage{20, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, tt.proto, tt.stream)
			if r.Usage != tt.usage || r.Estimated {
				t.Fatalf("usage %+v estimated %v, want %+v reported", r.Usage, r.Estimated, tt.usage)
			}
		})
	}
	for _, b := range []struct {
		name  string
		proto Protocol
		body  string
		usage Usage
	}{
		{"chat body: completion_tokens 0", OpenAIChat, `{"choices":[{"message":{"content":""}}],"usage":{"prompt_tokens":5,"completion_tokens":0}}`, Usage{5, 0, 0}},
		{"anthropic body", Anthropic, `{"type":"message","content":[],"usage":{"input_tokens":5,"output_tokens":0}}`, Usage{5, 0, 0}},
		{"responses body", OpenAIResponses, `{"object":"response","status":"completed","output":[],"usage":{"input_tokens":5,"output_tokens":0}}`, Usage{5, 0, 0}},
	} {
		m := New(b.proto, false, t0)
		m.SetInputEstimate(7)
		m.Feed([]byte(b.body), t0, nil)
		if r := m.Result(t0); r.Usage != b.usage || r.Estimated {
			t.Errorf("%s: usage %+v estimated %v, want %+v reported", b.name, r.Usage, r.Estimated, b.usage)
		}
	}
}

// TestObjectNotAString: a chunk whose object member is no string is no error chunk, and its
// usage is read, as before error chunks were read: it is not malformed.
func TestObjectNotAString(t *testing.T) {
	r := feedSSE(t, OpenAIChat, "data: {\"object\":1,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"+
		"data: {\"object\":{\"x\":1},\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	if st, code := r.Status(true); st != events.StatusOK || r.Usage != (Usage{5, 1, 0}) {
		t.Fatalf("status %s %q usage %+v, want ok {5 1 0}", st, code, r.Usage)
	}
}

// TestAnthropicBodyWithoutOutputCount: a body whose usage leaves output_tokens out has not
// counted it as zero: it is estimated from the content, as a stream's would be.
func TestAnthropicBodyWithoutOutputCount(t *testing.T) {
	for _, b := range []struct {
		body  string
		usage Usage
	}{
		{`{"type":"message","content":[{"type":"text","text":"abcdefgh"}],"usage":{"input_tokens":5}}`, Usage{5, 2, 0}},
		{`{"type":"message","content":[{"type":"text","text":"abcdefgh"}],"usage":{}}`, Usage{7, 2, 0}},
		{`{"type":"message","content":[{"type":"text","text":"abcdefgh"}],"usage":{"input_tokens":5,"output_tokens":null}}`, Usage{5, 2, 0}},
	} {
		m := New(Anthropic, false, t0)
		m.SetInputEstimate(7)
		m.Feed([]byte(b.body), t0, nil)
		if r := m.Result(t0); r.Usage != b.usage || !r.Estimated {
			t.Errorf("%s: usage %+v estimated %v, want %+v estimated", b.body, r.Usage, r.Estimated, b.usage)
		}
	}
}

// TestEmptyErrorString: the OpenAI SDKs raise on a chunk's error only when it is truthy
// (data.get("error"), data.error): an empty string beside the content is no error.
func TestEmptyErrorString(t *testing.T) {
	r := feedSSE(t, OpenAIChat, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"error\":\"\"}\n\n"+
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1},\"error\":\"\"}\n\ndata: [DONE]\n\n")
	if st, code := r.Status(true); st != events.StatusOK || r.ContentEvents != 1 || r.Usage != (Usage{5, 1, 0}) {
		t.Fatalf("status %s %q, %d content events, usage %+v, want ok, 1, {5 1 0}", st, code, r.ContentEvents, r.Usage)
	}
}
