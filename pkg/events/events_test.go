package events_test

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// testNow is the clock for fixtures, so the future-timestamp rule is deterministic.
var testNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func sampleEvent() events.RequestEvent {
	return events.RequestEvent{
		V: 1, EventID: "0192f5c8-7a3e-7c41-9b1a-3f2d4e5a6b7c",
		TS:    time.Date(2026, 11, 30, 10, 0, 0, 123e6, time.UTC),
		Model: "qwen2.5-72b-instruct", Scene: "customer-service", Env: "prod", Instance: "gpu-node-3",
		Layer: events.LayerGateway, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
		InputTokens: 812, OutputTokens: 245, CachedInputTokens: 512,
		TTFTMs: 412.5, TotalMs: 6120.75, MaxITLMs: 80.25,
		Status: events.StatusOK, Stream: true, ConversationID: "conv-1", Turn: 2,
	}
}

func TestRoundTrip(t *testing.T) {
	ev := sampleEvent()
	data := events.AppendRequest(nil, &ev)
	var got events.RequestEvent
	if err := events.UnmarshalRequest(data, &got); err != nil {
		t.Fatalf("UnmarshalRequest(%s): %v", data, err)
	}
	if !reflect.DeepEqual(got, ev) {
		t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", got, ev)
	}
	// encoding/json must read what AppendRequest writes into the same struct.
	var viaStd map[string]any
	if err := json.Unmarshal(data, &viaStd); err != nil {
		t.Fatalf("encoding/json cannot read %s: %v", data, err)
	}
	if viaStd["ts"] != "2026-11-30T10:00:00.123Z" || viaStd["ttft_ms"] != 412.5 {
		t.Fatalf("unexpected document %s", data)
	}
}

// TestLayerRoundTrip keeps an engine event's layer, trace id and time split through the
// encoder and both decoders, and reads an event without a layer as a gateway event.
func TestLayerRoundTrip(t *testing.T) {
	ev := sampleEvent()
	ev.Layer, ev.QueueMs, ev.PrefillMs, ev.DecodeMs = events.LayerEngine, 120, 280.5, 5300.25
	data := events.AppendRequest(nil, &ev)
	for _, decode := range []func([]byte, *events.RequestEvent) error{events.UnmarshalRequest, events.NewDecoder(16).Decode} {
		var got events.RequestEvent
		if err := decode(data, &got); err != nil {
			t.Fatalf("decode(%s): %v", data, err)
		}
		if !reflect.DeepEqual(got, ev) {
			t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", got, ev)
		}
		if err := got.ValidateAt(testNow); err != nil {
			t.Fatal(err)
		}
	}
	ev.Layer = events.LayerGateway
	if data = events.AppendRequest(nil, &ev); strings.Contains(string(data), "layer") {
		t.Fatalf("a gateway event writes its layer: %s", data)
	}
	ev.Layer, ev.TraceID = "", ""
	data = events.AppendRequest(nil, &ev)
	if strings.Contains(string(data), "layer") || strings.Contains(string(data), "trace_id") {
		t.Fatalf("an event without layer or trace id writes them: %s", data)
	}
	if err := ev.ValidateAt(testNow); err != nil {
		t.Fatalf("an event without a layer is invalid: %v", err)
	}
	var got events.RequestEvent
	if err := events.UnmarshalRequest(data, &got); err != nil || got.Layer != events.LayerGateway {
		t.Fatalf("absent layer decoded as %q (%v), want gateway", got.Layer, err)
	}
}

func TestValidTraceID(t *testing.T) {
	for id, want := range map[string]bool{
		"4bf92f3577b34da6a3ce929d0e0e4736":  true,
		"00000000000000000000000000000001":  true,
		"00000000000000000000000000000000":  false,
		"4BF92F3577B34DA6A3CE929D0E0E4736":  false,
		"4bf92f3577b34da6a3ce929d0e0e473":   false,
		"4bf92f3577b34da6a3ce929d0e0e47360": false,
		"4bf92f3577b34da6a3ce929d0e0e473g":  false,
		"":                                  false,
	} {
		if got := events.ValidTraceID(id); got != want {
			t.Errorf("ValidTraceID(%q) = %v, want %v", id, got, want)
		}
	}
	if !events.ValidSpanID("00f067aa0ba902b7") || events.ValidSpanID("0000000000000000") || events.ValidSpanID("00f067aa0ba902b") {
		t.Error("ValidSpanID")
	}
}

