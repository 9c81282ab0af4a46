package proxy

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net/http"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// W3C Trace Context (https://www.w3.org/TR/trace-context/): the proxy forwards the client's
// traceparent unchanged, so that the engine's span joins the client's trace, and starts a
// trace where the client sent none, or one that is not valid, so that the gateway's event
// and the engine's span of every request share a trace id.
const (
	headerTraceparent = "Traceparent"
	headerTracestate  = "Tracestate"
)

// trace returns the trace id of h's traceparent, first setting a new traceparent (a new
// trace id and span id, sampled) when h has none or not exactly one valid one; tracestate
// goes with an invalid traceparent, as the specification asks.
func trace(h http.Header) string {
	if v := h[headerTraceparent]; len(v) == 1 {
		if id, ok := traceID(v[0]); ok {
			return id
		}
	}
	delete(h, headerTracestate)
	var b [55]byte
	copy(b[:], "00-")
	var ids [24]byte
	for {
		binary.LittleEndian.PutUint64(ids[0:], rand.Uint64())
		binary.LittleEndian.PutUint64(ids[8:], rand.Uint64())
		binary.LittleEndian.PutUint64(ids[16:], rand.Uint64())
		if !allZero(ids[:16]) && !allZero(ids[16:]) {
			break
		}
	}
	hex.Encode(b[3:35], ids[:16])
	b[35] = '-'
	hex.Encode(b[36:52], ids[16:])
	copy(b[52:], "-01")
	tp := string(b[:])
	h[headerTraceparent] = []string{tp}
	return tp[3:35]
}

// traceID returns the trace id of a traceparent value, and false when the value is not a
// valid one: version 00 is exactly version-traceid-parentid-flags; a later version may
// carry more after a '-', and version ff is invalid.
func traceID(v string) (string, bool) {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' || !isLowerHex(v[0:2]) || !isLowerHex(v[53:55]) {
		return "", false
	}
	switch {
	case v[0:2] == "ff":
		return "", false
	case v[0:2] == "00" && len(v) != 55:
		return "", false
	case len(v) > 55 && v[55] != '-':
		return "", false
	}
	id := v[3:35]
	if !events.ValidTraceID(id) || !events.ValidSpanID(v[36:52]) {
		return "", false
	}
	return id, true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
