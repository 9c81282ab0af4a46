package meter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// splitEvents cuts an SSE capture after each blank line, keeping every byte.
func splitEvents(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := bytes.Index(b, []byte("\n\n"))
		j := bytes.Index(b, []byte("\r\n\r\n"))
		switch {
		case j >= 0 && (i < 0 || j < i):
			out, b = append(out, b[:j+4]), b[j+4:]
		case i >= 0:
			out, b = append(out, b[:i+2]), b[i+2:]
		default:
			out, b = append(out, b), nil
		}
	}
	return out
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStreams(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name       string
		file       string
		proto      Protocol
		ttft, tot  time.Duration
		gap        time.Duration
		usage      Usage
		estimated  bool
		status     events.Status
		code       string
		contentEvs int64
	}{
		{"openai chat: role-only chunk is not the first token", "openai_chat_usage.sse", OpenAIChat, ms(20), ms(30), ms(10), Usage{1200, 2, 1024}, false, events.StatusOK, "", 2},
		{"openai tool calls count as content, CRLF lines", "openai_chat_tools_crlf.sse", OpenAIChat, ms(10), ms(30), ms(10), Usage{7, 3, 0}, true, events.StatusOK, "", 3},
		{"openai completions without usage is estimated", "openai_completions_nousage.sse", OpenAICompletions, ms(10), ms(20), ms(10), Usage{7, 2, 0}, true, events.StatusOK, "", 2},
		{"anthropic: first content_block_delta, cache tokens added to input", "anthropic_messages.sse", Anthropic, ms(40), ms(50), ms(10), Usage{2035, 15, 2000}, false, events.StatusOK, "", 2},
		{"anthropic error event", "anthropic_overloaded.sse", Anthropic, ms(30), ms(30), 0, Usage{40, 1, 0}, true, events.StatusError, "overloaded_error", 1},
		{"openai error event", "openai_error_event.sse", OpenAIChat, ms(20), ms(20), 0, Usage{7, 1, 0}, true, events.StatusError, "server_error", 1},
		{"malformed data line", "openai_malformed.sse", OpenAIChat, ms(10), ms(10), 0, Usage{7, 1, 0}, true, events.StatusError, CodeMalformed, 1},
		{"stream cut before [DONE]", "openai_truncated.sse", OpenAIChat, ms(20), ms(20), 0, Usage{7, 1, 0}, true, events.StatusError, CodeTruncated, 1},
		{"openai responses: first output_text.delta, usage of response.completed", "openai_responses.sse", OpenAIResponses, ms(50), ms(60), ms(10), Usage{1200, 2, 1024}, false, events.StatusOK, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := readFixture(t, tt.file)
			evs := splitEvents(raw)
			check := func(t *testing.T, r Result) {
				t.Helper()
				if r.TTFT != tt.ttft || r.Total != tt.tot || r.MaxGap != tt.gap {
					t.Errorf("ttft %v total %v gap %v, want %v %v %v", r.TTFT, r.Total, r.MaxGap, tt.ttft, tt.tot, tt.gap)
				}
				if r.Usage != tt.usage || r.Estimated != tt.estimated || r.ContentEvents != tt.contentEvs {
					t.Errorf("usage %+v estimated %v content %d, want %+v %v %d", r.Usage, r.Estimated, r.ContentEvents, tt.usage, tt.estimated, tt.contentEvs)
				}
				if st, code := r.Status(true); st != tt.status || code != tt.code {
					t.Errorf("status %s %q, want %s %q", st, code, tt.status, tt.code)
				}
			}
			for _, strip := range []bool{false, true} {
				m := New(tt.proto, true, t0)
				m.SetInputEstimate(7)
				if strip {
					m.StripUsageChunk()
				}
				var out []byte
				for i, ev := range evs {
					out = append(out, m.Feed(ev, t0.Add(time.Duration(i+1)*10*time.Millisecond), nil)...)
				}
				end := t0.Add(time.Second)
				out = m.Flush(end, out)
				check(t, m.Result(end))
				if !strip && !bytes.Equal(out, raw) {
					t.Errorf("forwarded bytes differ from the upstream's")
				}
			}
			// Byte by byte, all arriving at once, the stream waiting (Idle) after each: the
			// same tokens and status.
			m := New(tt.proto, true, t0)
			m.SetInputEstimate(7)
			for i := range raw {
				m.Feed(raw[i:i+1], t0, nil)
				m.Idle()
			}
			m.Flush(t0, nil)
			r := m.Result(t0)
			if r.Usage != tt.usage || r.ContentEvents != tt.contentEvs {
				t.Errorf("byte by byte: usage %+v content %d, want %+v %d", r.Usage, r.ContentEvents, tt.usage, tt.contentEvs)
			}
		})
	}
}

func TestStripUsageChunk(t *testing.T) {
	raw := readFixture(t, "openai_chat_usage.sse")
	evs := splitEvents(raw)
	want := bytes.Join([][]byte{evs[0], evs[1], evs[2], evs[3], evs[5]}, nil)
	for _, step := range []int{1, 7, 64, len(raw)} {
		m := New(OpenAIChat, true, t0)
		m.StripUsageChunk()
		var out []byte
		for i := 0; i < len(raw); i += step {
			out = m.Feed(raw[i:min(i+step, len(raw))], t0, out)
			m.Idle()
		}
		out = m.Flush(t0, out)
		if !bytes.Equal(out, want) {
			t.Fatalf("step %d: forwarded\n%s\nwant\n%s", step, out, want)
		}
		if r := m.Result(t0); r.Usage.Input != 1200 || r.Estimated {
			t.Fatalf("step %d: usage %+v estimated %v", step, r.Usage, r.Estimated)
		}
	}
	// Anthropic streams are never stripped.
	m := New(Anthropic, true, t0)
	m.StripUsageChunk()
	if m.Stripping() {
		t.Fatal("an Anthropic meter strips")
	}
}

