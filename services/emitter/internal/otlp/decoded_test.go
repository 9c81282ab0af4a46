package otlp

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// hostile builds a request of n empty elements of one kind: what decodes into a hundred
// times its wire size.
func hostile(kind string, n int) ptraceotlp.ExportRequest {
	td := ptrace.NewTraces()
	rss := td.ResourceSpans()
	switch kind {
	case "resource spans":
		for range n {
			rss.AppendEmpty()
		}
		return ptraceotlp.NewExportRequestFromTraces(td)
	case "scope spans":
		sss := rss.AppendEmpty().ScopeSpans()
		for range n {
			sss.AppendEmpty()
		}
		return ptraceotlp.NewExportRequestFromTraces(td)
	}
	spans := rss.AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	if kind == "spans" {
		for range n {
			spans.AppendEmpty()
		}
		return ptraceotlp.NewExportRequestFromTraces(td)
	}
	span := spans.AppendEmpty()
	if kind == "attributes" {
		raw := make(map[string]any, n)
		for i := range n {
			raw[strconv.Itoa(i)] = nil
		}
		_ = span.Attributes().FromRaw(raw)
		return ptraceotlp.NewExportRequestFromTraces(td)
	}
	for i := range n {
		switch kind {
		case "events":
			span.Events().AppendEmpty()
		case "links":
			span.Links().AppendEmpty()
		case "array values":
			if i == 0 {
				span.Attributes().PutEmptySlice("a")
			}
			v, _ := span.Attributes().Get("a")
			v.Slice().AppendEmpty()
		}
	}
	return ptraceotlp.NewExportRequestFromTraces(td)
}

