package meter

import "bytes"

// The fast path reads a chunk's JSON in one pass, without decoding it: it checks the syntax
// and finds the members that matter by name at any depth. A chunk it cannot vouch for goes
// to the decoder (jsonread.go): usage and errors (once per stream), audio, escaped member names,
// deep nesting, and anything that is not JSON (which the decoder then counts as malformed).

const maxFastDepth = 32

// fastKind is what a member name means to the fast path.
type fastKind uint8

const (
	kindOther   fastKind = iota
	kindContent          // a string value is content: content, text, reasoning…
	kindTool             // a value other than null and [] is content: tool_calls, function_call
	kindSlow             // a value other than null needs the decoder: usage, error, audio
	kindObject           // the chunk's object: "error" needs the decoder (vLLM's and SGLang's error chunk)
)

// kindOf names the member. Names are matched exactly, as the providers' clients match them
// (see jsonread.go): "Content" is not content.
func kindOf(name []byte) fastKind {
	switch string(name) {
	case "content", "text", "reasoning", "reasoning_content", "refusal":
		return kindContent
	case "tool_calls", "function_call":
		return kindTool
	case "usage", "error", "audio":
		return kindSlow
	case "object":
		return kindObject
	}
	return kindOther
}

// openAIFast measures an OpenAI chunk (content, role, finish, tool-call deltas) without
// decoding it: n is the bytes of content it carries. ok=false sends it to the decoder.
func openAIFast(data []byte) (n int, ok bool) { return scanJSON(data, true) }

// wellFormed reports whether data is one JSON object, as the decoder would accept it.
func wellFormed(data []byte) bool {
	_, ok := scanJSON(data, false)
	return ok
}

// scanJSON checks that data is one JSON object and, when measure is set, adds up its
// content members. It reports ok=false for anything that is not JSON, and, when measuring,
// for what the decoder must read.
func scanJSON(d []byte, measure bool) (n int, ok bool) {
	const (
		value = iota // a value comes next
		first        // just inside a bracket: its closing, or its first member or element
		name         // a member name comes next
		after        // a value ended: a comma or a closing bracket comes next
	)
	var inObject [maxFastDepth]bool
	depth := 0
	kind := kindOther         // the kind of the member whose value comes next
	toolDepth, toolAt := 0, 0 // the tool-call value being read: its depth and start
	i := skipWS(d, 0)
	if i >= len(d) || d[i] != '{' {
		return 0, false
	}
	state := value
	for {
		i = skipWS(d, i)
		if i >= len(d) {
			return 0, false
		}
		c := d[i]
		switch state {
		case value:
			if c == '{' || c == '[' {
				if depth == maxFastDepth || (measure && kind == kindSlow) {
					return 0, false
				}
				if measure && kind == kindTool && toolDepth == 0 {
					toolDepth, toolAt = depth+1, i
				}
				inObject[depth] = c == '{'
				depth++
				i++
				state = first
				continue
			}
			end := -1
			switch c {
			case '"':
				end = stringEnd(d, i)
			case 't':
				end = literalEnd(d, i, "true")
			case 'f':
				end = literalEnd(d, i, "false")
			case 'n':
				end = literalEnd(d, i, "null")
			default:
				end = numberEnd(d, i)
			}
			if end < 0 {
				return 0, false
			}
			if measure {
				switch {
				case kind == kindContent && c == '"':
					n += end - i - 2
				case kind == kindTool && c != 'n':
					n += end - i
				case kind == kindSlow && c != 'n':
					return 0, false
				case kind == kindObject && depth == 1 && c == '"' &&
					(string(d[i:end]) == `"error"` || bytes.IndexByte(d[i:end], '\\') >= 0):
					// An error chunk, or a string the decoder must read: "\u0065rror" is "error".
					return 0, false
				}
			}
			i = end
			state = after
		case first:
			if c == '}' || c == ']' {
				state = after
				continue // the closing bracket is read as after a value
			}
			if inObject[depth-1] {
				state = name
			} else {
				state, kind = value, kindOther
			}
		case name:
			if c != '"' {
				return 0, false
			}
			end := stringEnd(d, i)
			if end < 0 {
				return 0, false
			}
			key := d[i+1 : end-1]
			if bytes.IndexByte(key, '\\') >= 0 {
				// An escaped name: the decoder knows what it spells.
				return 0, false
			}
			kind = kindOf(key)
			if toolDepth > 0 {
				kind = kindOther // inside a tool call, everything is its content
			}
			i = skipWS(d, end)
			if i >= len(d) || d[i] != ':' {
				return 0, false
			}
			i++
			state = value
		case after:
			switch {
			case c == ',':
				i++
				if inObject[depth-1] {
					state = name
				} else {
					state, kind = value, kindOther
				}
			case (c == '}' && inObject[depth-1]) || (c == ']' && !inObject[depth-1]):
				if depth == toolDepth {
					if v := d[toolAt : i+1]; string(v) != "[]" {
						n += len(v)
					}
					toolDepth = 0
				}
				depth--
				i++
				if depth == 0 {
					return n, skipWS(d, i) == len(d)
				}
			default:
				return 0, false
			}
		}
	}
}

func skipWS(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the JSON string starting at d[i], or -1 if it is not one.
func stringEnd(d []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(d[i:], '"')
		if j < 0 {
			return -1
		}
		s := d[i : i+j]
		if bytes.IndexByte(s, '\\') < 0 {
			if hasControl(s) {
				return -1
			}
			return i + j + 1
		}
		// Escapes: walk them; a quote after a backslash does not end the string.
		for k := i; ; {
			if k >= len(d) {
				return -1
			}
			switch c := d[k]; {
			case c == '"':
				return k + 1
			case c < 0x20:
				return -1
			case c == '\\':
				if k+1 >= len(d) {
					return -1
				}
				switch d[k+1] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
					k += 2
				case 'u':
					if k+6 > len(d) || !isHex4(d[k+2:k+6]) {
						return -1
					}
					k += 6
				default:
					return -1
				}
			default:
				k++
			}
		}
	}
}

func literalEnd(d []byte, i int, lit string) int {
	if !bytes.HasPrefix(d[i:], []byte(lit)) {
		return -1
	}
	return i + len(lit)
}

func hasControl(s []byte) bool {
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}

func isHex4(h []byte) bool {
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// numberEnd returns the index after the JSON number starting at d[i], or -1.
func numberEnd(d []byte, i int) int {
	digits := func() bool {
		start := i
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case !digits():
		return -1
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			return -1
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			return -1
		}
	}
	return i
}