func TestBodies(t *testing.T) {
	tests := []struct {
		name   string
		proto  Protocol
		body   string
		usage  Usage
		est    bool
		status events.Status
		code   string
	}{
		{"openai chat", OpenAIChat, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}}`,
			Usage{10, 3, 4}, false, events.StatusOK, ""},
		{"openai without usage", OpenAIChat, `{"choices":[{"message":{"content":"abcdefgh"}}]}`, Usage{5, 2, 0}, true, events.StatusOK, ""},
		{"anthropic", Anthropic, `{"id":"msg","type":"message","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":12,"cache_read_input_tokens":100,"output_tokens":6}}`,
			Usage{112, 6, 100}, false, events.StatusOK, ""},
		{"openai responses", OpenAIResponses, `{"id":"resp_1","object":"response","status":"completed","error":null,"output":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think"}]},{"type":"message","content":[{"type":"output_text","text":"Hello","annotations":[]}]},{"type":"function_call","name":"f","arguments":"{\"a\":1}"}],"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":30,"output_tokens_details":{"reasoning_tokens":20},"total_tokens":40}}`,
			Usage{10, 30, 4}, false, events.StatusOK, ""},
		{"openai responses without usage", OpenAIResponses, `{"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"abcdefgh"}]}],"usage":null}`, Usage{5, 2, 0}, true, events.StatusOK, ""},
		{"openai responses failed", OpenAIResponses, `{"object":"response","status":"failed","error":{"code":"server_error","message":"m"},"output":[],"usage":null}`, Usage{5, 0, 0}, true, events.StatusError, "server_error"},
		{"truncated body", OpenAIChat, `{"choices":[{"message":{"content":"ab`, Usage{5, 0, 0}, true, events.StatusError, CodeMalformedBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New(tt.proto, false, t0)
			m.SetInputEstimate(5)
			body := []byte(tt.body)
			if out := m.Feed(body[:5], t0, nil); !bytes.Equal(out, body[:5]) {
				t.Fatal("a body is not forwarded as it is")
			}
			m.Feed(body[5:], t0.Add(time.Second), nil)
			end := t0.Add(2 * time.Second)
			r := m.Result(end)
			if r.Usage != tt.usage || r.Estimated != tt.est {
				t.Errorf("usage %+v estimated %v, want %+v %v", r.Usage, r.Estimated, tt.usage, tt.est)
			}
			if st, code := r.Status(false); st != tt.status || code != tt.code {
				t.Errorf("status %s %q, want %s %q", st, code, tt.status, tt.code)
			}
			if tt.status == events.StatusOK && (r.TTFT != 2*time.Second || r.Total != 2*time.Second) {
				t.Errorf("ttft %v total %v, want both 2s (a body arrives whole)", r.TTFT, r.Total)
			}
		})
	}
}

func BenchmarkMeterStream(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("testdata", "openai_chat_usage.sse"))
	if err != nil {
		b.Fatal(err)
	}
	evs := splitEvents(raw)
	m := &Meter{}
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		m.Reset(OpenAIChat, true, t0)
		for _, ev := range evs {
			m.Feed(ev, t0, nil)
		}
		m.Flush(t0, nil)
		_ = m.Result(t0)
	}
}

func TestOpenAIFastAgreesWithDecoder(t *testing.T) {
	f := func(data string, wantContent, wantFast bool) {
		t.Helper()
		n, ok := openAIFast([]byte(data))
		if ok != wantFast || (ok && (n > 0) != wantContent) {
			t.Fatalf("openAIFast(%s) = %d %v, want content %v fast %v", data, n, ok, wantContent, wantFast)
		}
		c, ok := readOpenAIChunk([]byte(data))
		if !ok {
			return
		}
		m := New(OpenAIChat, true, t0)
		m.slowOpenAIEvent(&c, t0)
		if m.SeenContent() != wantContent {
			t.Fatalf("decoder on %s: content %v, want %v", data, m.SeenContent(), wantContent)
		}
	}
	f(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false, true)
	f(`{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, true, true)
	f(`{"choices":[{"index":0,"delta":{"content":"\u00e9"}}],"usage":null}`, true, true)
	// Written the way Python's json.dumps writes: spaces change nothing.
	f(`{"choices": [{"index": 0, "delta": {"content": "hi"}}]}`, true, true)
	f("{\n\t\"choices\" : [ ] ,\"x\":[1, -0.5e+3, true, false, null, {}]\r\n}", false, true)
	f(`{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}`, false, false)
	f(`{"choices":[{"index":0,"delta":{"content":"say \"usage\":{ and \"error\": here"}}]}`, true, true)
	f(`{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"hmm"}}]}`, true, true)
	f(`{"choices":[{"index":0,"delta":{"reasoning":"hmm"}}]}`, true, true)
	f(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"error":null}`, false, true)
	f(`{"choices":[{"text":"x","index":0}]}`, true, true)
	f(`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`, false, false)
	f(`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`, true, true)
	f(`{"choices":[{"delta":{"tool_calls":[]}}]}`, false, true)
	f(`{"choices":[{"delta":{"tool_calls":null,"function_call":{"name":"f"}}}]}`, true, true)
	f(`{"error":{"type":"server_error"}}`, false, false)
	f(`{"choices":[{"delta":{"cont\u0065nt":"hi"}}]}`, true, false) // an escaped name goes to the decoder
	// Not JSON: the decoder sees it, and counts it malformed.
	f(`{"choices": [oops`, false, false)
	f(`{"choices":[{"delta":{"content":"hi"}}]`, false, false)
	f(`{"choices":[{"delta":{"content":"hi"}}]}}`, false, false)
	f(`{"choices":[{"delta":{"content":"h\qi"}}]}`, false, false)
	f("{\"choices\":[{\"delta\":{\"content\":\"h\ti\"}}]}", false, false)
	f(`{"choices":[{"delta":{"content":"hi"},}]}`, false, false)
	f(`{"n":01}`, false, false)
	f(`{"n":1.}`, false, false)
	f(`{"n":tru}`, false, false)
	f(`["a"]`, false, false)
}