func TestDecodeRequest(t *testing.T) {
	f := func(name, doc string, wantErr error, check func(*events.RequestEvent) bool) {
		t.Helper()
		for _, decode := range []func([]byte, *events.RequestEvent) error{
			events.UnmarshalRequest,
			events.NewDecoder(16).Decode,
		} {
			var ev events.RequestEvent
			err := decode([]byte(doc), &ev)
			if err == nil {
				err = ev.ValidateAt(testNow)
			}
			if !errors.Is(err, wantErr) {
				t.Fatalf("%s: error %v, want %v", name, err, wantErr)
			}
			if err != nil && !errors.Is(err, events.ErrInvalidEvent) {
				t.Fatalf("%s: error %v does not wrap ErrInvalidEvent", name, err)
			}
			if check != nil && err == nil && !check(&ev) {
				t.Fatalf("%s: decoded %+v", name, ev)
			}
		}
	}
	base := `"v":1,"event_id":"x","ts":"2026-11-30T10:00:00Z","model":"m","scene":"s","env":"e","status":"ok"`
	f("ok", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, nil,
		func(e *events.RequestEvent) bool { tp, ok := e.TPOT(); return ok && tp == 2 })
	f("whitespace", " \n{ "+strings.ReplaceAll(base, ",", " ,\t")+` , "input_tokens" : 1 , "output_tokens":0,"ttft_ms":0,"total_ms":0 } `, nil, nil)
	f("exponent", `{`+base+`,"input_tokens":1e3,"output_tokens":2,"ttft_ms":1.5e2,"total_ms":3E3}`, nil,
		func(e *events.RequestEvent) bool {
			return e.InputTokens == 1000 && e.TTFTMs == 150 && e.TotalMs == 3000
		})
	f("fractional tokens", `{`+base+`,"input_tokens":1.5,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrOutOfRange, nil)
	f("surrogate pair", `{`+strings.Replace(base, `"m"`, `"\ud83d\ude00"`, 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, nil,
		func(e *events.RequestEvent) bool { return e.Model == "😀" })
	f("lone surrogate", `{`+strings.Replace(base, `"m"`, `"\ud83d"`, 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, nil,
		func(e *events.RequestEvent) bool { return e.Model == "\uFFFD" })
	f("trailing data", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3} {}`, events.ErrMalformed, nil)
	f("trailing comma", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,}`, events.ErrMalformed, nil)
	f("leading zero", `{`+base+`,"input_tokens":01,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrMalformed, nil)
	f("NaN", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":NaN,"total_ms":3}`, events.ErrMalformed, nil)
	f("deep nesting", `{`+base+`,"x":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrMalformed, nil)
	f("control char", "{"+strings.Replace(base, `"m"`, "\"m\x01\"", 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrMalformed, nil)
	f("empty", ``, events.ErrMalformed, nil)
	f("huge number", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1e999,"total_ms":3}`, events.ErrOutOfRange, nil)
	f("bool as string", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"stream":"yes"}`, events.ErrWrongType, nil)
	f("missing ttft", `{`+base+`,"input_tokens":1,"output_tokens":2,"total_ms":3}`, events.ErrMissingField, nil)
	f("null required", `{`+base+`,"input_tokens":null,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrMissingField, nil)
	f("missing v", `{`+strings.Replace(base, `"v":1,`, ``, 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrMissingField, nil)
	v2 := strings.Replace(base, `"v":1`, `"v":2`, 1)
	f("newer version", `{`+v2+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrUnsupportedVersion, nil)
	f("newer version, renamed fields", `{`+v2+`,"tokens":{"input":1,"output":2},"ttft_ms":1,"total_ms":3}`, events.ErrUnsupportedVersion, nil)
	f("newer version, retyped field before v", `{"ts":1764496800000,`+strings.Replace(v2, `"ts":"2026-11-30T10:00:00Z",`, ``, 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrUnsupportedVersion, nil)
	f("newer version, retyped v after an error", `{"stream":"yes",`+strings.Replace(base, `"v":1`, `"v":1,"v":3`, 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrUnsupportedVersion, nil)
	f("newer version, malformed", `{`+v2+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,}`, events.ErrMalformed, nil)
	f("version as a string", `{`+strings.Replace(base, `"v":1`, `"v":"2"`, 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrWrongType, nil)
	f("version 1, retyped field", `{`+base+`,"input_tokens":"1","output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrWrongType, nil)
	f("bad outcome", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"outcome":"won"}`, events.ErrUnknownStatus, nil)
	f("old ts", `{`+strings.Replace(base, "2026-11-30", "1970-01-01", 1)+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3}`, events.ErrOutOfRange, nil)
	f("layer engine", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"layer":"engine"}`, nil,
		func(e *events.RequestEvent) bool { return e.Layer == events.LayerEngine })
	f("layer null", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"layer":null}`, nil,
		func(e *events.RequestEvent) bool { return e.Layer == events.LayerGateway })
	f("layer empty", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"layer":""}`, events.ErrUnknownStatus, nil)
	f("layer unknown", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"layer":"proxy"}`, events.ErrUnknownStatus, nil)
	f("layer escaped", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"layer":"\u0061pp"}`, nil,
		func(e *events.RequestEvent) bool { return e.Layer == events.LayerApp })
	f("trace id zero", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"trace_id":"00000000000000000000000000000000"}`, events.ErrBadTraceID, nil)
	f("prefill negative", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"prefill_ms":-0.5}`, events.ErrNegative, nil)
	f("decode NaN-ish", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"decode_ms":1e400}`, events.ErrOutOfRange, nil)
	// A key in other letter case than a field's: encoding/json would take it for the field
	// (Unicode folding: \u017f is a long s), the schema and this decoder for another
	// property, so readers of one stream would see different events; it is malformed, as
	// in every other message.
	f("cased optional key", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"Tenant":"acme"}`, events.ErrMalformed, nil)
	f("cased key beside its own", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"MODEL":"n"}`, events.ErrMalformed, nil)
	f("cased key by Unicode folding", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"\u017ftream":true}`, events.ErrMalformed, nil)
	f("unknown key in capitals", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"Region":"eu","X-Id":1}`, nil, nil)
	f("itl above total", `{`+base+`,"input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":3,"max_itl_ms":4}`, events.ErrOutOfRange, nil)
}

func TestFieldErrorNamesField(t *testing.T) {
	ev := sampleEvent()
	ev.TTFTMs = 9000
	err := ev.ValidateAt(testNow)
	var fe *events.FieldError
	if !errors.As(err, &fe) || fe.Field != "ttft_ms" || !errors.Is(err, events.ErrTTFTAboveTotal) {
		t.Fatalf("got %v, want a FieldError on ttft_ms wrapping ErrTTFTAboveTotal", err)
	}
	if want := "invalid event: ttft_ms: ttft_ms is above total_ms (9000 > 6120.75)"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	if r := events.Reason(err); r != "ttft_above_total" {
		t.Fatalf("Reason = %q", r)
	}
}

func TestTPOT(t *testing.T) {
	f := func(ttft, total float64, out int64, want float64, wantOK bool) {
		t.Helper()
		got, ok := events.TPOT(ttft, total, out)
		if ok != wantOK || (ok && math.Abs(got-want) > 1e-9) {
			t.Fatalf("TPOT(%v, %v, %d) = %v, %v; want %v, %v", ttft, total, out, got, ok, want, wantOK)
		}
	}
	f(100, 1100, 11, 100, true)
	f(100, 100, 1, 0, false)
	f(0, 0, 0, 0, false)
	f(200, 1200, 2, 1000, true)
}

func TestRateLimited(t *testing.T) {
	for _, ev := range []events.RequestEvent{{HTTPStatus: 429}, {ErrorCode: "rate_limit_error"}, {ErrorCode: "429"}} {
		if !ev.RateLimited() {
			t.Fatalf("%+v should be rate-limited", ev)
		}
	}
	if (&events.RequestEvent{HTTPStatus: 500, ErrorCode: "overloaded"}).RateLimited() {
		t.Fatal("500 is not rate-limited")
	}
}

func TestBuckets(t *testing.T) {
	b, err := events.ParseBuckets(events.DefaultBuckets)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b, events.DefaultBucketBounds()) {
		t.Fatal("DefaultBucketBounds differs from ParseBuckets(DefaultBuckets)")
	}
	f := func(in int64, want string) {
		t.Helper()
		if got := b.Label(b.Index(in)); got != want {
			t.Fatalf("bucket of %d = %s, want %s", in, got, want)
		}
	}
	f(0, "0-499")
	f(499, "0-499")
	f(500, "500-1999")
	f(7999, "2000-7999")
	f(8000, "8000-31999")
	f(32000, "32000+")
	f(10_000_000, "32000+")
	f(-5, "0-499")
	if b.String() != events.DefaultBuckets || b.Len() != 5 || b.Lower(2) != 2000 {
		t.Fatalf("String %q Len %d Lower(2) %d", b.String(), b.Len(), b.Lower(2))
	}
	for _, bad := range []string{"", "1,2", "0,500,500", "0,a", "0,-1", strings.Repeat("0,", 40) + "1"} {
		if _, err := events.ParseBuckets(bad); err == nil {
			t.Fatalf("ParseBuckets(%q) accepted", bad)
		}
	}
	var zero events.Buckets
	if zero.Index(123) != 0 || zero.Label(0) != "0+" || zero.Len() != 1 {
		t.Fatal("zero Buckets must hold everything in one bucket")
	}
}

func TestSubjects(t *testing.T) {
	f := func(got, want string) {
		t.Helper()
		if got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	f(events.RequestSubject("prod", "customer-service"), "llm.req.prod.customer-service")
	f(events.RequestSubject("prod.eu", "a*b>c d\te"), "llm.req.prod_eu.a_b_c_d_e")
	f(events.RequestSubject("", "客服"), "llm.req._.__")
	f(events.RequestSubject("x\x00y", ">"), "llm.req.x_y._")
	f(events.GPUSampleSubject("gpu-node-3.dc1"), "gpu.sample.gpu-node-3_dc1")
	f(events.TokenRollupSubject("prod", "chat"), "rollup.tokens.prod.chat")
	f(events.GPURollupSubject("h"), "rollup.gpu.h")
	f(events.EngineRollupSubject("gpu-node-3.dc1"), "rollup.engine.gpu-node-3_dc1")
	f(events.HostSampleSubject("gpu-node-3.dc1"), "host.sample.gpu-node-3_dc1")
	f(events.HostRollupSubject("a>b"), "rollup.host.a_b")
	f(events.FeedbackRollupSubject("prod", "customer.service"), "rollup.feedback.prod.customer_service")
	f(events.FeedbackRollupSubject("", "chat"), "rollup.feedback._.chat")
	f(events.AlertSubject("critical", "ttft_p95_sla"), "alerts.critical.ttft_p95_sla")
	long := events.Token(strings.Repeat("a", 500))
	if len(long) != events.MaxTokenLen {
		t.Fatalf("token of a long label has %d bytes", len(long))
	}
	// No label can add or remove a token.
	for _, label := range []string{"a.b.c", "*", ">", "a b", "\n", "..", "\xff\xfe", strings.Repeat("é", 100)} {
		s := events.RequestSubject(label, label)
		if n := strings.Count(s, "."); n != 3 || strings.ContainsAny(s, "*> \t\n") {
			t.Fatalf("label %q made subject %q", label, s)
		}
	}
}

func TestNewEventIDSortable(t *testing.T) {
	prev := events.NewEventID()
	for range 1000 {
		id := events.NewEventID()
		if len(id) != 36 || id[14] != '7' {
			t.Fatalf("%q is not a UUIDv7", id)
		}
		if id[:13] < prev[:13] {
			t.Fatalf("ids not time-ordered: %s after %s", id, prev)
		}
		prev = id
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "tab\tnl\nctl\x01\x1f", "é😀客服", "bad\xffutf8", "<html>&"} {
		got := events.AppendString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("AppendString(%q) = %s: not JSON: %v", s, got, err)
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		if back != want {
			t.Fatalf("AppendString(%q) decodes to %q, want %q", s, back, want)
		}
	}
}

func TestAppendStringMax(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "tab\tnl\nctl\x01\x1f", "é😀客服", "bad\xffutf8", strings.Repeat("\x00", 40), "a😀\x01b"} {
		full := events.AppendString(nil, s)
		whole := strings.ToValidUTF8(s, "\uFFFD")
		for max := 2; max <= len(full)+2; max++ {
			got, cut := events.AppendStringMax([]byte("x"), s, max)
			got = got[1:]
			var back string
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatalf("AppendStringMax(%q, %d) = %s: not JSON: %v", s, max, got, err)
			}
			switch {
			case len(got) > max:
				t.Fatalf("AppendStringMax(%q, %d) = %s: %d bytes", s, max, got, len(got))
			case cut != (len(full) > max):
				t.Fatalf("AppendStringMax(%q, %d) = %s: cut %v", s, max, got, cut)
			case !cut && string(got) != string(full):
				t.Fatalf("AppendStringMax(%q, %d) = %s, want %s", s, max, got, full)
			case !strings.HasPrefix(whole, back):
				t.Fatalf("AppendStringMax(%q, %d) decodes to %q: not a prefix of %q", s, max, back, whole)
			case cut && len(got) < max-5:
				t.Fatalf("AppendStringMax(%q, %d) = %s: cut short", s, max, got)
			}
		}
	}
}

