package otlp

import (
	"encoding/hex"
	"math"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Kind is what a span is to tokenscope.
type Kind uint8

// The kinds of span; every span is exactly one.
const (
	KindOther  Kind = iota // not one LLM request: ignored and counted
	KindEngine             // an inference engine's request span (vLLM's llm_request)
	KindApp                // a GenAI client span of an inference operation
)

func (k Kind) String() string {
	switch k {
	case KindEngine:
		return "engine"
	case KindApp:
		return "app"
	}
	return "other"
}

// The attributes read. vLLM's names are those of vllm/tracing.py (SpanAttributes); the
// others are the OpenTelemetry GenAI semantic conventions', with the older names some
// instrumentations still write.
const (
	engineSpanName = "llm_request"

	attrResponseModel    = "gen_ai.response.model"
	attrRequestModel     = "gen_ai.request.model"
	attrPromptTokens     = "gen_ai.usage.prompt_tokens"     // vLLM, older semconv
	attrCompletionTokens = "gen_ai.usage.completion_tokens" // vLLM, older semconv
	attrInputTokens      = "gen_ai.usage.input_tokens"
	attrOutputTokens     = "gen_ai.usage.output_tokens"
	attrCacheReadTokens  = "gen_ai.usage.cache_read.input_tokens"
	attrQueue            = "gen_ai.latency.time_in_queue" // seconds, as the four below
	attrTTFT             = "gen_ai.latency.time_to_first_token"
	attrE2E              = "gen_ai.latency.e2e"
	attrPrefill          = "gen_ai.latency.time_in_model_prefill"
	attrDecode           = "gen_ai.latency.time_in_model_decode"
	attrOperation        = "gen_ai.operation.name"
	attrProvider         = "gen_ai.provider.name"
	attrSystem           = "gen_ai.system" // older name of gen_ai.provider.name
	attrFirstChunk       = "gen_ai.response.time_to_first_chunk"
	attrStream           = "gen_ai.request.stream"
	attrConversation     = "gen_ai.conversation.id"
	attrErrorType        = "error.type"
)

// inferenceOps are the gen_ai.operation.name values of a call that sends a prompt and
// generates tokens: one request event each. Tool calls, agents and embeddings are not.
var inferenceOps = map[string]bool{"chat": true, "text_completion": true, "generate_content": true}

// Labels says where an event's labels come from: for each, the attribute keys tried in
// order, on the span first and then on its resource; the first string value found wins.
type Labels struct {
	Env, Scene, Instance, Tenant []string
	DefaultEnv, DefaultScene     string // when no key is present
}

// DefaultLabels are the keys the emitter reads unless configured otherwise.
func DefaultLabels() Labels {
	return Labels{
		Env:          []string{"tokenscope.env", "deployment.environment.name", "deployment.environment"},
		Scene:        []string{"tokenscope.scene", "service.name"},
		Instance:     []string{"service.instance.id", "host.name"},
		Tenant:       []string{"tokenscope.tenant"},
		DefaultEnv:   "dev",
		DefaultScene: "default",
	}
}

// Classify says which kind span is: a span named llm_request, or carrying
// gen_ai.latency.e2e, is an engine's; one whose gen_ai.operation.name is chat,
// text_completion or generate_content is an app's; any other is neither.
func Classify(span ptrace.Span) Kind {
	attrs := span.Attributes()
	if span.Name() == engineSpanName {
		return KindEngine
	}
	if _, ok := attrs.Get(attrE2E); ok {
		return KindEngine
	}
	if v, ok := attrs.Get(attrOperation); ok && v.Type() == pcommon.ValueTypeStr && inferenceOps[v.Str()] {
		return KindApp
	}
	return KindOther
}

// Map fills ev from a span of kind engine or app and the attributes of its resource. The
// error, when the span lacks what an event needs, names the attribute and wraps
// events.ErrInvalidEvent and the reason's sentinel. ev is not validated against the
// contract: the caller does that, as for any event.
func (l *Labels) Map(res pcommon.Map, span ptrace.Span, kind Kind, ev *events.RequestEvent) error {
	*ev = events.RequestEvent{V: events.Version}
	tid, sid := span.TraceID(), span.SpanID()
	if tid.IsEmpty() {
		return fieldErr("trace_id", events.ErrMissingField, "")
	}
	if sid.IsEmpty() {
		return fieldErr("span_id", events.ErrMissingField, "")
	}
	ev.EventID = eventID(tid, sid)
	start, end := span.StartTimestamp(), span.EndTimestamp()
	switch {
	case start == 0:
		return fieldErr("start_time_unix_nano", events.ErrMissingField, "")
	case end == 0:
		return fieldErr("end_time_unix_nano", events.ErrMissingField, "")
	case end < start:
		return fieldErr("end_time_unix_nano", events.ErrNegative, "the span ends before it starts")
	}
	ev.TS = start.AsTime()
	spanMs := float64(end-start) / 1e6
	attrs := span.Attributes()

	ev.Env = l.label(attrs, res, l.Env, l.DefaultEnv)
	ev.Scene = l.label(attrs, res, l.Scene, l.DefaultScene)
	ev.Instance = l.label(attrs, res, l.Instance, "")
	ev.Tenant = l.label(attrs, res, l.Tenant, "")
	ev.Model = str(attrs, attrResponseModel)
	if ev.Model == "" {
		ev.Model = str(attrs, attrRequestModel)
	}
	if ev.Model == "" {
		return fieldErr(attrResponseModel, events.ErrMissingField, "nor "+attrRequestModel)
	}
	ev.Provider = str(attrs, attrProvider)
	if ev.Provider == "" {
		ev.Provider = str(attrs, attrSystem)
	}
	if v, ok := attrs.Get(attrStream); ok && v.Type() == pcommon.ValueTypeBool {
		ev.Stream = v.Bool()
	}
	ev.ConversationID = str(attrs, attrConversation)
	ev.Status = events.StatusOK
	if errType := str(attrs, attrErrorType); errType != "" || span.Status().Code() == ptrace.StatusCodeError {
		ev.Status, ev.ErrorCode = errorStatus(errType)
	}

	// Tokens: required of a request that succeeded; a failed one may have none.
	needTokens := ev.Status == events.StatusOK
	var err error
	in, out := attrPromptTokens, attrCompletionTokens
	if kind == KindApp {
		in, out = attrInputTokens, attrOutputTokens
	}
	if ev.InputTokens, err = tokens(attrs, in, attrAlt(in), needTokens); err != nil {
		return err
	}
	if ev.OutputTokens, err = tokens(attrs, out, attrAlt(out), needTokens); err != nil {
		return err
	}
	if cached, err := tokens(attrs, attrCacheReadTokens, "", false); err != nil {
		return err
	} else if cached <= ev.InputTokens {
		// The conventions count cached tokens inside input_tokens; an instrumentation
		// counting them apart would make cached exceed input, and is not taken.
		ev.CachedInputTokens = cached
	}

	switch kind {
	case KindEngine:
		ttft, ok, err := seconds(attrs, attrTTFT)
		if err != nil {
			return err
		}
		if !ok && ev.Status == events.StatusOK {
			return fieldErr(attrTTFT, events.ErrMissingField, "")
		}
		ev.TTFTMs = ttft
		if ev.TotalMs, ok, err = seconds(attrs, attrE2E); err != nil {
			return err
		} else if !ok {
			ev.TotalMs = spanMs
		}
		if ev.QueueMs, _, err = seconds(attrs, attrQueue); err != nil {
			return err
		}
		var prefill, decode float64
		if prefill, _, err = seconds(attrs, attrPrefill); err != nil {
			return err
		}
		if decode, _, err = seconds(attrs, attrDecode); err != nil {
			return err
		}
		setLayer(ev, KindEngine, prefill, decode, tid)
	case KindApp:
		ev.TotalMs = spanMs
		ttft, ok, err := seconds(attrs, attrFirstChunk)
		if err != nil {
			return err
		}
		if !ok {
			// No first chunk recorded: the answer is taken as arriving whole, as the
			// proxy takes a body that is not streamed.
			ttft = spanMs
		}
		ev.TTFTMs = ttft
		setLayer(ev, KindApp, 0, 0, tid)
	}
	return nil
}

// attrAlt is the other name of a token count: vLLM and older conventions say prompt and
// completion, the current ones input and output.
func attrAlt(key string) string {
	switch key {
	case attrPromptTokens:
		return attrInputTokens
	case attrCompletionTokens:
		return attrOutputTokens
	case attrInputTokens:
		return attrPromptTokens
	case attrOutputTokens:
		return attrCompletionTokens
	}
	return ""
}

// errorStatus maps error.type to a status: timeouts and cancellations are kept apart from
// errors, as everywhere in tokenscope.
func errorStatus(errType string) (events.Status, string) {
	if errType == "" {
		return events.StatusError, "span_error"
	}
	lower := strings.ToLower(errType)
	switch {
	case strings.Contains(lower, "timeout"), strings.Contains(lower, "timedout"), strings.Contains(lower, "deadline"):
		return events.StatusTimeout, errType
	case strings.Contains(lower, "cancel"):
		return events.StatusCanceled, errType
	}
	return events.StatusError, errType
}

func (l *Labels) label(attrs, res pcommon.Map, keys []string, def string) string {
	for _, k := range keys {
		if v := str(attrs, k); v != "" {
			return v
		}
	}
	for _, k := range keys {
		if v := str(res, k); v != "" {
			return v
		}
	}
	return def
}

// str returns the attribute's value when it is a string, "" otherwise.
func str(attrs pcommon.Map, key string) string {
	v, ok := attrs.Get(key)
	if !ok || v.Type() != pcommon.ValueTypeStr {
		return ""
	}
	return v.Str()
}

// seconds returns an attribute in seconds as milliseconds. It may be a double, an int or a
// string holding a number; ok is false when it is absent.
func seconds(attrs pcommon.Map, key string) (ms float64, ok bool, err error) {
	v, ok := attrs.Get(key)
	if !ok {
		return 0, false, nil
	}
	var s float64
	switch v.Type() {
	case pcommon.ValueTypeDouble:
		s = v.Double()
	case pcommon.ValueTypeInt:
		s = float64(v.Int())
	case pcommon.ValueTypeStr:
		if s, err = strconv.ParseFloat(strings.TrimSpace(v.Str()), 64); err != nil {
			return 0, true, fieldErr(key, events.ErrWrongType, "not a number of seconds")
		}
	default:
		return 0, true, fieldErr(key, events.ErrWrongType, "a "+strings.ToLower(v.Type().String())+", not a number of seconds")
	}
	// Not-a-number and infinities pass on, so the contract's check names them.
	return s * 1e3, true, nil
}

// tokens returns a token count, from key or else from alt (when not ""). It may be an int,
// a whole double or a string holding an integer.
func tokens(attrs pcommon.Map, key, alt string, required bool) (int64, error) {
	v, ok := attrs.Get(key)
	if !ok && alt != "" {
		key = alt
		v, ok = attrs.Get(alt)
	}
	if !ok {
		if required {
			if alt != "" {
				return 0, fieldErr(key, events.ErrMissingField, "nor "+attrAlt(key))
			}
			return 0, fieldErr(key, events.ErrMissingField, "")
		}
		return 0, nil
	}
	switch v.Type() {
	case pcommon.ValueTypeInt:
		return v.Int(), nil
	case pcommon.ValueTypeDouble:
		if d := v.Double(); d == math.Trunc(d) && math.Abs(d) <= 1<<53 {
			return int64(d), nil
		}
		return 0, fieldErr(key, events.ErrWrongType, "not a whole number")
	case pcommon.ValueTypeStr:
		n, err := strconv.ParseInt(strings.TrimSpace(v.Str()), 10, 64)
		if err != nil {
			return 0, fieldErr(key, events.ErrWrongType, "not an integer")
		}
		return n, nil
	}
	return 0, fieldErr(key, events.ErrWrongType, "a "+strings.ToLower(v.Type().String())+", not a token count")
}

// eventID is the span's identity, the same each time the span is sent: a batch an
// exporter sends again is deduplicated by JetStream.
func eventID(tid pcommon.TraceID, sid pcommon.SpanID) string {
	var b [16*2 + 1 + 8*2]byte
	hex.Encode(b[:32], tid[:])
	b[32] = '-'
	hex.Encode(b[33:], sid[:])
	return string(b[:])
}

func fieldErr(field string, err error, detail string) error {
	return &events.FieldError{Field: field, Err: err, Detail: detail}
}