// FuzzOpenAIFast: the fast path accepts only JSON, and never misses content the decoder sees.
func FuzzOpenAIFast(f *testing.F) {
	for _, s := range []string{`{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, `{"choices": [{"delta": {"tool_calls": [{"a": "\""}]}}]}`,
		`{"choices":[{"text":"x"}],"usage":null}`, `{"a":[1,2.5e3,-0,true,false,null,{"b":"\u00e9"}]}`, `{"choices":[{"delta":{"refusal":"no"}}]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		n, ok := openAIFast([]byte(data))
		if ok && !json.Valid([]byte(data)) {
			t.Fatalf("openAIFast accepted %q, which is not JSON", data)
		}
		if !ok {
			return
		}
		c, ok := readOpenAIChunk([]byte(data))
		if !ok {
			return // valid JSON of another shape: the fast path need not agree
		}
		m := New(OpenAIChat, true, t0)
		m.slowOpenAIEvent(&c, t0)
		if m.SeenContent() && n == 0 {
			t.Fatalf("openAIFast missed the content of %q", data)
		}
	})
}

func BenchmarkOpenAIFast(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-c0a0879ce1ff00a7","object":"chat.completion.chunk","created":1700102055,"model":"gpt-4o","system_fingerprint":"fp_fake","choices":[{"index":0,"delta":{"content":"percentiles "},"logprobs":null,"finish_reason":null}]}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		if n, ok := openAIFast(chunk); !ok || n == 0 {
			b.Fatal("not measured")
		}
	}
}

// TestIdleLetsBuffersGo: between events a waiting stream's meter holds no buffer; in the middle
// of one it keeps what it has.
func TestIdleLetsBuffersGo(t *testing.T) {
	m := New(OpenAIChat, true, t0)
	m.Feed([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"cho"), t0, nil)
	m.Idle()
	if m.pending == nil {
		t.Fatal("Idle let an unfinished line go")
	}
	m.Feed([]byte("ices\":[]}\n\n"), t0, nil)
	m.Idle()
	if m.pending != nil || m.data != nil || m.name != nil || m.held != nil {
		t.Fatal("Idle between events kept buffers")
	}
	m.Feed([]byte("data: [DONE]\n\n"), t0, nil)
	if r := m.Result(t0); r.ContentEvents != 1 || !m.done {
		t.Fatalf("content %d done %v", r.ContentEvents, m.done)
	}
}

// feedSSE feeds a stream whose events come 10 ms apart and returns its result.
func feedSSE(t *testing.T, proto Protocol, stream string) Result {
	t.Helper()
	m := New(proto, true, t0)
	m.SetInputEstimate(7)
	evs := splitEvents([]byte(stream))
	for i, ev := range evs {
		m.Feed(ev, t0.Add(time.Duration(i+1)*10*time.Millisecond), nil)
	}
	end := t0.Add(time.Second)
	m.Flush(end, nil)
	return m.Result(end)
}

// TestAnthropicCutShort: a stream that ends before message_delta has no output count, only
// message_start's placeholder; the output is then the content streamed, estimated.
func TestAnthropicCutShort(t *testing.T) {
	const start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":40,\"cache_read_input_tokens\":10,\"output_tokens\":1}}}\n\n"
	delta := "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word\"}}\n\n"
	const final = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":300}}\n\n"
	const stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	const sseErr = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n"
	tests := []struct {
		name      string
		stream    string
		output    int64
		estimated bool
		code      string
	}{
		{"cut after 250 deltas", start + strings.Repeat(delta, 250), 250, true, CodeTruncated},
		{"cut before any content", start, 0, true, CodeTruncated},
		{"SSE error after 3 deltas", start + strings.Repeat(delta, 3) + sseErr, 3, true, "overloaded_error"},
		{"message_delta came, message_stop did not", start + strings.Repeat(delta, 250) + final, 300, false, CodeTruncated},
		{"whole", start + strings.Repeat(delta, 250) + final + stop, 300, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, Anthropic, tt.stream)
			if r.Usage != (Usage{50, tt.output, 10}) || r.Estimated != tt.estimated {
				t.Fatalf("usage %+v estimated %v, want output %d estimated %v (input 50, cached 10 as reported)", r.Usage, r.Estimated, tt.output, tt.estimated)
			}
			if _, code := r.Status(true); code != tt.code {
				t.Fatalf("code %q, want %q", code, tt.code)
			}
		})
	}
}