func TestAppendFloatNonFinite(t *testing.T) {
	ev := sampleEvent()
	ev.TTFTMs = math.NaN()
	var got events.RequestEvent
	err := events.UnmarshalRequest(events.AppendRequest(nil, &ev), &got)
	if !errors.Is(err, events.ErrMissingField) {
		t.Fatalf("a NaN ttft must not decode as a valid event: %v", err)
	}
}

func TestGPUSampleValidate(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "gpu", "valid", "h200.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s events.GPUSample
	if err := events.UnmarshalGPUSample(raw, &s); err != nil {
		t.Fatal(err)
	}
	if err := s.ValidateAt(testNow); err != nil {
		t.Fatal(err)
	}
	if s.PowerW == nil || *s.PowerW != 689.2 || s.ThrottleReasons == nil || *s.ThrottleReasons != 4 {
		t.Fatalf("decoded %+v", s)
	}
	for doc, want := range map[string]error{
		`{"v":2,"ts":"2026-11-30T10:00:00Z","host":"h","gpu_index":"0"}`: events.ErrUnsupportedVersion,
		`{"gpu_index":"0","v":2,"ts":"2026-11-30T10:00:00Z","host":"h"}`: events.ErrUnsupportedVersion,
		`{"v":1,"ts":"2026-11-30T10:00:00Z","host":"h","gpu_index":"0"}`: events.ErrWrongType,
	} {
		var s events.GPUSample
		if err := events.UnmarshalGPUSample([]byte(doc), &s); !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", doc, err, want)
		}
	}
	for name, tc := range map[string]struct {
		v    float64
		want error
	}{
		"NaN":      {math.NaN(), events.ErrOutOfRange},
		"+Inf":     {math.Inf(1), events.ErrOutOfRange},
		"negative": {-1, events.ErrNegative},
		"too big":  {events.MaxEnergyUsedJ * 2, events.ErrOutOfRange},
		"zero":     {0, nil},
		"bound":    {events.MaxEnergyUsedJ, nil},
	} {
		used := tc.v
		s := events.GPUSample{V: 1, TS: testNow, Host: "h", GPUUUID: "u", EnergyUsedJ: &used}
		if err := s.ValidateAt(testNow); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Fatalf("energy_used_j %s: %v, want %v", name, err, tc.want)
		} else if err != nil && !strings.Contains(err.Error(), "energy_used_j") {
			t.Fatalf("energy_used_j %s: %v does not name the field", name, err)
		}
	}
	out, _ := json.Marshal(events.GPUSample{V: 1, TS: testNow, Host: "h", GPUUUID: "u"})
	if strings.Contains(string(out), "power_w") {
		t.Fatalf("an unsupported reading must be absent, got %s", out)
	}
}

