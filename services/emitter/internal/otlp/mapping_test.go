package otlp

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var (
	testStart = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	testTID   = pcommon.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	testSID   = pcommon.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
)

// vllmSpan fills span as vLLM's output processor does for one finished request.
func vllmSpan(span ptrace.Span) {
	span.SetName("llm_request")
	span.SetKind(ptrace.SpanKindServer)
	span.SetTraceID(testTID)
	span.SetSpanID(testSID)
	span.SetStartTimestamp(pcommon.NewTimestampFromTime(testStart))
	span.SetEndTimestamp(pcommon.NewTimestampFromTime(testStart.Add(2500 * time.Millisecond)))
	a := span.Attributes()
	a.PutStr("gen_ai.response.model", "meta-llama/Llama-3.1-8B-Instruct")
	a.PutStr("gen_ai.request.id", "cmpl-1")
	a.PutInt("gen_ai.request.max_tokens", 256)
	a.PutInt("gen_ai.usage.prompt_tokens", 812)
	a.PutInt("gen_ai.usage.completion_tokens", 120)
	a.PutDouble("gen_ai.latency.time_in_queue", 0.05)
	a.PutDouble("gen_ai.latency.time_to_first_token", 0.2)
	a.PutDouble("gen_ai.latency.e2e", 2.4)
	a.PutDouble("gen_ai.latency.time_in_model_prefill", 0.15)
	a.PutDouble("gen_ai.latency.time_in_model_decode", 2.2)
	a.PutDouble("gen_ai.latency.time_in_model_inference", 2.35)
}

// genaiSpan fills span as an OpenTelemetry GenAI instrumentation does for one chat call.
func genaiSpan(span ptrace.Span) {
	span.SetName("chat gpt-4o")
	span.SetKind(ptrace.SpanKindClient)
	span.SetTraceID(testTID)
	span.SetSpanID(testSID)
	span.SetStartTimestamp(pcommon.NewTimestampFromTime(testStart))
	span.SetEndTimestamp(pcommon.NewTimestampFromTime(testStart.Add(1800 * time.Millisecond)))
	a := span.Attributes()
	a.PutStr("gen_ai.operation.name", "chat")
	a.PutStr("gen_ai.provider.name", "openai")
	a.PutStr("gen_ai.request.model", "gpt-4o")
	a.PutStr("gen_ai.response.model", "gpt-4o-2024-08-06")
	a.PutInt("gen_ai.usage.input_tokens", 300)
	a.PutInt("gen_ai.usage.output_tokens", 40)
	a.PutInt("gen_ai.usage.cache_read.input_tokens", 256)
	a.PutEmptySlice("gen_ai.response.finish_reasons").AppendEmpty().SetStr("stop")
}

func resource() pcommon.Map {
	m := pcommon.NewMap()
	m.PutStr("service.name", "support-bot")
	m.PutStr("deployment.environment.name", "prod")
	m.PutStr("host.name", "gpu-node-3")
	return m
}

func TestMapEngineSpan(t *testing.T) {
	span := ptrace.NewSpan()
	vllmSpan(span)
	labels := DefaultLabels()
	if k := Classify(span); k != KindEngine {
		t.Fatalf("classified %v", k)
	}
	var ev events.RequestEvent
	if err := labels.Map(labels.Resource(resource()), span, KindEngine, &ev); err != nil {
		t.Fatal(err)
	}
	if err := ev.ValidateAt(testStart); err != nil {
		t.Fatal(err)
	}
	want := events.RequestEvent{V: 1, EventID: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", TS: testStart,
		Model: "meta-llama/Llama-3.1-8B-Instruct", Scene: "support-bot", Env: "prod", Instance: "gpu-node-3",
		InputTokens: 812, OutputTokens: 120, TTFTMs: 200, TotalMs: 2400, QueueMs: 50, PrefillMs: 150, DecodeMs: 2200,
		Status: events.StatusOK, Layer: events.LayerEngine, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("mapped\n%+v\nwant\n%+v", ev, want)
	}
}

func TestMapAppSpan(t *testing.T) {
	span := ptrace.NewSpan()
	genaiSpan(span)
	labels := DefaultLabels()
	if k := Classify(span); k != KindApp {
		t.Fatalf("classified %v", k)
	}
	var ev events.RequestEvent
	if err := labels.Map(labels.Resource(resource()), span, KindApp, &ev); err != nil {
		t.Fatal(err)
	}
	want := events.RequestEvent{V: 1, EventID: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", TS: testStart,
		Model: "gpt-4o-2024-08-06", Scene: "support-bot", Env: "prod", Instance: "gpu-node-3", Provider: "openai",
		InputTokens: 300, OutputTokens: 40, CachedInputTokens: 256, TTFTMs: 1800, TotalMs: 1800,
		Status: events.StatusOK, Layer: events.LayerApp, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("mapped\n%+v\nwant\n%+v", ev, want)
	}
}

