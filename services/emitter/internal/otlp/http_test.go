package otlp

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// pubRecorder is a publisher that keeps what it takes, with room for limit messages.
type pubRecorder struct {
	mu    sync.Mutex
	limit int
	msgs  []published
}

type published struct {
	subject, id string
	data        []byte
}

func (p *pubRecorder) Publish(subject, id string, data []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.limit > 0 && len(p.msgs) >= p.limit {
		return false
	}
	p.msgs = append(p.msgs, published{subject, id, data})
	return true
}

func (p *pubRecorder) events(t testing.TB) []events.RequestEvent {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]events.RequestEvent, len(p.msgs))
	for i, m := range p.msgs {
		if err := json.Unmarshal(m.data, &out[i]); err != nil {
			t.Fatalf("published %s: %v", m.data, err)
		}
		if m.id != out[i].EventID {
			t.Fatalf("Nats-Msg-Id %q for event %q", m.id, out[i].EventID)
		}
	}
	return out
}

func newTestReceiver(pub Publisher, token string, maxBytes int64) *Receiver {
	return New(Options{Labels: DefaultLabels(), Token: token, MaxBytes: maxBytes}, pub,
		func() time.Time { return testStart.Add(time.Minute) }, nil, slog.New(slog.DiscardHandler))
}

// batchOf builds a request of n spans, alternating engine and app spans, each with its own
// span id; bad(i, span) may spoil some.
func batchOf(n int, bad func(i int, s ptrace.Span)) ptraceotlp.ExportRequest {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	resource().CopyTo(rs.Resource().Attributes())
	spans := rs.ScopeSpans().AppendEmpty().Spans()
	for i := range n {
		s := spans.AppendEmpty()
		if i%2 == 0 {
			vllmSpan(s)
		} else {
			genaiSpan(s)
		}
		var sid pcommon.SpanID
		binary.BigEndian.PutUint64(sid[:], uint64(i+1))
		s.SetSpanID(sid)
		if bad != nil {
			bad(i, s)
		}
	}
	return ptraceotlp.NewExportRequestFromTraces(td)
}

