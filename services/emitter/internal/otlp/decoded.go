package otlp

import (
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// decodedFactor bounds a request's decoded form: at most this many times MaxBytes. A span
// takes about 220 bytes once decoded and 2 on the wire when empty, so without a bound a
// request of MaxBytes of empty spans, attributes or events decodes into a hundred times
// its size (16 MiB into 2 GiB); real spans decode into two to five times theirs.
const decodedFactor = 4

// errTooManyElements is a request whose decoded form would be over decodedFactor times
// MaxBytes.
var errTooManyElements = errors.New("the request's spans, events, links and attributes would take too much memory once decoded")

// The memory pdata takes for each element it decodes, measured (pdata 1.71, 64-bit) and
// rounded up: what the wire form of an empty one (2 bytes) becomes. Strings take about
// their length, which the body's length counts.
const (
	costResourceSpans = 144
	costScopeSpans    = 128
	costSpan          = 224
	costEvent         = 80
	costLink          = 96
	costKeyValue      = 48 // an attribute, or an entry of a kvlist value
	costAnyValue      = 24 // an element of an array value
	costEntityRef     = 96
	costString        = 16 // an element of an entity ref's repeated strings
)

// message is a protobuf message of the OTLP trace request that holds repeated messages.
type message uint8

const (
	msgRequest message = iota
	msgResourceSpans
	msgResource
	msgScopeSpans
	msgScope
	msgSpan
	msgEvent
	msgLink
	msgKeyValue
	msgAnyValue
	msgArray
	msgKVList
	msgEntityRef
	msgLeaf // a message holding no repeated message: counted by its parent, not read
)

// child says what field num of m holds, and what one occurrence of it costs.
func child(m message, num protowire.Number) (message, int64) {
	switch m {
	case msgRequest:
		if num == 1 {
			return msgResourceSpans, costResourceSpans
		}
	case msgResourceSpans:
		switch num {
		case 1:
			return msgResource, 0
		case 2, 1000: // 1000: the deprecated instrumentation_library_spans, read as scope spans
			return msgScopeSpans, costScopeSpans
		}
	case msgResource:
		switch num {
		case 1:
			return msgKeyValue, costKeyValue
		case 3:
			return msgEntityRef, costEntityRef
		}
	case msgEntityRef:
		if num == 3 || num == 4 {
			return msgLeaf, costString
		}
	case msgScopeSpans:
		switch num {
		case 1:
			return msgScope, 0
		case 2:
			return msgSpan, costSpan
		}
	case msgScope:
		if num == 3 {
			return msgKeyValue, costKeyValue
		}
	case msgSpan:
		switch num {
		case 9:
			return msgKeyValue, costKeyValue
		case 11:
			return msgEvent, costEvent
		case 13:
			return msgLink, costLink
		}
	case msgEvent:
		if num == 3 {
			return msgKeyValue, costKeyValue
		}
	case msgLink:
		if num == 4 {
			return msgKeyValue, costKeyValue
		}
	case msgKeyValue:
		if num == 2 {
			return msgAnyValue, 0
		}
	case msgAnyValue:
		switch num {
		case 5:
			return msgArray, 0
		case 6:
			return msgKVList, 0
		}
	case msgArray:
		if num == 1 {
			return msgAnyValue, costAnyValue
		}
	case msgKVList:
		if num == 1 {
			return msgKeyValue, costKeyValue
		}
	}
	return msgLeaf, 0
}

// maxWalkDepth bounds the nesting the estimates follow; a value nested deeper is counted
// as if every two bytes of it were an element.
const maxWalkDepth = 64

// protoDecodedSize estimates the memory an ExportTraceServiceRequest in the protobuf
// encoding takes once decoded, reading its wire form (protowire) without decoding it. Wire
// data it cannot read is left for the decoder to report.
func protoDecodedSize(b []byte) int64 {
	return int64(len(b)) + protoCost(b, msgRequest, 0)
}

func protoCost(b []byte, m message, depth int) int64 {
	if depth > maxWalkDepth {
		return int64(len(b)) / 2 * costKeyValue
	}
	var sum int64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return sum
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return sum
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return sum
		}
		b = b[n:]
		if c, cost := child(m, num); c != msgLeaf || cost > 0 {
			sum += cost
			if c != msgLeaf {
				sum += protoCost(v, c, depth+1)
			}
		}
	}
	return sum
}