func TestClassify(t *testing.T) {
	f := func(name string, attrs map[string]any, want Kind) {
		t.Helper()
		span := ptrace.NewSpan()
		span.SetName(name)
		if err := span.Attributes().FromRaw(attrs); err != nil {
			t.Fatal(err)
		}
		if got := Classify(span); got != want {
			t.Fatalf("%q %v: %v, want %v", name, attrs, got, want)
		}
	}
	f("llm_request", nil, KindEngine)
	f("engine", map[string]any{"gen_ai.latency.e2e": 1.0}, KindEngine)
	f("chat gpt-4o", map[string]any{"gen_ai.operation.name": "chat"}, KindApp)
	f("x", map[string]any{"gen_ai.operation.name": "text_completion"}, KindApp)
	f("x", map[string]any{"gen_ai.operation.name": "generate_content"}, KindApp)
	f("execute_tool", map[string]any{"gen_ai.operation.name": "execute_tool"}, KindOther)
	f("embeddings", map[string]any{"gen_ai.operation.name": "embeddings"}, KindOther)
	f("invoke_agent", map[string]any{"gen_ai.operation.name": "invoke_agent"}, KindOther)
	f("x", map[string]any{"gen_ai.operation.name": 1}, KindOther)
	f("GET /v1/models", map[string]any{"http.request.method": "GET"}, KindOther)
}

func TestMapRejects(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kind    Kind
		edit    func(s ptrace.Span)
		wantErr error
		field   string // in the message
	}{
		{"no trace id", KindEngine, func(s ptrace.Span) { s.SetTraceID(pcommon.NewTraceIDEmpty()) }, events.ErrMissingField, "trace_id"},
		{"no span id", KindEngine, func(s ptrace.Span) { s.SetSpanID(pcommon.NewSpanIDEmpty()) }, events.ErrMissingField, "span_id"},
		{"no start", KindApp, func(s ptrace.Span) { s.SetStartTimestamp(0) }, events.ErrMissingField, "start_time_unix_nano"},
		{"no end", KindApp, func(s ptrace.Span) { s.SetEndTimestamp(0) }, events.ErrMissingField, "end_time_unix_nano"},
		{"inverted times", KindApp, func(s ptrace.Span) {
			s.SetEndTimestamp(pcommon.NewTimestampFromTime(testStart.Add(-time.Second)))
		}, events.ErrNegative, "end_time_unix_nano"},
		{"no model", KindEngine, func(s ptrace.Span) { s.Attributes().Remove("gen_ai.response.model") }, events.ErrMissingField, "gen_ai.response.model"},
		{"no prompt tokens", KindEngine, func(s ptrace.Span) { s.Attributes().Remove("gen_ai.usage.prompt_tokens") }, events.ErrMissingField, "gen_ai.usage.prompt_tokens"},
		{"no ttft", KindEngine, func(s ptrace.Span) { s.Attributes().Remove("gen_ai.latency.time_to_first_token") }, events.ErrMissingField, "gen_ai.latency.time_to_first_token"},
		{"tokens as text", KindEngine, func(s ptrace.Span) { s.Attributes().PutStr("gen_ai.usage.prompt_tokens", "many") }, events.ErrWrongType, "gen_ai.usage.prompt_tokens"},
		{"tokens fractional", KindEngine, func(s ptrace.Span) { s.Attributes().PutDouble("gen_ai.usage.prompt_tokens", 1.5) }, events.ErrWrongType, "gen_ai.usage.prompt_tokens"},
		{"latency as bool", KindEngine, func(s ptrace.Span) { s.Attributes().PutBool("gen_ai.latency.e2e", true) }, events.ErrWrongType, "gen_ai.latency.e2e"},
		{"output tokens missing", KindApp, func(s ptrace.Span) { s.Attributes().Remove("gen_ai.usage.output_tokens") }, events.ErrMissingField, "gen_ai.usage.output_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			span := ptrace.NewSpan()
			if tc.kind == KindEngine {
				vllmSpan(span)
			} else {
				genaiSpan(span)
			}
			tc.edit(span)
			labels := DefaultLabels()
			var ev events.RequestEvent
			err := labels.Map(labels.Resource(resource()), span, tc.kind, &ev)
			if !errors.Is(err, tc.wantErr) || !errors.Is(err, events.ErrInvalidEvent) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("%q does not name %s", err, tc.field)
			}
		})
	}
}