// TestExactKeys: member names are read as the providers' clients read them (Python's json,
// JSON.parse): exactly, the last of a name given twice winning.
func TestExactKeys(t *testing.T) {
	const done = "data: [DONE]\n\n"
	streams := []struct {
		name    string
		proto   Protocol
		stream  string
		usage   Usage
		content int64
		code    string
	}{
		{"USAGE is not usage", OpenAIChat, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7},\"USAGE\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n" + done,
			Usage{5, 7, 0}, 0, ""},
		{"Usage alone is no usage", OpenAIChat, "data: {\"choices\":[],\"Usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\n" + done, Usage{7, 0, 0}, 0, ""},
		{"duplicate usage: the last", OpenAIChat, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1},\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9,\"Completion_Tokens\":2}}\n\n" + done,
			Usage{5, 9, 0}, 0, ""},
		{"duplicate usage, the last null", OpenAIChat, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1},\"usage\":null}\n\n" + done, Usage{7, 0, 0}, 0, ""},
		{"escaped name is the name", OpenAIChat, "data: {\"choices\":[],\"us\\u0061ge\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\n" + done, Usage{5, 9, 0}, 0, ""},
		{"cached tokens, exact", OpenAIChat, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4,\"CACHED_TOKENS\":1}}}\n\n" + done, Usage{5, 9, 4}, 0, ""},
		{"Content is not content", OpenAIChat, "data: {\"choices\":[{\"delta\":{\"Content\":\"hi\"}}]}\n\n" + done, Usage{7, 0, 0}, 0, ""},
		{"error type, exact", OpenAIChat, "data: {\"error\":{\"Type\":\"x\",\"type\":\"server_error\"},\"ERROR\":{\"type\":\"y\"}}\n\n", Usage{7, 0, 0}, 0, "server_error"},
		{"anthropic output_tokens, exact and last", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":40,\"INPUT_TOKENS\":4,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2,\"output_tokens\":9,\"Output_Tokens\":3}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", Usage{40, 9, 0}, 0, ""},
		{"anthropic TYPE is not the type", Anthropic, "event: message_delta\ndata: {\"TYPE\":\"message_stop\",\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n", Usage{7, 9, 0}, 0, CodeTruncated},
	}
	for _, tt := range streams {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, tt.proto, tt.stream)
			if r.Usage != tt.usage || r.ContentEvents != tt.content {
				t.Fatalf("usage %+v content %d, want %+v %d", r.Usage, r.ContentEvents, tt.usage, tt.content)
			}
			if _, code := r.Status(true); code != tt.code {
				t.Fatalf("code %q, want %q", code, tt.code)
			}
		})
	}
	bodies := []struct {
		name  string
		proto Protocol
		body  string
		usage Usage
	}{
		{"openai body, USAGE", OpenAIChat, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":3},"USAGE":{"prompt_tokens":1,"completion_tokens":1}}`, Usage{10, 3, 0}},
		{"openai body, duplicate", OpenAIChat, `{"usage":{"prompt_tokens":1,"completion_tokens":1},"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":3}}`, Usage{10, 3, 0}},
		{"anthropic body, Usage", Anthropic, `{"content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":12,"output_tokens":6},"Usage":{"input_tokens":1,"output_tokens":1}}`, Usage{12, 6, 0}},
		{"anthropic body, counts as numbers Python reads", Anthropic, `{"content":[],"usage":{"input_tokens":12.0,"output_tokens":6e0}}`, Usage{12, 6, 0}},
	}
	for _, tt := range bodies {
		t.Run(tt.name, func(t *testing.T) {
			m := New(tt.proto, false, t0)
			m.Feed([]byte(tt.body), t0, nil)
			r := m.Result(t0)
			if r.Usage != tt.usage || r.Estimated {
				t.Fatalf("usage %+v estimated %v, want %+v", r.Usage, r.Estimated, tt.usage)
			}
			if st, code := r.Status(false); st != events.StatusOK {
				t.Fatalf("status %s %q", st, code)
			}
		})
	}
}

// buffered is what the meter holds for the event being read.
func (m *Meter) buffered() int { return cap(m.pending) + cap(m.data) + cap(m.name) }

// freshScratches empties the pool of idle buffers, so that what a meter holds next is what it
// grew itself, not a buffer an earlier test grew (up to keepCap each) and gave back.
func freshScratches() { scratches = sync.Pool{New: func() any { return new(scratch) }} }

