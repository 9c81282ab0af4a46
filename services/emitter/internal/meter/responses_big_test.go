package meter

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// feedResponses meters a Responses stream with the limit given (0: the default), fed in
// pieces of step bytes, and returns the result and the most the meter held.
func feedResponses(stream string, limit, step int) (r Result, held int) {
	freshScratches()
	m := New(OpenAIResponses, true, t0)
	m.SetMaxEvent(limit)
	m.SetInputEstimate(7)
	raw := []byte(stream)
	for i := 0; i < len(raw); i += step {
		m.Feed(raw[i:min(i+step, len(raw))], t0, nil)
		held = max(held, m.buffered())
		if m.big != nil {
			held = max(held, cap(m.big.value)+cap(m.big.name)+cap(m.big.head)+cap(m.big.key)+cap(m.big.field))
		}
		m.Idle()
	}
	m.Flush(t0, nil)
	return m.Result(t0), held
}

// TestResponsesBigEvent: a Responses event past the limit is read as it passes, as the
// meter reads it when it is within the limit: the same usage, end, error and content, the
// output's own "usage" (in its text, or a member of an item) never taken for the response's,
// and data that is not JSON malformed, however the event is cut, the meter holding no more
// than a few KiB of it.
func TestResponsesBigEvent(t *testing.T) {
	const limit = 1 << 10
	pad := strings.Repeat("abc ", 1<<10) // 4 KiB: the event is 4 times the limit
	delta := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n"
	completed := func(resp string) string {
		return "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + resp + ",\"sequence_number\":9}\n\n"
	}
	output := `"output":[{"type":"message","content":[{"type":"output_text","text":"` + pad + `"}]}]`
	usage := `"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":1000,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1009}`
	tests := []struct {
		name, stream string
		status       events.Status
		code         string
		usage        Usage
		estimated    bool
	}{
		{"usage after the output", delta + completed(`{"id":"resp_1","object":"response","status":"completed","error":null,`+output+`,`+usage+`,"user":null,"metadata":{}}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"usage before the output", delta + completed(`{"status":"completed",`+usage+`,`+output+`}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"a usage in the text is text", delta + completed(`{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"`+pad+`\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}"}]}]}`),
			events.StatusOK, "", Usage{7, 1, 0}, true},
		{"a usage in an item is not the response's", delta + completed(`{"status":"completed","output":[{"type":"x","text":"`+pad+`","usage":{"input_tokens":1,"output_tokens":2}}],"metadata":{"usage":{"input_tokens":3,"output_tokens":4}}}`),
			events.StatusOK, "", Usage{7, 1, 0}, true},
		{"a usage beside the response is not its", delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{" + output + "},\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}\n\n",
			events.StatusOK, "", Usage{7, 1, 0}, true},
		{"an escaped name is the name", delta + completed(`{`+output+`,"\u0075sage":{"input_tokens":9,"output_tokens":1000}}`),
			events.StatusOK, "", Usage{9, 1000, 0}, false},
		{"the last response counts", delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{" + usage + "},\"response\":{" + output + "}}\n\n",
			events.StatusOK, "", Usage{7, 1, 0}, true},
		{"the last usage counts", delta + completed(`{`+usage+`,`+output+`,"usage":{"input_tokens":5,"output_tokens":6}}`),
			events.StatusOK, "", Usage{5, 6, 0}, false},
		{"incomplete", delta + "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\"," + output + "," + usage + "}}\n\n",
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"failed", delta + "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"m\"}," + output + "," + usage + "}}\n\n",
			events.StatusError, "server_error", Usage{9, 1000, 4}, false},
		{"failed, its error too long to keep", delta + "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"" + pad + "\"}," + usage + "}}\n\n",
			events.StatusError, "upstream_error", Usage{9, 1000, 4}, false},
		{"the type names the event, not the event: line", delta + "event: response.output_text.delta\ndata: {\"type\":\"response.completed\",\"response\":{" + output + "," + usage + "}}\n\n",
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"without a type, the event: line", delta + "event: response.completed\ndata: {\"response\":{" + output + "," + usage + "}}\n\n",
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"data lines", delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\ndata: \"response\":{\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"" + pad + "\"}]}],\ndata:" + usage + "}}\n\n",
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"CRLF", strings.ReplaceAll(delta+completed(`{`+output+`,`+usage+`}`), "\n", "\r\n"),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"CR", strings.ReplaceAll(delta+completed(`{`+output+`,`+usage+`}`), "\n", "\r"),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"ended by the body", delta + strings.TrimSuffix(completed(`{`+output+`,`+usage+`}`), "\n\n"),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"a line break in a string", delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":\"" + pad + "\ndata: \"," + usage + "}}\n\n",
			events.StatusError, CodeTruncated, Usage{7, 1, 0}, true},
		{"cut off", delta + "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{" + output + "," + usage + "}\n\n",
			events.StatusError, CodeTruncated, Usage{7, 1, 0}, true},
		{"a usage of another type", delta + completed(`{`+output+`,"usage":"9"}`),
			events.StatusError, CodeTruncated, Usage{7, 1, 0}, true},
		{"a response of another type", delta + completed(`["`+pad+`"]`),
			events.StatusError, CodeTruncated, Usage{7, 1, 0}, true},
		{"a deep output", delta + completed(`{"output":`+strings.Repeat("[", 40)+`"`+pad+`"`+strings.Repeat("]", 40)+`,`+usage+`}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"a number with a leading zero is not JSON", delta + completed(`{`+output+`,"usage":{"input_tokens":-01}}`),
			events.StatusError, CodeTruncated, Usage{7, 1, 0}, true},
		{"an escaped name sends a delta to the decoder", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"de\\u006cta\":\"" + pad + "\",\"response\":5}\n\n" + completed(`{`+usage+`}`),
			events.StatusError, CodeMalformed, Usage{9, 1000, 4}, false},
		{"a long delta is content", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\"}\n\n" + completed(`{`+usage+`}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"a long image is no error", "event: response.image_generation_call.partial_image\ndata: {\"type\":\"response.image_generation_call.partial_image\",\"partial_image_index\":0,\"partial_image_b64\":\"" + pad + "\"}\n\n" + delta + completed(`{`+usage+`}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"a long error event", delta + "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"" + pad + "\"}\n\n" + completed(`{`+usage+`}`),
			events.StatusError, "server_error", Usage{9, 1000, 4}, false},
		{"[DONE] after a long comment, as within the limit", delta + completed(`{`+usage+`}`) + ": " + pad + "\ndata: [DONE]\n\n",
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"no type, and a long event: line ending .delta: a delta", "event: " + strings.Repeat("x", 2*bigNameMax) + ".delta\ndata: {\"x\":\"" + pad + "\"}\n\n" + completed(`{`+usage+`}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"no type, and a long event: line: nothing", "event: " + strings.Repeat("x", 2*bigNameMax) + ".delt\ndata: {\"x\":\"" + pad + "\"}\n\n" + delta + completed(`{`+usage+`}`),
			events.StatusOK, "", Usage{9, 1000, 4}, false},
		{"a long error object", delta + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"" + pad[:2000] + "\"}}\n\n" + completed(`{`+usage+`}`),
			events.StatusError, "invalid_request_error", Usage{9, 1000, 4}, false},
	}
	for _, tt := range tests {
		short, _ := feedResponses(tt.stream, 1<<20, len(tt.stream))
		for _, step := range []int{1, 7, 1000, len(tt.stream)} {
			t.Run(fmt.Sprintf("%s/step=%d", tt.name, step), func(t *testing.T) {
				r, held := feedResponses(tt.stream, limit, step)
				if r.Overflows != 1 {
					t.Fatalf("%d overflows, want 1: the test's event is not past the limit", r.Overflows)
				}
				if st, code := r.Status(true); st != tt.status || code != tt.code {
					t.Errorf("status %s %q, want %s %q", st, code, tt.status, tt.code)
				}
				if r.Usage != tt.usage || r.Estimated != tt.estimated {
					t.Errorf("usage %+v estimated %v, want %+v %v", r.Usage, r.Estimated, tt.usage, tt.estimated)
				}
				r.Overflows = 0
				if r != short && !strings.Contains(tt.name, "too long") {
					t.Errorf("past the limit %+v, within it %+v", r, short)
				}
				if held > 2*bigValueMax+4*limit {
					t.Errorf("the meter held %d bytes", held)
				}
			})
		}
	}
}

// TestResponsesBigUsageTooLong: a usage too long to keep is not read: the tokens are
// estimated and the result says meter_overflow.
func TestResponsesBigUsageTooLong(t *testing.T) {
	stream := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1000,\"x\":\"" + strings.Repeat("a", bigValueMax) + "\"}}}\n\n"
	r, _ := feedResponses(stream, 1<<10, 512)
	if st, code := r.Status(true); st != events.StatusError || code != CodeOverflow || !r.Estimated || !r.Done {
		t.Fatalf("status %s %q estimated %v done %v, want error %s, estimated, done", st, code, r.Estimated, r.Done, CodeOverflow)
	}
}

// TestOverflowOtherProtocols: an event past the limit of another protocol is not read: the
// result says meter_overflow.
func TestOverflowOtherProtocols(t *testing.T) {
	stream := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1},\"x\":\"" + strings.Repeat("a", 2<<10) + "\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	m := New(Anthropic, true, t0)
	m.SetMaxEvent(1 << 10)
	m.Feed([]byte(stream), t0, nil)
	m.Flush(t0, nil)
	r := m.Result(t0)
	if st, code := r.Status(true); st != events.StatusError || code != CodeOverflow || r.Unread != 1 {
		t.Fatalf("status %s %q unread %d, want error %s, 1", st, code, r.Unread, CodeOverflow)
	}
}

// FuzzResponsesBigEvent: whatever a Responses stream holds, an event past the limit is read
// as it is within it, however it is cut.
func FuzzResponsesBigEvent(f *testing.F) {
	pad := strings.Repeat("abc ", 300)
	f.Add([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\""+pad+"\"}]}],\"usage\":{\"input_tokens\":9,\"output_tokens\":1000}}}\n\n"), uint8(1))
	f.Add([]byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\""+pad+"\"}\n\nevent: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"e\"},\"x\":[1,-2.5e3,true,null,{\"usage\":{\"input_tokens\":1}}],\"usage\":{\"input_tokens\":9},\"y\":\""+pad+"\\u00e9\\\"\"}}\n\n"), uint8(3))
	f.Add([]byte("event: error\r\ndata: {\"type\":\"error\",\"code\":\"c\",\r\ndata: \"message\":\""+pad+"\"}\r\n\r\ndata: {\"type\":\"response.incomplete\",\"response\":{\"\\u0075sage\":{\"input_tokens\":2,\"output_tokens\":3}},\"z\":\""+pad+"\"}"), uint8(5))
	f.Fuzz(func(t *testing.T, raw []byte, step uint8) {
		stream := string(raw)
		short, _ := feedResponses(stream, 1<<20, max(len(raw), 1))
		whole, _ := feedResponses(stream, 1<<10, max(len(raw), 1))
		cut, _ := feedResponses(stream, 1<<10, int(step)%13+1)
		if cut != whole {
			t.Fatalf("cut in pieces: %+v, whole: %+v", cut, whole)
		}
		if whole.Unread > 0 || len(raw) > bigValueMax {
			return // a member too long to keep: what it said is not known
		}
		whole.Overflows = 0
		if whole != short {
			t.Fatalf("past the limit %+v, within it %+v", whole, short)
		}
	})
}