// liveAfterDecoding returns what decoding body holds.
func liveAfterDecoding(t *testing.T, body []byte, isJSON bool) int64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	er := ptraceotlp.NewExportRequest()
	err := er.UnmarshalProto(body)
	if isJSON {
		err = er.UnmarshalJSON(body)
	}
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(er)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// TestDecodedSizeBounded: a request of empty spans, attributes, events, links, array values,
// resource or scope spans takes a hundred times its size once decoded (a request of 16 MiB
// took 2 GiB). Its decoded size is estimated from its wire form before it is decoded, and
// one over four times EMITTER_OTLP_MAX_BYTES is refused: OTLP/HTTP 413, OTLP/gRPC an error,
// both before the decoding, nothing published. The estimate is at least what decoding
// takes, and real spans stay far under the bound.
func TestDecodedSizeBounded(t *testing.T) {
	const maxBytes = 1 << 20
	refused := 0
	for _, kind := range []string{"spans", "attributes", "events", "links", "array values", "resource spans", "scope spans"} {
		for _, isJSON := range []bool{false, true} {
			encode := func(er ptraceotlp.ExportRequest) []byte {
				b, err := er.MarshalProto()
				if isJSON {
					b, err = er.MarshalJSON()
				}
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			estimate := func(b []byte) int64 {
				if !isJSON {
					return protoDecodedSize(b)
				}
				return jsonDecodedSize(b)
			}
			const n = 128 << 10
			body := encode(hostile(kind, n))
			size := estimate(body)
			if live := liveAfterDecoding(t, body, isJSON); size < live {
				t.Errorf("%s (json %v): %d bytes estimated, %d taken by decoding %d bytes", kind, isJSON, size, live, len(body))
			}
			// The same at the size limit: refused when its estimate is over the bound.
			body = encode(hostile(kind, n*(maxBytes-256)/len(body)))
			size = estimate(body)
			pub := &pubRecorder{}
			header := []string{}
			if isJSON {
				header = []string{"Content-Type", contentJSON}
			}
			w := post(t, newTestReceiver(pub, "", maxBytes), body, header...)
			t.Logf("%s (json %v): %d bytes, %d estimated: %d", kind, isJSON, len(body), size, w.Code)
			want := 200
			if size > decodedFactor*maxBytes {
				want = 413
				refused++
			}
			if w.Code != want || want == 413 && (!strings.Contains(rpcStatus(t, w).Message, "once decoded") || len(pub.msgs) != 0) {
				t.Errorf("%s (json %v) of %d bytes, %d estimated: %d %q, %d published", kind, isJSON, len(body), size, w.Code, w.Body, len(pub.msgs))
			}
		}
	}
	if refused < 7 {
		t.Errorf("%d of the hostile requests refused", refused)
	}

	// The names pdata also reads: an escaped key, the deprecated scope spans (field 1000).
	js, _ := hostile("spans", 64<<10).MarshalJSON()
	escaped := bytes.Replace(js, []byte(`"spans"`), []byte(`"\u0073pans"`), 1)
	if a, b := jsonDecodedSize(js), jsonDecodedSize(escaped); b < a {
		t.Errorf("spans under an escaped key: %d bytes estimated, %d unescaped", b, a)
	}
	if live := liveAfterDecoding(t, escaped, true); jsonDecodedSize(escaped) < live {
		t.Errorf("spans under an escaped key: %d bytes estimated, %d taken", jsonDecodedSize(escaped), live)
	}
	var rs []byte
	for range 64 << 10 {
		rs = protowire.AppendTag(rs, 1000, protowire.BytesType)
		rs = protowire.AppendBytes(rs, nil)
	}
	deprecated := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), rs)
	if live := liveAfterDecoding(t, deprecated, false); protoDecodedSize(deprecated) < live {
		t.Errorf("deprecated scope spans: %d bytes estimated, %d taken", protoDecodedSize(deprecated), live)
	}

	// Real spans: the estimate is a few times the wire size, and such a request at the limit
	// goes through.
	real := protoOf(t, batchOf(1000, nil))
	if size := protoDecodedSize(real); size > 3*int64(len(real)) {
		t.Errorf("1000 real spans: %d bytes estimated for %d on the wire", size, len(real))
	}
	js, _ = batchOf(1000, nil).MarshalJSON()
	if size := jsonDecodedSize(js); size > 2*int64(len(js)) {
		t.Errorf("1000 real spans in JSON: %d bytes estimated for %d", size, len(js))
	}
	n := 1000 * maxBytes / len(real)
	pub := &pubRecorder{}
	if resp := exportResponse(t, post(t, newTestReceiver(pub, "", maxBytes), protoOf(t, batchOf(n, nil)))); resp.PartialSuccess().RejectedSpans() != 0 || len(pub.msgs) != n {
		t.Fatalf("%d real spans: %d rejected, %d published", n, resp.PartialSuccess().RejectedSpans(), len(pub.msgs))
	}

	// OTLP/gRPC refuses the same before decoding it.
	pub = &pubRecorder{}
	client := ptraceotlp.NewGRPCClient(grpcRig(t, pub, "", maxBytes))
	spans := protoOf(t, hostile("spans", 1024))
	_, err := client.Export(context.Background(), hostile("spans", 1024*(maxBytes-256)/len(spans)))
	if st, _ := status.FromError(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "once decoded") {
		t.Fatalf("gRPC: %v", err)
	}
	if _, err := client.Export(context.Background(), batchOf(10, nil)); err != nil || len(pub.msgs) != 10 {
		t.Fatalf("gRPC, real spans: %v, %d published", err, len(pub.msgs))
	}
}

// FuzzDecodedSize: the estimates read any bytes without failing, never below their length,
// and never below what pdata takes for a request it decodes.
func FuzzDecodedSize(f *testing.F) {
	for _, kind := range []string{"spans", "attributes", "array values"} {
		pb, _ := hostile(kind, 8).MarshalProto()
		js, _ := hostile(kind, 8).MarshalJSON()
		f.Add(pb)
		f.Add(js)
	}
	pb, _ := batchOf(4, nil).MarshalProto()
	f.Add(pb)
	f.Add([]byte(`{"resourceSpans":[{"scopeSpans":[{"\u0073pans":[{},{"a":"\"[{"}]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, j := protoDecodedSize(b), jsonDecodedSize(b)
		if p < int64(len(b)) || j < int64(len(b)) {
			t.Fatalf("estimates %d and %d below the %d bytes", p, j, len(b))
		}
		if er := ptraceotlp.NewExportRequest(); er.UnmarshalProto(b) == nil {
			if spans := int64(er.Traces().SpanCount()); p < int64(len(b))+spans*costSpan {
				t.Fatalf("%d spans decoded, %d bytes estimated", spans, p)
			}
		}
		if er := ptraceotlp.NewExportRequest(); er.UnmarshalJSON(b) == nil {
			if spans := int64(er.Traces().SpanCount()); j < int64(len(b))+spans*costSpan {
				t.Fatalf("%d spans decoded from JSON, %d bytes estimated", spans, j)
			}
		}
	})
}