func TestReasonsBounded(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range events.Reasons() {
		seen[r] = true
	}
	for _, err := range []error{events.ErrMalformed, events.ErrTTFTAboveTotal, errors.New("x"), &events.SyntaxError{}} {
		if r := events.Reason(err); !seen[r] {
			t.Fatalf("Reason(%v) = %q is not in Reasons()", err, r)
		}
	}
}

func TestFitLabel(t *testing.T) {
	long := strings.Repeat("scene-", 200) // 1,200 bytes
	f := func(in string, limit int, check func(got string) bool) {
		t.Helper()
		got := events.FitLabel(in, limit)
		ev := sampleEvent()
		ev.Scene = got
		if err := ev.ValidateAt(testNow); limit == events.MaxLabelLen && err != nil {
			t.Fatalf("FitLabel(%.40q…) = %.40q…, still invalid: %v", in, got, err)
		}
		if len(got) > limit || !utf8.ValidString(got) || !check(got) {
			t.Fatalf("FitLabel(%.40q…, %d) = %q", in, limit, got)
		}
	}
	same := func(in string) func(string) bool { return func(got string) bool { return got == in } }
	f("support", events.MaxLabelLen, same("support"))
	f(strings.Repeat("x", events.MaxLabelLen), events.MaxLabelLen, same(strings.Repeat("x", events.MaxLabelLen)))
	f("bad\xffbyte", events.MaxLabelLen, same("bad\uFFFDbyte"))
	f(long, events.MaxLabelLen, func(got string) bool {
		return len(got) == events.MaxLabelLen && strings.HasPrefix(got, long[:events.MaxLabelLen-9]) && got[events.MaxLabelLen-9] == '~'
	})
	// Two long values that begin alike stay apart.
	f(long+"a", events.MaxLabelLen, func(got string) bool { return got != events.FitLabel(long+"b", events.MaxLabelLen) })
	// Never cut inside a rune.
	f(strings.Repeat("é", 300), events.MaxLabelLen, func(got string) bool { return strings.HasPrefix(got, strings.Repeat("é", 123)+"~") })
	f(long, 5, same("scene"))
	f(long, events.MaxIDLen, func(got string) bool { return len(got) == events.MaxIDLen })
}