// TestOverflow: an event longer than the limit goes to the client as it comes, unread, the
// meter holding at most about the limit; the events after it are read, and the result says
// meter_overflow.
func TestOverflow(t *testing.T) {
	const limit = 64 << 10
	const huge = 2 << 20 // 32 times the limit
	chunk := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":22}}\n\n"
	done := "data: [DONE]\n\n"
	rest := chunk + usage + done
	longLine := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("a", huge) + "\"}}]}"
	tests := []struct {
		name, stream string
		overflows    int
		code         string
		content      int64
		usage        bool
	}{
		{"a line without its end, then the body ends", "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("a", huge), 1, CodeTruncated, 0, false},
		{"a long line", chunk + longLine + "\n\n" + rest, 1, CodeOverflow, 2, true},
		{"a long line, CRLF", chunk + longLine + "\r\n\r\n" + rest, 1, CodeOverflow, 2, true},
		{"a long line, CR before the blank line's LF comes", chunk + longLine + "\n\r\n" + rest, 1, CodeOverflow, 2, true},
		{"data lines without a blank line", strings.Repeat("data: aaaaaaaaaa\n", huge/17) + "\n" + rest, 1, CodeOverflow, 1, true},
		{"comment lines without a blank line", strings.Repeat(": keep-alive\n", huge/13) + "\n" + rest, 1, CodeOverflow, 1, true},
		{"two long events", longLine + "\n\n" + chunk + longLine + "\n\n" + rest, 2, CodeOverflow, 2, true},
		{"an event of the limit is read", "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("a", limit-len("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n")) + "\"}}]}\n\n" + rest, 0, "", 2, true},
		{"one byte more is not", "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + strings.Repeat("a", limit+1-len("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n")) + "\"}}]}\n\n" + rest, 1, CodeOverflow, 1, true},
	}
	for _, tt := range tests {
		for _, strip := range []bool{false, true} {
			for _, step := range []int{64 << 10, 4093, len(tt.stream)} {
				t.Run(fmt.Sprintf("%s/strip=%v/step=%d", tt.name, strip, step), func(t *testing.T) {
					freshScratches()
					m := New(OpenAIChat, true, t0)
					m.SetMaxEvent(limit)
					m.SetInputEstimate(7)
					if strip {
						m.StripUsageChunk()
					}
					raw := []byte(tt.stream)
					var fwd []byte
					peak := 0
					for i := 0; i < len(raw); i += step {
						p := raw[i:min(i+step, len(raw))]
						out := m.Feed(p, t0, nil)
						if !strip && !bytes.Equal(out, p) {
							t.Fatal("not stripping, the meter forwarded other bytes than it got")
						}
						fwd = append(fwd, out...)
						peak = max(peak, m.buffered())
						if held := i + len(p) - len(fwd); strip && held > limit {
							t.Fatalf("after %d bytes the meter holds back %d, past the limit", i+len(p), held)
						}
						m.Idle()
					}
					fwd = m.Flush(t0, fwd)
					if peak > 4*limit {
						t.Fatalf("the meter held %d bytes for a %d-byte limit", peak, limit)
					}
					want := raw
					if strip {
						want = bytes.Replace(raw, []byte(usage), nil, 1)
					}
					if !bytes.Equal(fwd, want) {
						t.Fatalf("forwarded %d bytes, want %d, or other bytes", len(fwd), len(want))
					}
					r := m.Result(t0)
					if r.Overflows != tt.overflows || r.ContentEvents != tt.content || r.Estimated == tt.usage {
						t.Fatalf("overflows %d content %d estimated %v, want %d %d %v", r.Overflows, r.ContentEvents, r.Estimated, tt.overflows, tt.content, !tt.usage)
					}
					if tt.usage && r.Usage != (Usage{11, 22, 0}) {
						t.Fatalf("usage %+v", r.Usage)
					}
					if _, code := r.Status(true); code != tt.code {
						t.Fatalf("code %q, want %q", code, tt.code)
					}
				})
			}
		}
	}
}

// TestBodyOverflow: a body past MaxBody passes through unread, and says so.
func TestBodyOverflow(t *testing.T) {
	m := New(OpenAIChat, false, t0)
	m.SetInputEstimate(5)
	piece := bytes.Repeat([]byte("x"), 1<<20)
	for range MaxBody/len(piece) + 1 {
		if out := m.Feed(piece, t0, nil); !bytes.Equal(out, piece) {
			t.Fatal("a body is not forwarded as it is")
		}
	}
	if cap(m.body) > keepCap {
		t.Fatalf("the meter keeps %d bytes of a body it gave up", cap(m.body))
	}
	r := m.Result(t0)
	if st, code := r.Status(false); st != events.StatusError || code != CodeOverflow || !r.Estimated {
		t.Fatalf("status %s %q estimated %v", st, code, r.Estimated)
	}
}

// FuzzScan: however a stream is cut into pieces, and whether the meter strips the usage chunk
// or not, it measures the same; not stripping, it forwards every byte; stripping, it forwards
// every byte when there was no usage chunk to drop.
func FuzzScan(f *testing.F) {
	for _, name := range []string{"openai_chat_usage.sse", "openai_chat_tools_crlf.sse", "openai_malformed.sse", "anthropic_messages.sse"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint16(7))
	}
	f.Add([]byte("data: "+strings.Repeat("x", 1500)+"\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: [DONE]\n\n"), uint16(100))
	f.Add([]byte(strings.Repeat(": k\n", 400)+"\n\r\ndata: [DONE]\n"), uint16(3))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\rdata: "+strings.Repeat("x", 1500)+"\r\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\rdata: [DONE]\r"), uint16(1))
	f.Fuzz(func(t *testing.T, raw []byte, step uint16) {
		run := func(strip bool, step int) (Result, []byte, bool) {
			m := New(OpenAIChat, true, t0)
			m.SetMaxEvent(1 << 10)
			if strip {
				m.StripUsageChunk()
			}
			var out []byte
			for i := 0; i < len(raw); i += step {
				p := raw[i:min(i+step, len(raw))]
				got := m.Feed(p, t0, nil)
				if !strip && !bytes.Equal(got, p) {
					t.Fatal("not stripping, the meter forwarded other bytes than it got")
				}
				out = append(out, got...)
				if m.size() > 1<<10 {
					t.Fatalf("the meter holds an event of %d bytes", m.size())
				}
			}
			out = m.Flush(t0, out)
			return m.Result(t0), out, m.haveUsage
		}
		whole, _, _ := run(false, max(len(raw), 1))
		for _, strip := range []bool{false, true} {
			r, out, usage := run(strip, int(step)%64+1)
			if r != whole {
				t.Fatalf("strip %v, step %d: %+v, whole: %+v", strip, int(step)%64+1, r, whole)
			}
			if (!strip || !usage) && !bytes.Equal(out, raw) {
				t.Fatalf("strip %v, no usage chunk: forwarded other bytes", strip)
			}
		}
	})
}

