package meter

import (
	"bytes"
	"encoding/json"
	"time"
)

// OpenAI's Responses API (POST /v1/responses) streams typed events, each named by its event:
// line and its type: the content comes in *.delta events (output text, refusals, reasoning,
// tool-call arguments), and the stream ends with response.completed, response.incomplete
// (a limit such as max_output_tokens cut the answer: still an answer) or response.failed,
// whose response object carries the usage; there is no [DONE]. An error event fails the
// stream. A body is that response object.

// responseObject is what the meter reads of a response object.
type responseObject struct {
	usage   *reported
	err     *providerError
	failed  bool // status "failed"
	content int  // bytes of its output's text, refusals and tool-call arguments
}

// readResponse reads a response object, its output's content too when content is set (a
// body's: a stream's content came in its deltas); v must be valid JSON.
func readResponse(v []byte, content bool) (r responseObject, ok bool) {
	ok = object(v, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "usage":
			r.usage, ok = responsesUsage(v)
		case "error":
			r.err, ok = readError(v)
		case "status":
			var s string
			s, ok = text(v)
			r.failed = s == "failed"
		case "output":
			if !content {
				return true
			}
			r.content = 0
			ok = array(v, func(item []byte) bool { n, ok := outputContent(item); r.content += n; return ok })
		default:
			ok = true
		}
		return ok
	})
	return r, ok
}

// response applies a response object the stream or the body ended with.
func (m *Meter) response(r *responseObject) {
	if r.usage != nil {
		m.setUsage(r.usage)
	}
	switch {
	case r.err != nil:
		m.errCode = r.err.String()
	case r.failed:
		m.errCode = "upstream_error"
	}
}

// responsesUsage reads the Responses API's usage object (its output_tokens hold the
// reasoning tokens); nil for null.
func responsesUsage(v []byte) (u *reported, ok bool) {
	return usageObject(v, "input_tokens", "output_tokens", "input_tokens_details")
}

// outputContent is the content of one output item, in bytes: a message's text and
// refusals, a reasoning item's summary and text, a tool call's arguments or input.
func outputContent(item []byte) (n int, ok bool) {
	var parts, args int
	ok = object(item, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "content", "summary":
			if len(v) == 0 || v[0] != '[' {
				return true
			}
			return array(v, func(part []byte) bool {
				return object(part, func(name, v []byte) (ok bool) {
					switch string(name) {
					case "text", "refusal":
						var k int
						k, ok = textLen(v)
						if !ok {
							return true // not a string: another kind of part
						}
						parts += k
					}
					return true
				})
			})
		case "arguments", "input", "code":
			if k, isText := textLen(v); isText {
				args += k
			}
			return true
		}
		return true
	})
	return parts + args, ok
}

// responsesEvent measures one event of a Responses stream.
func (m *Meter) responsesEvent(name, data []byte, now time.Time) {
	// The frequent events need no decoding: a delta is content whatever it holds, and the
	// events around the content (an item or part added or done) carry no usage. The clients
	// read an event by its JSON type, not its event: line, so the name stands for the type
	// only when the data's one type member, first as OpenAI writes it, says the same.
	if len(name) > 0 && !terminalResponseEvent(name) && typedAs(data, name) && wellFormed(data) {
		if bytes.HasSuffix(name, []byte(".delta")) {
			m.content(now, len(data))
		}
		return
	}
	if bytes.Equal(data, []byte("[DONE]")) {
		return // not the API's, but some compatible servers end with it too
	}
	if !json.Valid(data) {
		m.malformed++
		return
	}
	var typ string
	var delta int
	var resp *responseObject
	var perr *providerError
	var flat providerError // an error event's own code
	ok := object(data, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "type":
			typ, ok = text(v)
		case "delta":
			delta, ok = 1, true
			if k, isText := textLen(v); isText {
				delta = max(k, 1)
			}
		case "response":
			resp = nil
			if !isNull(v) {
				var r responseObject
				r, ok = readResponse(v, false)
				resp = &r
			} else {
				ok = true
			}
		case "error":
			perr, ok = readError(v)
		case "code":
			ok = flat.read("code", v)
		default:
			ok = true
		}
		return ok
	})
	if !ok {
		m.malformed++
		return
	}
	if typ == "" {
		typ = string(name)
	}
	switch {
	case typ == "response.completed" || typ == "response.incomplete" || typ == "response.failed":
		if resp != nil {
			m.response(resp)
		}
		if typ == "response.failed" && m.errCode == "" {
			m.errCode = "upstream_error"
		}
		m.done = true
	case typ == "error":
		if perr == nil {
			perr = &flat
		}
		m.errCode = perr.String()
	case len(typ) > len(".delta") && typ[len(typ)-len(".delta"):] == ".delta":
		m.content(now, delta)
	}
}

// terminalResponseEvent reports whether an event named so ends a Responses stream or fails
// it: those are decoded.
func terminalResponseEvent(name []byte) bool {
	switch string(name) {
	case "response.completed", "response.incomplete", "response.failed", "error":
		return true
	}
	return false
}

// typedAs reports whether data begins with a type member naming the event as name does and
// has no other: a "type" that is not a member name is a string value, and a string cannot
// hold one unescaped, so one occurrence is that member. An escaped member name makes
// wellFormed fail.
func typedAs(data, name []byte) bool {
	rest, ok := bytes.CutPrefix(data, []byte(`{"type":"`))
	if !ok || !bytes.HasPrefix(rest, name) || !bytes.HasPrefix(rest[len(name):], []byte(`"`)) {
		return false
	}
	return bytes.Count(data, []byte(`"type"`)) == 1
}