func post(t testing.TB, h http.Handler, body []byte, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/traces", bytes.NewReader(body))
	req.Header.Set("Content-Type", contentProto)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func protoOf(t testing.TB, er ptraceotlp.ExportRequest) []byte {
	t.Helper()
	b, err := er.MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func exportResponse(t testing.TB, w *httptest.ResponseRecorder) ptraceotlp.ExportResponse {
	t.Helper()
	if w.Code != 200 {
		t.Fatalf("status %d: %q", w.Code, w.Body.String())
	}
	resp := ptraceotlp.NewExportResponse()
	var err error
	if w.Header().Get("Content-Type") == contentJSON {
		err = resp.UnmarshalJSON(w.Body.Bytes())
	} else {
		err = resp.UnmarshalProto(w.Body.Bytes())
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func rpcStatus(t testing.TB, w *httptest.ResponseRecorder) *spb.Status {
	t.Helper()
	var st spb.Status
	unmarshal := proto.Unmarshal
	if w.Header().Get("Content-Type") == contentJSON {
		unmarshal = protojson.Unmarshal
	}
	if err := unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatalf("body %q is not a google.rpc.Status: %v", w.Body.String(), err)
	}
	return &st
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestHTTPProtobufJSONAndGzip(t *testing.T) {
	er := batchOf(4, nil)
	js, err := er.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		header []string
	}{
		{"protobuf", protoOf(t, er), nil},
		{"json", js, []string{"Content-Type", "application/json; charset=utf-8"}},
		{"gzip protobuf", gzipped(t, protoOf(t, er)), []string{"Content-Encoding", "gzip"}},
		{"gzip json", gzipped(t, js), []string{"Content-Type", "application/json", "Content-Encoding", "GZIP"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &pubRecorder{}
			resp := exportResponse(t, post(t, newTestReceiver(pub, "", 0), tc.body, tc.header...))
			if n := resp.PartialSuccess().RejectedSpans(); n != 0 {
				t.Fatalf("rejected %d: %s", n, resp.PartialSuccess().ErrorMessage())
			}
			evs := pub.events(t)
			if len(evs) != 4 {
				t.Fatalf("%d events published, want 4", len(evs))
			}
			layers := map[events.Layer]int{}
			for _, ev := range evs {
				layers[ev.Layer]++
				if ev.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
					t.Fatalf("trace_id %q", ev.TraceID)
				}
			}
			if layers[events.LayerEngine] != 2 || layers[events.LayerApp] != 2 {
				t.Fatalf("layers %v", layers)
			}
			if s := pub.msgs[0].subject; s != "llm.req.prod.support-bot" {
				t.Fatalf("subject %q", s)
			}
		})
	}
}

// TestHTTPBigBatchWithBadSpans: a few bad spans among 10,000 are rejected with their reasons;
// every other span is published.
func TestHTTPBigBatchWithBadSpans(t *testing.T) {
	bad := map[int]func(s ptrace.Span){
		17: func(s ptrace.Span) {
			s.Attributes().Remove("gen_ai.response.model")
			s.Attributes().Remove("gen_ai.request.model")
		},
		1001: func(s ptrace.Span) { s.SetEndTimestamp(s.StartTimestamp() - 1) },
		4242: func(s ptrace.Span) { s.Attributes().PutInt("gen_ai.usage.completion_tokens", -1) },
		9998: func(s ptrace.Span) { s.Attributes().PutStr("gen_ai.response.model", strings.Repeat("x", 4<<20)) },
	}
	er := batchOf(10_000, func(i int, s ptrace.Span) {
		if f := bad[i]; f != nil {
			f(s)
		}
		if i%1000 == 3 { // a span of no LLM kind: ignored, not rejected
			s.SetName("GET /health")
			s.Attributes().Clear()
		}
	})
	pub := &pubRecorder{}
	resp := exportResponse(t, post(t, newTestReceiver(pub, "", 64<<20), protoOf(t, er)))
	ps := resp.PartialSuccess()
	if ps.RejectedSpans() != 4 {
		t.Fatalf("rejected %d, want 4: %s", ps.RejectedSpans(), ps.ErrorMessage())
	}
	msg := ps.ErrorMessage()
	for _, want := range []string{"missing_field 1", "negative 2", "too_long 1", "gen_ai.response.model", "end_time_unix_nano", "output_tokens"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("message %q does not say %q", msg, want)
		}
	}
	if len(msg) > 4096 {
		t.Fatalf("message of %d bytes", len(msg))
	}
	if n := len(pub.events(t)); n != 10_000-4-10 {
		t.Fatalf("%d events published, want %d", n, 10_000-4-10)
	}
}

func TestHTTPRefusals(t *testing.T) {
	good := protoOf(t, batchOf(2, nil))
	bomb := gzipped(t, make([]byte, 8<<20)) // 8 MiB of zeros in a few KB
	for _, tc := range []struct {
		name   string
		body   []byte
		header []string
		status int
		msg    string
	}{
		{"malformed protobuf", []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}, nil, 400, "cannot decode"},
		{"truncated protobuf", good[:len(good)-7], nil, 400, "cannot decode"},
		{"json sent as protobuf", []byte(`{"resourceSpans":[]}`), nil, 400, "cannot decode"},
		{"malformed json", []byte(`{"resourceSpans":[{`), []string{"Content-Type", "application/json"}, 400, "cannot decode"},
		{"wrong content type", good, []string{"Content-Type", "text/plain"}, 415, "content type"},
		{"no content type", good, []string{"Content-Type", ""}, 415, "content type"},
		{"unknown encoding", good, []string{"Content-Encoding", "br"}, 415, "content encoding"},
		{"not gzip", good, []string{"Content-Encoding", "gzip"}, 400, "gzip"},
		{"gzip bomb", bomb, []string{"Content-Encoding", "gzip"}, 413, "limit"},
		{"too large", make([]byte, 2<<20), nil, 413, "limit"},
		{"no token", good, []string{"Authorization", ""}, 401, "token"},
		{"wrong token", good, []string{"Authorization", "Bearer nope"}, 401, "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &pubRecorder{}
			header := append([]string{"Authorization", "bearer  s3cret"}, tc.header...)
			w := post(t, newTestReceiver(pub, "s3cret", 1<<20), tc.body, header...)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %q", w.Code, tc.status, w.Body.String())
			}
			if st := rpcStatus(t, w); !strings.Contains(st.Message, tc.msg) {
				t.Fatalf("message %q does not say %q", st.Message, tc.msg)
			}
			if len(pub.msgs) != 0 {
				t.Fatalf("%d events published", len(pub.msgs))
			}
		})
	}
	t.Run("the token lets it through", func(t *testing.T) {
		pub := &pubRecorder{}
		exportResponse(t, post(t, newTestReceiver(pub, "s3cret", 1<<20), good, "Authorization", "Bearer s3cret"))
		if len(pub.msgs) != 2 {
			t.Fatalf("%d events published", len(pub.msgs))
		}
	})
}