// TestUsageOutOfRange: a usage the contract cannot hold (a negative count, or over
// events.MaxTokens, the Anthropic sum of its input counts included) is not the request's:
// its tokens are estimated, the response is marked malformed, and its event stays valid.
func TestUsageOutOfRange(t *testing.T) {
	const chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	const done = "data: [DONE]\n\n"
	anthropic := func(in, read string) string {
		return "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":" + in + ",\"cache_read_input_tokens\":" + read + ",\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"w\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	}
	tests := []struct {
		name   string
		proto  Protocol
		stream string
	}{
		{"negative prompt tokens", OpenAIChat, chunk + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-3,\"completion_tokens\":1}}\n\n" + done},
		{"negative cached tokens", OpenAIChat, chunk + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":-1}}}\n\n" + done},
		{"huge completion tokens", OpenAIChat, chunk + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9000000000000000000}}\n\n" + done},
		{"anthropic input sum over the limit", Anthropic, anthropic("90000000", "90000000")},
		{"anthropic negative input", Anthropic, anthropic("-5", "0")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, tt.proto, tt.stream)
			ev := events.RequestEvent{V: events.Version, EventID: "e1", TS: t0, Model: "m", Scene: "s", Env: "e", Stream: true}
			r.Fill(&ev)
			ev.Status, ev.ErrorCode = r.Status(true)
			if err := ev.ValidateAt(t0.Add(time.Second)); err != nil {
				t.Fatalf("event %+v: %v", ev, err)
			}
			if !r.Estimated || r.Usage.Input != 7 || ev.Status != events.StatusError || ev.ErrorCode != CodeMalformed {
				t.Fatalf("result %+v, event %s %s: want the usage estimated and malformed_sse", r, ev.Status, ev.ErrorCode)
			}
		})
	}
	m := New(OpenAIChat, false, t0)
	m.Feed([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":-1,"completion_tokens":2}}`), t0, nil)
	if r := m.Result(t0.Add(time.Second)); !r.Estimated || r.Usage.Input < 0 || r.Malformed == 0 {
		t.Fatalf("body: result %+v, want the usage estimated and malformed", r)
	}
}

// TestResetLetsLargeBodyGo: a meter that read a large body does not keep its buffer for the
// next response (meters are pooled: each would hold up to MaxBody).
func TestResetLetsLargeBodyGo(t *testing.T) {
	m := New(OpenAIChat, false, t0)
	m.Feed(bytes.Repeat([]byte(" "), 4<<20), t0, nil)
	m.Reset(OpenAIChat, true, t0)
	if c := cap(m.body); c > keepCap {
		t.Fatalf("Reset kept a %d-byte body buffer", c)
	}
}

// TestLineEnds: an SSE line ends with CR, LF or CRLF, as the format allows and the providers'
// SDKs read it. Cut at any byte, with any of the three, a stream measures the same, and a
// stripped one forwards each event once its blank line has come (with a CR alone too,
// which no LF follows), all but the usage chunk.
func TestLineEnds(t *testing.T) {
	events := []string{
		": keep-alive",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}",
		"data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}",
		"event: chunk\ndata: {\"choices\":[{\"index\":0,\ndata: \"delta\":{\"content\":\" there\"}}]}",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2}}",
		"data: [DONE]",
	}
	const usageEvent = 4
	for _, end := range []string{"\r", "\n", "\r\n"} {
		var raw, want []byte
		var ends []int // where each event's blank line ends
		for i, ev := range events {
			e := []byte(strings.ReplaceAll(ev, "\n", end) + end + end)
			raw = append(raw, e...)
			ends = append(ends, len(raw))
			if i != usageEvent {
				want = append(want, e...)
			}
		}
		for _, strip := range []bool{false, true} {
			for cut := 1; cut < len(raw); cut++ {
				m := New(OpenAIChat, true, t0)
				if strip {
					m.StripUsageChunk()
				}
				var fwd []byte
				for i, p := range [][]byte{raw[:cut], raw[cut:]} {
					fwd = append(fwd, m.Feed(p, t0.Add(time.Duration(i)*time.Second), nil)...)
				}
				fwd = m.Flush(t0.Add(2*time.Second), fwd)
				r := m.Result(t0.Add(2 * time.Second))
				name := fmt.Sprintf("%q strip=%v cut=%d", end, strip, cut)
				if r.ContentEvents != 2 || !r.Done || r.Malformed != 0 || r.Overflows != 0 || r.Estimated || r.Usage != (Usage{11, 2, 0}) {
					t.Fatalf("%s: %+v", name, r)
				}
				if strip && !bytes.Equal(fwd, want) || !strip && !bytes.Equal(fwd, raw) {
					t.Fatalf("%s: forwarded %q", name, fwd)
				}
				// The first content is the third event's: measured with the first piece
				// when that held its blank line (of a CRLF, its CR is enough).
				if first := cut >= ends[2]-(len(end)-1); (r.TTFT == 0) != first {
					t.Fatalf("%s: TTFT %v", name, r.TTFT)
				}
			}
			// Piece by piece, each event goes out with its last byte.
			m := New(OpenAIChat, true, t0)
			if strip {
				m.StripUsageChunk()
			}
			var fwd []byte
			from := 0
			for i, to := range ends {
				fwd = append(fwd, m.Feed(raw[from:to], t0, nil)...)
				from = to
				if strip && i != usageEvent && !bytes.HasSuffix(fwd, []byte(strings.ReplaceAll(events[i], "\n", end)+end+end)) {
					t.Fatalf("%q: event %d held back once its blank line came", end, i)
				}
			}
			fwd = m.Flush(t0, fwd)
			if strip && !bytes.Equal(fwd, want) || !strip && !bytes.Equal(fwd, raw) {
				t.Fatalf("%q strip=%v: forwarded %q", end, strip, fwd)
			}
		}
	}
}

