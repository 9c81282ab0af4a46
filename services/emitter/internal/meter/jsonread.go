package meter

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// The meter reads a response's JSON the way the provider's clients read it: the official
// SDKs decode with Python's json or JavaScript's JSON.parse, which match member names
// exactly and keep the last of a name given twice. encoding/json matches names without
// regard to case, so a "USAGE" member would pass for "usage"; it is used here only to check
// the syntax and to decode a string.

// Members calls fn with each member of the JSON object obj, in order: its name as written
// (quoted, escapes kept) and where its value lies, obj[start:end]. It reports false when obj
// is not an object, or when fn does. obj must be valid JSON. A name given twice comes twice:
// fn assigning what it reads keeps the last, as Python's json and JSON.parse do. The proxy
// reads request bodies with it, so that requests and responses are read alike.
func Members(obj []byte, fn func(name []byte, start, end int) bool) bool {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipWS(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return true
	}
	for i < len(obj) {
		end := stringEnd(obj, i)
		if end < 0 {
			return false
		}
		name := obj[i:end]
		i = skipWS(obj, skipWS(obj, end)+1) // past the colon
		vend := valueEnd(obj, i)
		if !fn(name, i, vend) {
			return false
		}
		i = skipWS(obj, vend)
		if i >= len(obj) || obj[i] == '}' {
			return true
		}
		i = skipWS(obj, i+1) // past the comma
	}
	return false
}

// NameIs reports whether the quoted JSON string name decodes to key, exactly.
func NameIs(name []byte, key string) bool {
	if bytes.IndexByte(name, '\\') < 0 {
		return len(name) == len(key)+2 && string(name[1:len(name)-1]) == key
	}
	var s string
	return json.Unmarshal(name, &s) == nil && s == key
}

// object calls fn with each member of the JSON object v, in order, its name decoded; null
// has no members. It reports false when v is neither an object nor null, or when fn does.
// v must be valid JSON.
func object(v []byte, fn func(name, value []byte) bool) bool {
	if isNull(v) {
		return true
	}
	return Members(v, func(name []byte, start, end int) bool {
		if bytes.IndexByte(name, '\\') >= 0 {
			var s string
			if json.Unmarshal(name, &s) != nil {
				return false
			}
			return fn([]byte(s), v[start:end])
		}
		return fn(name[1:len(name)-1], v[start:end])
	})
}

// array calls fn with each element of the JSON array v; null has none. It reports false when
// v is neither an array nor null, or when fn does. v must be valid JSON.
func array(v []byte, fn func(elem []byte) bool) bool {
	if isNull(v) {
		return true
	}
	if len(v) == 0 || v[0] != '[' {
		return false
	}
	i := skipWS(v, 1)
	if i < len(v) && v[i] == ']' {
		return true
	}
	for i < len(v) {
		end := valueEnd(v, i)
		if !fn(v[i:end]) {
			return false
		}
		i = skipWS(v, end)
		if i >= len(v) || v[i] == ']' {
			return true
		}
		i = skipWS(v, i+1)
	}
	return false
}

// valueEnd returns the index after the value starting at v[i]; v must be valid JSON.
func valueEnd(v []byte, i int) int {
	switch v[i] {
	case '"':
		return stringEnd(v, i)
	case '{', '[':
		depth := 0
		for i < len(v) {
			switch v[i] {
			case '"':
				i = stringEnd(v, i)
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
	for i < len(v) {
		switch v[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

func isNull(v []byte) bool { return string(v) == "null" }

// textLen is the length in bytes of a string value, decoded; null is 0. ok is false for
// another type.
func textLen(v []byte) (n int, ok bool) {
	switch {
	case isNull(v):
		return 0, true
	case len(v) < 2 || v[0] != '"':
		return 0, false
	case bytes.IndexByte(v, '\\') < 0:
		return len(v) - 2, true
	}
	s, ok := text(v)
	return len(s), ok
}

// text decodes a string value; null is "". ok is false for another type.
func text(v []byte) (s string, ok bool) {
	if isNull(v) {
		return "", true
	}
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	return s, json.Unmarshal(v, &s) == nil
}

// count decodes a token count: an integer, or a number with nothing after its point (1.0,
// as Python's clients accept it); null is absent (nil). ok is false for anything else.
func count(v []byte) (n *int64, ok bool) {
	if isNull(v) {
		return nil, true
	}
	if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		return &i, true
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f != float64(int64(f)) {
		return nil, false
	}
	i := int64(f)
	return &i, true
}
