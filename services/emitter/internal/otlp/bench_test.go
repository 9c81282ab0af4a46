package otlp

import (
	"encoding/binary"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

type discard struct{}

func (discard) Publish(string, string, []byte) bool { return true }

// BenchmarkHTTPProtobuf is the receiver's own work on one OTLP/HTTP protobuf request of
// 1,000 vLLM spans (decode, classify, map, validate, encode), without NATS: what the
// emitter adds per span to the publisher's cost.
func BenchmarkHTTPProtobuf(b *testing.B) {
	body := protoOf(b, batchOf(1000, func(i int, s ptrace.Span) { vllmSpan(s); s.SetSpanID(spanID(i)) }))
	r := newTestReceiver(discard{}, "", 0)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if w := post(b, r, body); w.Code != 200 {
			b.Fatal(w.Code, w.Body.String())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000)/1e3, "µs/span")
}

func spanID(i int) pcommon.SpanID {
	var sid pcommon.SpanID
	binary.BigEndian.PutUint64(sid[:], uint64(i+1))
	return sid
}