// TestOpenAICompatibleErrorChunks: the error chunks OpenAI-compatible servers send inside a
// 200 stream fail the request, even when [DONE] follows them, as vLLM's and SGLang's does.
func TestOpenAICompatibleErrorChunks(t *testing.T) {
	const content = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	f := func(chunk, code string) {
		t.Helper()
		r := feedSSE(t, OpenAIChat, content+"data: "+chunk+"\n\ndata: [DONE]\n\n")
		if st, got := r.Status(true); st != events.StatusError || got != code {
			t.Fatalf("%s: status %s %q, want error %q", chunk, st, got, code)
		}
		if r.ContentEvents != 1 {
			t.Fatalf("%s: %d content events, want 1", chunk, r.ContentEvents)
		}
	}
	// vLLM and SGLang: ErrorResponse, flat.
	f(`{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}`, "InternalServerError")
	f(`{"object": "error", "message": "x", "code": 400}`, "400")
	// TGI: the error is a string, its type beside it.
	f(`{"error":"Request failed during generation: Server error: CUDA out of memory","error_type":"generation"}`, "generation")
	f(`{"error":"overloaded"}`, "upstream_error")
	// OpenAI's own.
	f(`{"error":{"message":"m","type":"server_error","param":null,"code":null}}`, "server_error")
	f(`{"error":{"message":"m","type":"requests","code":"rate_limit_exceeded"}}`, "requests")

	// An ordinary chunk naming another object is not an error.
	r := feedSSE(t, OpenAIChat, "data: {\"object\":\"chat.completion.chunk\",\"type\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	if st, code := r.Status(true); st != events.StatusOK || r.ContentEvents != 1 {
		t.Fatalf("a chunk: status %s %q, %d content events", st, code, r.ContentEvents)
	}
}

// TestResponsesStreams: how a Responses API stream ends decides its status; its content is
// the *.delta events, whether the event: lines name them or only their types do.
func TestResponsesStreams(t *testing.T) {
	const (
		delta     = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"
		args      = "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\\\"a\\\"\"}\n\n"
		reasoning = "data: {\"type\":\"response.reasoning_summary_text.delta\",\"delta\":\"hmm\"}\n\n"
		usage     = `"usage":{"input_tokens":9,"output_tokens":40,"output_tokens_details":{"reasoning_tokens":30}}`
	)
	tests := []struct {
		name, stream string
		status       events.Status
		code         string
		usage        Usage
		estimated    bool
		content      int64
	}{
		{"completed", reasoning + args + delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"," + usage + "}}\n\n",
			events.StatusOK, "", Usage{9, 40, 0}, false, 3},
		{"incomplete: max_output_tokens is an answer", delta + "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}," + usage + "}}\n\n",
			events.StatusOK, "", Usage{9, 40, 0}, false, 1},
		{"failed", delta + "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"m\"}," + usage + "}}\n\n",
			events.StatusError, "server_error", Usage{9, 40, 0}, false, 1},
		{"failed without an error object", delta + "data: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":null,\"usage\":null}}\n\n",
			events.StatusError, "upstream_error", Usage{7, 1, 0}, true, 1},
		{"error event", delta + "event: error\ndata: {\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\",\"param\":null,\"sequence_number\":3}\n\n",
			events.StatusError, "rate_limit_exceeded", Usage{7, 1, 0}, true, 1},
		{"cut before its end", delta + delta, events.StatusError, CodeTruncated, Usage{7, 2, 0}, true, 2},
		{"hostile usage", delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":-5,\"output_tokens\":3}}}\n\n",
			events.StatusError, CodeMalformed, Usage{7, 1, 0}, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, OpenAIResponses, tt.stream)
			if st, code := r.Status(true); st != tt.status || code != tt.code {
				t.Errorf("status %s %q, want %s %q", st, code, tt.status, tt.code)
			}
			if r.Usage != tt.usage || r.Estimated != tt.estimated || r.ContentEvents != tt.content {
				t.Errorf("usage %+v estimated %v content %d, want %+v %v %d", r.Usage, r.Estimated, r.ContentEvents, tt.usage, tt.estimated, tt.content)
			}
		})
	}
	m := New(OpenAIResponses, true, t0)
	m.StripUsageChunk()
	if m.Stripping() {
		t.Fatal("a Responses stream is stripped: its usage is in response.completed, always sent")
	}
}

