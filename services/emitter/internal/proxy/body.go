package proxy

import (
	"bytes"
	"encoding/json"
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
	ok = members(body, func(name []byte, start, end int) {
		v := body[start:end]
		switch {
		case nameIs(name, "model"):
			info.Model = ""
			if v[0] == '"' {
				_ = json.Unmarshal(v, &info.Model)
			}
		case nameIs(name, "stream"):
			info.Stream = string(v) == "true"
		case nameIs(name, "stream_options"):
			info.StreamOptions = v
		}
	})
	return info, ok
}

// memberValue finds the value of the last member named key in the JSON object obj, as JSON
// decoders other than Go's do (Python's, which OpenAI-compatible servers use, keeps the last
// duplicate and matches names exactly). obj must be valid JSON.
func memberValue(obj []byte, key string) (start, end int, ok bool) {
	members(obj, func(name []byte, vs, ve int) {
		if nameIs(name, key) {
			start, end, ok = vs, ve, true
		}
	})
	return start, end, ok
}

// members calls fn with each member of the JSON object obj, in order: its name as written
// (quoted) and where its value lies. It reports false when obj is not an object. obj must be
// valid JSON.
func members(obj []byte, fn func(name []byte, start, end int)) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) {
			return true
		}
		switch obj[i] {
		case '}':
			return true
		case ',':
			i++
			continue
		}
		ks := i
		i = skipString(obj, i)
		name := obj[ks:i]
		i = skipSpace(obj, i) + 1 // the colon
		i = skipSpace(obj, i)
		vs := i
		i = skipValue(obj, i)
		fn(name, vs, i)
	}
}

// nameIs reports whether the quoted JSON string name decodes to key.
func nameIs(name []byte, key string) bool {
	if bytes.IndexByte(name, '\\') < 0 {
		return len(name) == len(key)+2 && string(name[1:len(name)-1]) == key
	}
	var s string
	return json.Unmarshal(name, &s) == nil && s == key
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] (its opening quote).
func skipString(b []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		i += j
		// A quote preceded by an odd number of backslashes is escaped.
		n := 0
		for k := i - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		i++
		if n%2 == 0 {
			return i
		}
	}
}

// skipValue returns the index after the value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}