// TestMapThenValidate covers what the mapping passes on for the contract to refuse, as any
// event: negative and non-finite latencies, TTFT over total, labels too long.
func TestMapThenValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(a pcommon.Map)
		wantErr error
	}{
		{"negative queue", func(a pcommon.Map) { a.PutDouble("gen_ai.latency.time_in_queue", -0.1) }, events.ErrNegative},
		{"negative tokens", func(a pcommon.Map) { a.PutInt("gen_ai.usage.completion_tokens", -3) }, events.ErrNegative},
		{"nan prefill", func(a pcommon.Map) { a.PutDouble("gen_ai.latency.time_in_model_prefill", math.NaN()) }, events.ErrOutOfRange},
		{"infinite ttft", func(a pcommon.Map) { a.PutDouble("gen_ai.latency.time_to_first_token", math.Inf(1)) }, events.ErrOutOfRange},
		{"ttft over e2e", func(a pcommon.Map) { a.PutDouble("gen_ai.latency.time_to_first_token", 3) }, events.ErrTTFTAboveTotal},
		{"huge model", func(a pcommon.Map) { a.PutStr("gen_ai.response.model", strings.Repeat("m", 1<<20)) }, events.ErrTooLong},
		{"model not utf-8", func(a pcommon.Map) { a.PutStr("gen_ai.response.model", "\xff\xfe") }, events.ErrNotUTF8},
		{"tokens over the limit", func(a pcommon.Map) { a.PutInt("gen_ai.usage.prompt_tokens", math.MaxInt64) }, events.ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			span := ptrace.NewSpan()
			vllmSpan(span)
			tc.edit(span.Attributes())
			labels := DefaultLabels()
			var ev events.RequestEvent
			err := labels.Map(labels.Resource(resource()), span, KindEngine, &ev)
			if err == nil {
				err = ev.ValidateAt(testStart)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if len(err.Error()) > 512 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
		})
	}
}