// TestDecoderDoesNotAllocate keeps the interning decoder allocation-free on an event with
// every field, layer and trace id included, once its labels are interned.
func TestDecoderDoesNotAllocate(t *testing.T) {
	ev := sampleEvent()
	ev.Layer, ev.QueueMs, ev.PrefillMs, ev.DecodeMs = events.LayerApp, 120, 280.5, 5300.25
	ev.Tenant, ev.Provider, ev.ErrorCode, ev.Outcome = "acme", "vllm", "none", events.OutcomeCompleted
	data := events.AppendRequest(nil, &ev)
	dec := events.NewDecoder(64)
	var got events.RequestEvent
	if n := testing.AllocsPerRun(100, func() {
		if err := dec.Decode(data, &got); err != nil {
			t.Fatal(err)
		}
		if err := got.ValidateAt(testNow); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Decode+ValidateAt allocates %v times per event", n)
	}
}

// TestDropBadReadings: each reading that breaks the contract is left out, the sample kept
// with the rest; what identifies the sample cannot be left out.
func TestDropBadReadings(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	u := func(v uint64) *uint64 { return &v }
	s := events.GPUSample{V: 1, TS: testNow, Host: "h", GPUUUID: "GPU-0", UtilGPUPct: f(150), PowerW: f(300),
		MemUsedBytes: u(200), MemTotalBytes: u(100), TempC: f(math.NaN())}
	dropped, err := events.DropBadReadings(&s, testNow)
	if err != nil || len(dropped) != 3 || s.UtilGPUPct != nil || s.MemUsedBytes != nil || s.TempC != nil || s.PowerW == nil || s.MemTotalBytes == nil {
		t.Fatalf("dropped %v, err %v, sample %+v", dropped, err, s)
	}
	e := events.EngineSample{V: 1, TS: testNow, Host: "h", Engine: events.EngineVLLM, Name: "vllm", Up: true, Running: f(2),
		QueueTime: &events.HistogramDelta{Le: []float64{1}, Counts: []float64{1}, Count: 1}}
	if dropped, err := events.DropBadReadings(&e, testNow); err != nil || len(dropped) != 1 || e.QueueTime != nil || e.Running == nil {
		t.Fatalf("engine: dropped %v, err %v", dropped, err)
	}
	bad := events.GPUSample{V: 1, TS: testNow, Host: "h", UtilGPUPct: f(150)}
	if _, err := events.DropBadReadings(&bad, testNow); !errors.Is(err, events.ErrMissingField) {
		t.Fatalf("a sample without gpu_uuid: %v", err)
	}
}
