package otlp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
		case 2:
			return msgScopeSpans, costScopeSpans
		}
	case msgResource:
		switch num {
		case 1:
			return msgKeyValue, costKeyValue
		case 3:
			return msgLeaf, costEntityRef
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
// an allocation of their own, in both spellings the OTLP JSON encoding allows, and what
// an element costs ("values" is an array value's or a kvlist's: the dearer is taken).
var jsonElements = map[string]int64{
	"resourceSpans": costResourceSpans, "resource_spans": costResourceSpans,
	"scopeSpans": costScopeSpans, "scope_spans": costScopeSpans,
	"spans": costSpan, "events": costEvent, "links": costLink,
	"attributes": costKeyValue, "values": costKeyValue,
	"entityRefs": costEntityRef, "entity_refs": costEntityRef,
}

// jsonDecodedSize estimates the memory an ExportTraceServiceRequest in the OTLP JSON
// encoding takes once decoded, reading its tokens (encoding/json) without decoding it. The
// error is the body's syntax error.
func jsonDecodedSize(b []byte) (int64, error) {
	type frame struct {
		object, wantKey bool
		key             string // an object's last key, naming the array that may follow
		cost            int64  // an array's: what each object in it costs
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	sum := int64(len(b))
	var stack []frame
	deeper := 0 // containers open past maxWalkDepth, where every object counts as an attribute
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return sum, nil
		}
		if err != nil {
			return 0, err
		}
		var top *frame
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		d, isDelim := tok.(json.Delim)
		switch {
		case deeper > 0:
			switch d {
			case '{':
				sum += costKeyValue
				deeper++
			case '[':
				deeper++
			case '}', ']':
				if deeper--; deeper == 0 && top.object {
					top.wantKey = true
				}
			}
		case top != nil && top.object && top.wantKey && !isDelim:
			top.key, top.wantKey = tok.(string), false
		case d == '{' || d == '[':
			f := frame{object: d == '{', wantKey: d == '{'}
			if top != nil && !top.object && d == '{' {
				sum += top.cost
			}
			if top != nil && top.object && d == '[' {
				f.cost = jsonElements[top.key]
			}
			if len(stack) == maxWalkDepth {
				if d == '{' {
					sum += costKeyValue
				}
				deeper = 1
				break
			}
			stack = append(stack, f)
		case d == '}' || d == ']':
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
		case top != nil && top.object:
			top.wantKey = true // a scalar value: a key comes next
		}
	}
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
