package proxy

import (
	"bytes"
	"encoding/json"

	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// withUsage sets stream_options.include_usage to true in an OpenAI request body by splicing
// bytes into it: every other byte goes upstream as the client sent it, in its order and
// spacing. It reports false, and returns body unchanged, when the client asked for usage
// itself or when stream_options is not an object (the upstream will answer that one).
// body must be valid JSON (the caller has read it); opts is its stream_options (readRequest).
func withUsage(body []byte, opts []byte) ([]byte, bool) {
	const member = `"stream_options":{"include_usage":true}`
	if len(opts) == 0 {
		end := bytes.LastIndexByte(body, '}')
		if end < 0 {
			return body, false
		}
		if open := bytes.IndexByte(body, '{'); len(bytes.TrimSpace(body[open+1:end])) == 0 {
			return splice(body, end, end, member), true
		}
		return splice(body, end, end, ","+member), true
	}
	start, end, ok := memberValue(body, "stream_options")
	if !ok {
		return body, false // not an object: readRequest found no stream_options
	}
	v := body[start:end]
	switch v[0] {
	case 'n': // null
		return splice(body, start, end, `{"include_usage":true}`), true
	case '{':
	default:
		return body, false
	}
	if vs, ve, ok := memberValue(v, "include_usage"); ok {
		if string(v[vs:ve]) == "true" {
			return body, false
		}
		return splice(body, start+vs, start+ve, "true"), true
	}
	closing := end - 1 // v is an object: its last byte is its closing brace
	if len(bytes.TrimSpace(v[1:len(v)-1])) == 0 {
		return splice(body, closing, closing, `"include_usage":true`), true
	}
	return splice(body, closing, closing, `,"include_usage":true`), true
}

// splice returns a new slice holding b with b[from:to] replaced by s.
func splice(b []byte, from, to int, s string) []byte {
	out := make([]byte, 0, len(b)-(to-from)+len(s))
	out = append(out, b[:from]...)
	out = append(out, s...)
	return append(out, b[to:]...)
}

// requestInfo is what the proxy reads from a request body.
type requestInfo struct {
	Model         string
	Stream        bool
	StreamOptions []byte // as sent; nil when absent
}

// readRequest reads the members the proxy needs from a request body, as the upstreams read
// them: OpenAI-compatible servers (vLLM, SGLang) and Anthropic's API decode with Python's
// json and match the fields exactly (pydantic), so a name matches only as written, after
// its escapes are decoded, and of a name given twice the last one counts. ("MODEL" is not
// the model, "Stream" does not ask for a stream.) encoding/json matches names without regard
// to case, so it only checks the syntax here. ok is false when body is not a JSON object.
func readRequest(body []byte) (info requestInfo, ok bool) {
	if !json.Valid(body) {
		return info, false
	}
	ok = meter.Members(body, func(name []byte, start, end int) bool {
		v := body[start:end]
		switch {
		case meter.NameIs(name, "model"):
			info.Model = ""
			if v[0] == '"' {
				_ = json.Unmarshal(v, &info.Model)
			}
		case meter.NameIs(name, "stream"):
			info.Stream = string(v) == "true"
		case meter.NameIs(name, "stream_options"):
			info.StreamOptions = v
		}
		return true
	})
	return info, ok
}

// memberValue finds the value of the last member named key in the JSON object obj, as JSON
// decoders other than Go's do (Python's, which OpenAI-compatible servers use, keeps the last
// duplicate and matches names exactly). obj must be valid JSON.
func memberValue(obj []byte, key string) (start, end int, ok bool) {
	meter.Members(obj, func(name []byte, vs, ve int) bool {
		if meter.NameIs(name, key) {
			start, end, ok = vs, ve, true
		}
		return true
	})
	return start, end, ok
}