// TestResponsesBigEventMutated: streams made from a few by random edits (brackets, quotes,
// escapes, line ends, member names that matter, bytes) are read past the limit as within it,
// and alike however they are cut. FuzzResponsesBigEvent does the same, open-ended.
func TestResponsesBigEventMutated(t *testing.T) {
	pad := strings.Repeat("abc ", 300)
	seeds := []string{
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"" + pad + "\"}]}],\"usage\":{\"input_tokens\":9,\"output_tokens\":1000}}}\n\n",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\"}\n\nevent: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"e\"},\"x\":[1,-2.5e3,true,null,{\"usage\":{\"input_tokens\":1}}],\"usage\":{\"input_tokens\":9},\"y\":\"" + pad + "\\u00e9\\\"\"}}\n\n",
		"event: error\r\ndata: {\"type\":\"error\",\"code\":\"c\",\r\ndata: \"message\":\"" + pad + "\"}\r\n\r\ndata: {\"type\":\"response.incomplete\",\"response\":{\"\\u0075sage\":{\"input_tokens\":2,\"output_tokens\":3}},\"z\":\"" + pad + "\"}",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\",\"response\":5}\n\n",
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[\"" + pad + "\"]},\"usage\":{\"input_tokens\":1,\"output_tokens\":2},\"code\":-0}\n\n",
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"d\\u0065lta\":\"" + pad + "\",\"response\":{\"usage\":1}}\n\n",
		"data: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[" + strings.Repeat("[", 35) + "0" + strings.Repeat("]", 35) + ",\"" + pad + "\"],\"usage\":{\"input_tokens\":9,\"output_tokens\":1.0,\"input_tokens_details\":{\"cached_tokens\":3}}},\"type\":\"response.incomplete\"}\n\n",
	}
	toks := []string{"{", "}", "[", "]", "\"", ",", ":", "\\", "\\u00", "\n", "\r", "\n\n", "data: ", "event: response.completed\n", "\"type\"", "\"usage\"", "\"response\"", "\"error\"", "\"code\"", "\"status\"", "null", "1", "-0.5e+2", "\"failed\"", "{\"input_tokens\":3}", " ", "\x01", "true"}
	rng := rand.New(rand.NewSource(1))
	for range 5000 {
		b := []byte(seeds[rng.Intn(len(seeds))])
		for k := rng.Intn(4) + 1; k > 0; k-- {
			i := rng.Intn(len(b) + 1)
			switch rng.Intn(4) {
			case 0:
				b = append(b[:i:i], append([]byte(toks[rng.Intn(len(toks))]), b[i:]...)...)
			case 1:
				if i < len(b) {
					j := min(len(b), i+rng.Intn(8)+1)
					b = append(b[:i:i], b[j:]...)
				}
			case 2:
				if i < len(b) {
					b[i] = byte(rng.Intn(256))
				}
			case 3:
				if i < len(b) {
					b[i] = "{}[]\",:\\\n "[rng.Intn(10)]
				}
			}
		}
		raw := b
		stream := string(raw)
		short, _ := feedResponses(stream, 1<<20, max(len(raw), 1))
		whole, _ := feedResponses(stream, 1<<10, max(len(raw), 1))
		step := rng.Intn(13) + 1
		cut, _ := feedResponses(stream, 1<<10, step)
		if cut != whole {
			t.Fatalf("%q cut in pieces: %+v, whole: %+v", stream, cut, whole)
		}
		if whole.Unread > 0 || len(raw) > bigValueMax {
			continue
		}
		whole.Overflows = 0
		if whole != short {
			t.Fatalf("%q past the limit %+v, within it %+v", stream, whole, short)
		}
	}
}

// TestPlainRun: the run of a string's plain bytes ends at the first quote, backslash or
// control byte, wherever it is in the 8 bytes read at a time, whatever bytes are beside it.
func TestPlainRun(t *testing.T) {
	var ends []byte
	for c := range 0x20 {
		ends = append(ends, byte(c))
	}
	ends = append(ends, '"', '\\')
	for _, fill := range []byte{'a', 0x7f, 0x80, 0xff, '!', '#', '[', ']', 0x21, 0x5d} {
		for n := range 20 {
			p := make([]byte, 20)
			for i := range p {
				p[i] = fill
			}
			if got := plainRun(p[:n]); got != n {
				t.Fatalf("plainRun of %d bytes %#x = %d", n, fill, got)
			}
			for _, end := range ends {
				p[n] = end
				if got := plainRun(p); got != n {
					t.Fatalf("plainRun with %#x at %d among %#x = %d", end, n, fill, got)
				}
				p[n] = fill
			}
		}
	}
}

// BenchmarkResponsesBigFeed: the meter's own cost of a 50 MiB image event read as it
// passes, fed in 256 KiB pieces, the relay's read size.
func BenchmarkResponsesBigFeed(b *testing.B) {
	stream := []byte("event: response.image_generation_call.partial_image\ndata: {\"type\":\"response.image_generation_call.partial_image\",\"partial_image_index\":0,\"partial_image_b64\":\"" +
		strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", (50<<20)/24) + "\"}\n\n")
	m := New(OpenAIResponses, true, t0)
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		m.Reset(OpenAIResponses, true, t0)
		for i := 0; i < len(stream); i += 256 << 10 {
			m.Feed(stream[i:min(i+256<<10, len(stream))], t0, nil)
		}
		m.Flush(t0, nil)
		if r := m.Result(t0); r.Overflows != 1 || r.Unread != 0 || r.Malformed != 0 {
			b.Fatalf("%+v", r)
		}
	}
}