func TestMapLabelsAndStatus(t *testing.T) {
	t.Run("span attributes win over the resource's, defaults last", func(t *testing.T) {
		span := ptrace.NewSpan()
		genaiSpan(span)
		span.Attributes().PutStr("tokenscope.scene", "checkout")
		res := pcommon.NewMap()
		res.PutStr("deployment.environment", "staging") // the older key
		labels := DefaultLabels()
		var ev events.RequestEvent
		if err := labels.Map(labels.Resource(res), span, KindApp, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Scene != "checkout" || ev.Env != "staging" || ev.Instance != "" {
			t.Fatalf("scene %q env %q instance %q", ev.Scene, ev.Env, ev.Instance)
		}
		if err := labels.Map(labels.Resource(pcommon.NewMap()), span, KindApp, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Env != "dev" {
			t.Fatalf("env %q, want the default", ev.Env)
		}
	})
	t.Run("a label key of the GenAI conventions' own", func(t *testing.T) {
		// gen_ai.agent.name as the scene: read on the span, as any other key is, not only
		// on the resource.
		span := ptrace.NewSpan()
		genaiSpan(span)
		span.Attributes().PutStr("gen_ai.agent.name", "refunds")
		labels := DefaultLabels()
		labels.Scene = []string{"gen_ai.agent.name", "service.name"}
		var ev events.RequestEvent
		if err := labels.Map(labels.Resource(resource()), span, KindApp, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Scene != "refunds" {
			t.Fatalf("scene %q, want the span's gen_ai.agent.name", ev.Scene)
		}
	})
	t.Run("older names", func(t *testing.T) {
		span := ptrace.NewSpan()
		genaiSpan(span)
		a := span.Attributes()
		a.Remove("gen_ai.provider.name")
		a.PutStr("gen_ai.system", "anthropic")
		a.Remove("gen_ai.usage.input_tokens")
		a.PutStr("gen_ai.usage.prompt_tokens", "77")
		a.PutDouble("gen_ai.response.time_to_first_chunk", 0.3)
		a.PutBool("gen_ai.request.stream", true)
		labels := DefaultLabels()
		var ev events.RequestEvent
		if err := labels.Map(labels.Resource(resource()), span, KindApp, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Provider != "anthropic" || ev.InputTokens != 77 || ev.TTFTMs != 300 || !ev.Stream || ev.CachedInputTokens != 0 {
			t.Fatalf("%+v", ev)
		}
	})
	for _, tc := range []struct {
		errType    string
		spanStatus ptrace.StatusCode
		want       events.Status
		code       string
	}{
		{"", ptrace.StatusCodeError, events.StatusError, "span_error"},
		{"RateLimitError", ptrace.StatusCodeUnset, events.StatusError, "RateLimitError"},
		{"timeout", ptrace.StatusCodeError, events.StatusTimeout, "timeout"},
		{"APITimeoutError", ptrace.StatusCodeError, events.StatusTimeout, "APITimeoutError"},
		{"asyncio.CancelledError", ptrace.StatusCodeError, events.StatusCanceled, "asyncio.CancelledError"},
		// Not a string, as the conventions have it, but an error all the same.
		{"int 500", ptrace.StatusCodeUnset, events.StatusError, "500"},
	} {
		t.Run("error "+tc.errType, func(t *testing.T) {
			span := ptrace.NewSpan()
			genaiSpan(span)
			span.Status().SetCode(tc.spanStatus)
			a := span.Attributes()
			a.Remove("gen_ai.usage.input_tokens") // a failed call may have no usage
			a.Remove("gen_ai.usage.output_tokens")
			switch tc.errType {
			case "":
			case "int 500":
				a.PutInt("error.type", 500)
			default:
				a.PutStr("error.type", tc.errType)
			}
			labels := DefaultLabels()
			var ev events.RequestEvent
			if err := labels.Map(labels.Resource(resource()), span, KindApp, &ev); err != nil {
				t.Fatal(err)
			}
			if err := ev.ValidateAt(testStart); err != nil {
				t.Fatal(err)
			}
			if ev.Status != tc.want || ev.ErrorCode != tc.code {
				t.Fatalf("status %q code %q", ev.Status, ev.ErrorCode)
			}
		})
	}
}

// withTwice returns span as decoded from the wire with key given twice among its
// attributes, first as first sets it and then as second does: pdata's API keeps keys
// unique, but a request may hold one more than once.
func withTwice(t *testing.T, span ptrace.Span, key string, first, second func(a pcommon.Map, key string)) ptrace.Span {
	t.Helper()
	stand := key[:len(key)-1] + "#" // the same length on the wire, renamed once encoded
	td := ptrace.NewTraces()
	sp := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	span.CopyTo(sp)
	first(sp.Attributes(), key)
	second(sp.Attributes(), stand)
	b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	er := ptraceotlp.NewExportRequest()
	if err := er.UnmarshalProto(bytes.ReplaceAll(b, []byte(stand), []byte(key))); err != nil {
		t.Fatal(err)
	}
	return er.Traces().ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0)
}

// TestMapRefusesAttributeGivenTwice: OTLP's attribute keys are unique, and readers differ
// on which of two they take (pdata's Get, and so the Collector, the first), so a span with
// one the mapping reads given twice is refused, naming it, rather than read with either.
func TestMapRefusesAttributeGivenTwice(t *testing.T) {
	putInt := func(n int64) func(pcommon.Map, string) { return func(a pcommon.Map, k string) { a.PutInt(k, n) } }
	putStr := func(s string) func(pcommon.Map, string) { return func(a pcommon.Map, k string) { a.PutStr(k, s) } }
	for _, tc := range []struct {
		name          string
		key           string
		first, second func(pcommon.Map, string)
	}{
		{"token count", "gen_ai.usage.output_tokens", putInt(40), putInt(5000)},
		{"model", "gen_ai.response.model", putStr("gpt-4o"), putStr("gpt-4o-mini")},
		{"operation", "gen_ai.operation.name", putStr("chat"), putStr("embeddings")},
		{"label", "tokenscope.scene", putStr("checkout"), putStr("refunds")},
		{"label, first not a string", "tokenscope.env", putInt(1), putStr("prod")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			span := ptrace.NewSpan()
			genaiSpan(span)
			span = withTwice(t, span, tc.key, tc.first, tc.second)
			n := 0
			for k := range span.Attributes().All() {
				if k == tc.key {
					n++
				}
			}
			if n != 2 {
				t.Fatalf("%s %d times in the span, want twice", tc.key, n)
			}
			labels := DefaultLabels()
			var ev events.RequestEvent
			err := labels.Map(labels.Resource(resource()), span, Classify(span), &ev)
			var fe *events.FieldError
			if !errors.Is(err, events.ErrInvalidEvent) || !errors.As(err, &fe) || fe.Field != tc.key {
				t.Fatalf("err %v, want the span refused naming %s (event %+v)", err, tc.key, ev)
			}
		})
	}
}