// TestAbsentCountsEstimated: a usage that leaves a count out has not counted it as zero: that
// count is estimated, as without usage, and the event says the tokens are estimated.
func TestAbsentCountsEstimated(t *testing.T) {
	const content = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	const done = "data: [DONE]\n\n"
	tests := []struct {
		name      string
		proto     Protocol
		stream    string
		usage     Usage
		estimated bool
	}{
		{"both counts", OpenAIChat, content + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":0}}\n\n" + done, Usage{5, 0, 0}, false},
		{"no output count", OpenAIChat, content + content + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5}}\n\n" + done, Usage{5, 2, 0}, true},
		{"no input count", OpenAIChat, content + "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3,\"total_tokens\":9}}\n\n" + done, Usage{7, 3, 0}, true},
		{"an empty usage", OpenAIChat, content + "data: {\"choices\":[],\"usage\":{}}\n\n" + done, Usage{7, 1, 0}, true},
		{"counts null", OpenAICompletions, content + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":null,\"completion_tokens\":null}}\n\n" + done, Usage{7, 1, 0}, true},
		{"responses: no output count", OpenAIResponses, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5}}}\n\n", Usage{5, 1, 0}, true},
		{"anthropic: no input count", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", Usage{7, 9, 0}, true},
		{"anthropic: cache counts alone", Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":0,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", Usage{100, 9, 100}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := feedSSE(t, tt.proto, tt.stream)
			if r.Usage != tt.usage || r.Estimated != tt.estimated {
				t.Fatalf("usage %+v estimated %v, want %+v %v", r.Usage, r.Estimated, tt.usage, tt.estimated)
			}
		})
	}
	// A body too: its output estimated from its content's bytes.
	m := New(OpenAIChat, false, t0)
	m.SetInputEstimate(7)
	m.Feed([]byte(`{"choices":[{"message":{"content":"abcdefgh"}}],"usage":{"prompt_tokens":5}}`), t0, nil)
	if r := m.Result(t0); r.Usage != (Usage{5, 2, 0}) || !r.Estimated {
		t.Fatalf("body: usage %+v estimated %v, want {5 2 0} estimated", r.Usage, r.Estimated)
	}
}

// FuzzMeterProtocols: whatever a stream or a body holds, the meter of every protocol reads it
// without failing, measures it the same however it is cut, and reports a usage an event can
// carry.
func FuzzMeterProtocols(f *testing.F) {
	for _, name := range []string{"openai_responses.sse", "anthropic_messages.sse", "openai_chat_usage.sse"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(0), false)
	}
	f.Add([]byte(`{"object":"response","status":"failed","error":{"code":"x"},"output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]},{"arguments":"{}"}],"usage":{"input_tokens":1}}`), uint8(3), true)
	f.Add([]byte("data: {\"object\":\"error\",\"type\":\"X\"}\n\ndata: {\"error\":\"e\",\"error_type\":\"t\"}\n\n"), uint8(1), false)
	f.Fuzz(func(t *testing.T, raw []byte, proto uint8, body bool) {
		p := Protocol(proto % 4)
		run := func(step int) Result {
			m := New(p, !body, t0)
			m.SetInputEstimate(3)
			for i := 0; i < len(raw); i += step {
				m.Feed(raw[i:min(i+step, len(raw))], t0, nil)
			}
			m.Flush(t0, nil)
			return m.Result(t0)
		}
		r := run(max(len(raw), 1))
		if u := r.Usage; u.Input < 0 || u.Output < 0 || u.Cached < 0 || u.Input > events.MaxTokens || u.Output > events.MaxTokens || u.Cached > u.Input {
			t.Fatalf("usage %+v", u)
		}
		if !body {
			if r2 := run(int(proto)%7 + 1); r2 != r {
				t.Fatalf("cut in pieces: %+v, whole: %+v", r2, r)
			}
		}
	})
}

// TestEmptyBody: a 2xx answer to a non-streamed request whose body is empty is none of the
// protocol's JSON, which the client's SDK fails to decode: malformed_body, not ok.
func TestEmptyBody(t *testing.T) {
	for _, proto := range []Protocol{OpenAIChat, OpenAICompletions, Anthropic, OpenAIResponses} {
		m := New(proto, false, t0)
		m.SetInputEstimate(5)
		m.Feed(nil, t0, nil)
		r := m.Result(t0.Add(time.Second))
		if st, code := r.Status(false); st != events.StatusError || code != CodeMalformedBody {
			t.Errorf("%v: status %s %q, want error %q", proto, st, code, CodeMalformedBody)
		}
		if r.Usage != (Usage{Input: 5}) || !r.Estimated {
			t.Errorf("%v: usage %+v estimated %v, want the input estimate", proto, r.Usage, r.Estimated)
		}
	}
}
