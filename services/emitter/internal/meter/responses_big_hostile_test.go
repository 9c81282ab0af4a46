package meter

import (
	"strings"
	"testing"
)

// TestResponsesBigHostile: a hostile upstream's forms of a Responses event (a usage in
// text, in other objects, nested or given twice, split across data: lines, around
// comments, CRLF, no event: line; exponents, surrogates in names, a BOM, NUL bytes,
// invalid UTF-8, nesting at encoding/json's limit and past it; a [DONE]; a long event:
// line) are read past the limit as within it, however the event is cut.
func TestResponsesBigHostile(t *testing.T) {
	pad := strings.Repeat("abc ", 400)
	usage := `"usage":{"input_tokens":9,"output_tokens":1000}`
	comp := func(resp string) string {
		return "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + resp + "}\n\n"
	}
	cases := []struct{ name, stream string }{
		{"done after long comment", ":" + pad + "\ndata: [DONE]\n\n"},
		{"exponent usage", comp(`{"x":"` + pad + `","usage":{"input_tokens":9e2,"output_tokens":1E+1}}`)},
		{"exponent code top", "event: error\ndata: {\"type\":\"error\",\"x\":\"" + pad + "\",\"code\":1E+5}\n\n"},
		{"code number end", "event: error\ndata: {\"type\":\"error\",\"x\":\"" + pad + "\",\"code\":-0.5}\n\n"},
		{"surrogate name", comp(`{"x":"` + pad + `","\ud800usage":{"input_tokens":1,"output_tokens":2},` + usage + `}`)},
		{"surrogate pair name", comp(`{"x":"` + pad + `","\ud83d\ude00":1,` + usage + `}`)},
		{"bom data", "event: response.completed\ndata: \xef\xbb\xbf{\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}\n\n"},
		{"bom stream", "\xef\xbb\xbf" + comp(`{"x":"`+pad+`",`+usage+`}`)},
		{"nul in string", comp(`{"x":"` + pad + "\x00" + `",` + usage + `}`)},
		{"nul outside", comp(`{"x":"` + pad + `",` + usage + `}` + "\x00")},
		{"invalid utf8 string", comp(`{"x":"` + pad + "\xff\xfe" + `",` + usage + `}`)},
		{"invalid utf8 type", "event: response.completed\ndata: {\"type\":\"response.completed\xff\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}\n\n"},
		{"invalid utf8 name", comp(`{"x":"` + pad + `","usage` + "\xff" + `":{"input_tokens":1},` + usage + `}`)},
		{"no event line", "data: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}\n\n"},
		{"comment inside", "event: response.completed\n: hi\ndata: {\"type\":\"response.completed\",\n: " + pad + "\ndata: \"response\":{\"x\":\"" + pad + "\"," + usage + "}}\n\n"},
		{"crlf", strings.ReplaceAll(comp(`{"x":"`+pad+`",`+usage+`}`), "\n", "\r\n")},
		{"usage split lines", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\",\"usage\":{\"input_tokens\":\ndata: 9,\"output_tokens\"\ndata: :1000}}}\n\n"},
		{"nested response", comp(`{"x":"` + pad + `","response":{` + usage + `}}`)},
		{"response in output", comp(`{"output":[{"response":{` + usage + `}}],"x":"` + pad + `"}`)},
		{"dup response null", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{" + usage + ",\"x\":\"" + pad + "\"},\"response\":null}\n\n"},
		{"dup response no usage", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{" + usage + ",\"x\":\"" + pad + "\"},\"response\":{}}\n\n"},
		{"dup response then usage", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"},\"response\":{" + usage + "}}\n\n"},
		{"dup type", "event: response.completed\ndata: {\"type\":\"response.output_text.delta\",\"response\":{\"x\":\"" + pad + "\"," + usage + "},\"type\":\"response.completed\"}\n\n"},
		{"usage in error", "event: response.failed\ndata: {\"type\":\"response.failed\",\"error\":{" + usage + "},\"response\":{\"x\":\"" + pad + "\",\"status\":\"failed\"}}\n\n"},
		{"status not string", comp(`{"x":"` + pad + `","status":5,` + usage + `}`)},
		{"status null", comp(`{"x":"` + pad + `","status":null,` + usage + `}`)},
		{"usage null", comp(`{"x":"` + pad + `",` + usage + `,"usage":null}`)},
		{"usage escaped key inside", comp(`{"x":"` + pad + `","usage":{"input_\u0074okens":9,"output_tokens":1000}}`)},
		{"usage float", comp(`{"x":"` + pad + `","usage":{"input_tokens":9.0,"output_tokens":1000.5}}`)},
		{"usage huge", comp(`{"x":"` + pad + `","usage":{"input_tokens":1e400,"output_tokens":1}}`)},
		{"usage negative", comp(`{"x":"` + pad + `","usage":{"input_tokens":-9,"output_tokens":1}}`)},
		{"code dup null", "event: error\ndata: {\"type\":\"error\",\"code\":\"abc\",\"x\":\"" + pad + "\",\"code\":null}\n\n"},
		{"code array", "event: error\ndata: {\"type\":\"error\",\"code\":[1],\"x\":\"" + pad + "\"}\n\n"},
		{"error string", "event: error\ndata: {\"type\":\"error\",\"error\":\"bad\",\"x\":\"" + pad + "\"}\n\n"},
		{"long event name delta", "event: " + strings.Repeat("x", 300) + ".delta\ndata: {\"x\":\"" + pad + "\"}\n\n" + comp(`{`+usage+`}`)},
		{"long event name completed", "event: " + strings.Repeat("x", 300) + "\ndata: {\"type\":\"response.completed\",\"x\":\"" + pad + "\",\"response\":{" + usage + "}}\n\n"},
		{"delta no event", "data: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\"}\n\n" + comp(`{`+usage+`}`)},
		{"delta empty first data", "event: response.output_text.delta\ndata:\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\"}\n\n" + comp(`{`+usage+`}`)},
		{"data no colon", "event: response.completed\ndata\ndata: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}\n\n"},
		{"event after data", "data: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}\nevent: response.output_text.delta\n\n"},
		{"deep 10000", comp(`{"x":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `,` + usage + `}`)},
		{"deep 10001", comp(`{"x":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `,` + usage + `}`)},
		{"trailing ws", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}  \t\n\n"},
		{"two objects", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}} {}\n\n"},
		{"type escaped value", "event: response.completed\ndata: {\"type\":\"response.\\u0063ompleted\",\"response\":{\"x\":\"" + pad + "\"," + usage + "}}\n\n"},
		{"delta fast escaped name deep", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\",\"o\":{\"\\u0074ype\":1}}\n\n" + comp(`{`+usage+`}`)},
		{"delta two types", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\",\"o\":{\"type\":1}}\n\n" + comp(`{`+usage+`}`)},
		{"delta type in string", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\\\"type\\\"\"}\n\n" + comp(`{`+usage+`}`)},
		{"delta typevalue", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\",\"k\":\"type\"}\n\n" + comp(`{`+usage+`}`)},
		{"delta type overlap", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + pad + "\",\"\":\"type\"}\n\n" + comp(`{`+usage+`}`)},
	}
	for _, c := range cases {
		name, s := c.name, c.stream
		short, _ := feedResponses(s, 1<<20, len(s))
		for _, step := range []int{1, 3, 1000, len(s)} {
			r, _ := feedResponses(s, 1<<10, step)
			if r.Overflows == 0 {
				t.Errorf("%s: the event is not past the limit", name)
				continue
			}
			r.Overflows = 0
			if r != short {
				t.Errorf("%s, cut every %d bytes: past the limit %+v, within it %+v", name, step, r, short)
			}
		}
	}
}