// TestHTTPBufferFull: spans the publisher has no room for make the export retryable (503),
// and the retry publishes the same event ids, for JetStream to drop the copies.
func TestHTTPBufferFull(t *testing.T) {
	pub := &pubRecorder{limit: 3}
	r := newTestReceiver(pub, "", 0)
	body := protoOf(t, batchOf(10, nil))
	w := post(t, r, body)
	if w.Code != 503 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	if st := rpcStatus(t, w); !strings.Contains(st.Message, "7 spans not taken") {
		t.Fatalf("message %q", st.Message)
	}
	first := pub.events(t)
	pub.limit = 0
	exportResponse(t, post(t, r, body))
	all := pub.events(t)
	if len(all) != 13 {
		t.Fatalf("%d published", len(all))
	}
	for i, ev := range first {
		if all[3+i].EventID != ev.EventID {
			t.Fatalf("the retry published %s where the first try had %s", all[3+i].EventID, ev.EventID)
		}
	}
}

func TestHTTPJSONErrorsAreJSON(t *testing.T) {
	w := post(t, newTestReceiver(&pubRecorder{}, "", 0), []byte(`{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}`),
		"Content-Type", "application/json")
	if w.Code != 400 || w.Header().Get("Content-Type") != contentJSON {
		t.Fatalf("status %d, type %q", w.Code, w.Header().Get("Content-Type"))
	}
	var st struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Code != 3 {
		t.Fatalf("%q: %v", w.Body.String(), err)
	}
	_, _ = io.Copy(io.Discard, w.Body)
}

// TestHTTPSlowClientsDelayNoOther opens more connections than there are slots, each
// declaring the largest body and sending one byte of it: a request sent meanwhile is
// answered and its spans published, and the idle ones hold what they sent, not what they
// declared.
func TestHTTPSlowClientsDelayNoOther(t *testing.T) {
	const maxBytes = 16 << 20
	pub := &pubRecorder{}
	r := newTestReceiver(pub, "", maxBytes)
	srv, err := r.Listen("127.0.0.1:0", Off)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, time.Second) }()
	defer func() { cancel(); <-done }()

	idle := 2*cap(r.slots) + 2
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range idle {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n\x0a", contentProto, maxBytes)
	}
	time.Sleep(200 * time.Millisecond) // their handlers are reading the bodies
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > int64(idle)<<20 {
		t.Fatalf("%d connections that sent 1 byte each hold %d MiB", idle, grew>>20)
	}

	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Post("http://"+srv.HTTPAddr()+"/v1/traces", contentProto, bytes.NewReader(protoOf(t, batchOf(4, nil))))
	if err != nil {
		t.Fatalf("a request beside %d slow ones: %v", idle, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(pub.events(t)) != 4 {
		t.Fatalf("a request beside %d slow ones: %d, %d events published", idle, resp.StatusCode, len(pub.events(t)))
	}
}