// jsonElements are the JSON names of the OTLP arrays whose elements pdata decodes into
// an allocation of their own, in both spellings pdata reads, and what an element costs
// ("values" is an array value's or a kvlist's: the dearer is taken).
var jsonElements = map[string]int64{
	"resourceSpans": costResourceSpans, "resource_spans": costResourceSpans,
	"scopeSpans": costScopeSpans, "scope_spans": costScopeSpans,
	"deprecatedScopeSpans": costScopeSpans, "deprecated_scope_spans": costScopeSpans,
	"spans": costSpan, "events": costEvent, "links": costLink,
	"attributes": costKeyValue, "values": costKeyValue,
	"entityRefs": costEntityRef, "entity_refs": costEntityRef,
	"idKeys": costString, "id_keys": costString, "descriptionKeys": costString, "description_keys": costString,
}

// jsonDecodedSize estimates the memory an ExportTraceServiceRequest in the OTLP JSON
// encoding takes once decoded. It reads the structure only (strings, keys, brackets), so
// it is many times faster than a tokenizer; the decoder then checks the syntax, and a body
// that is not JSON is estimated as whatever its brackets say.
func jsonDecodedSize(b []byte) int64 {
	sum := int64(len(b))
	var stack [maxWalkDepth]int64 // per open array: what each object in it costs; objects 0
	depth, deeper := 0, 0         // deeper: open past maxWalkDepth, every object an attribute
	keyStart, keyEnd := -1, -1    // the last string, while it may be the key of what follows
	afterColon := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			start := i + 1
			escaped := false
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					escaped = true
					i++
				}
			}
			if escaped {
				keyStart, keyEnd = -start, i // unescaped when it names an array
			} else {
				keyStart, keyEnd = start, i
			}
			afterColon = false
			continue
		case ':':
			afterColon = keyEnd >= 0
			continue
		case ' ', '\t', '\r', '\n':
			continue
		case '[', '{':
			var cost int64
			if c == '[' && afterColon {
				cost = jsonElements[jsonKey(b, keyStart, keyEnd)]
			}
			if c == '{' {
				switch {
				case deeper > 0:
					sum += costKeyValue
				case depth > 0:
					sum += stack[depth-1]
				}
			}
			if deeper > 0 || depth == maxWalkDepth {
				deeper++
			} else {
				stack[depth] = cost
				depth++
			}
		case ']', '}':
			if deeper > 0 {
				deeper--
			} else if depth > 0 {
				depth--
			}
		}
		keyStart, keyEnd, afterColon = -1, -1, false
	}
	return sum
}

// jsonKey returns the key b[start:end], or the escaped one at b[-start:end] unescaped.
func jsonKey(b []byte, start, end int) string {
	if start >= 0 {
		return string(b[start:end]) // a map index of a conversion does not allocate
	}
	var key string
	if end < len(b) {
		_ = json.Unmarshal(b[-start-1:end+1], &key)
	}
	return key
}

// otelEncoder is pdata's request, which decodes itself.
type otelEncoder interface {
	UnmarshalProto([]byte) error
}

// codec is the gRPC server's "proto" codec: pdata's (which its package registers), with
// the request's decoded size checked before it is decoded.
type codec struct {
	encoding.CodecV2
	limit int64
}

func newCodec(limit int64) *codec {
	return &codec{CodecV2: encoding.GetCodecV2("proto"), limit: limit}
}

func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(otelEncoder)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if n := protoDecodedSize(b); n > c.limit {
		return fmt.Errorf("%w: about %d bytes, over %d (%d times the largest request)", errTooManyElements, n, c.limit, decodedFactor)
	}
	return m.UnmarshalProto(b)
}
