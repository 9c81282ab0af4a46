package otlp

import (
	"cmp"
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

// Resource is a resource's labels, looked up once for all its spans.
type Resource struct {
	env, scene, instance, tenant string
}

// Resource looks the labels up on a resource's attributes.
func (l *Labels) Resource(res pcommon.Map) Resource {
	return Resource{
		env:      firstStr(res, l.Env, l.DefaultEnv),
		scene:    firstStr(res, l.Scene, l.DefaultScene),
		instance: firstStr(res, l.Instance, ""),
		tenant:   firstStr(res, l.Tenant, ""),
	}
}

func firstStr(m pcommon.Map, keys []string, def string) string {
	for _, k := range keys {
		if v := str(m, k); v != "" {
			return v
		}
	}
	return def
}

// spanAttrs are the attributes Map reads, found in one pass over the span's.
type spanAttrs struct {
	responseModel, requestModel, provider, system, conversation, errorType string
	stream, hasStream                                                      bool

	prompt, completion, input, output, cacheRead  pcommon.Value
	queue, ttft, e2e, prefill, decode, firstChunk pcommon.Value
	hasPrompt, hasCompletion, hasInput, hasOutput bool
	hasCacheRead, hasQueue, hasTTFT, hasE2E       bool
	hasPrefill, hasDecode, hasFirstChunk          bool

	// labels set on the span itself, with the rank of the key that gave each (lower wins)
	env, scene, instance, tenant                 string
	envRank, sceneRank, instanceRank, tenantRank int

	// twice is the first key read given twice, "" when none is: OTLP's attribute keys are
	// unique, and readers differ on which of two they take (pdata's Get, and so the
	// Collector, the first; a loop over them the last).
	twice string
}

func (a *spanAttrs) read(l *Labels, attrs pcommon.Map) {
	a.envRank, a.sceneRank, a.instanceRank, a.tenantRank = -1, -1, -1, -1
	genAIKeys := l.genAIKeys()
	var seen uint32         // the keys of the fields read, one bit each
	var labelSeen [4]uint64 // the label keys read, by their rank
	for k, v := range attrs.All() {
		var bit uint32
		switch k {
		case attrResponseModel:
			a.responseModel, bit = strOf(v), 1<<0
		case attrRequestModel:
			a.requestModel, bit = strOf(v), 1<<1
		case attrProvider:
			a.provider, bit = strOf(v), 1<<2
		case attrSystem:
			a.system, bit = strOf(v), 1<<3
		case attrConversation:
			a.conversation, bit = strOf(v), 1<<4
		case attrErrorType:
			// A string by the conventions; any other value says as much that the call
			// failed, and is the error code as text.
			a.errorType, bit = v.AsString(), 1<<5
		case attrStream:
			bit = 1 << 6
			if v.Type() == pcommon.ValueTypeBool {
				a.stream, a.hasStream = v.Bool(), true
			}
		case attrPromptTokens:
			a.prompt, a.hasPrompt, bit = v, true, 1<<7
		case attrCompletionTokens:
			a.completion, a.hasCompletion, bit = v, true, 1<<8
		case attrInputTokens:
			a.input, a.hasInput, bit = v, true, 1<<9
		case attrOutputTokens:
			a.output, a.hasOutput, bit = v, true, 1<<10
		case attrCacheReadTokens:
			a.cacheRead, a.hasCacheRead, bit = v, true, 1<<11
		case attrQueue:
			a.queue, a.hasQueue, bit = v, true, 1<<12
		case attrTTFT:
			a.ttft, a.hasTTFT, bit = v, true, 1<<13
		case attrE2E:
			a.e2e, a.hasE2E, bit = v, true, 1<<14
		case attrPrefill:
			a.prefill, a.hasPrefill, bit = v, true, 1<<15
		case attrDecode:
			a.decode, a.hasDecode, bit = v, true, 1<<16
		case attrFirstChunk:
			a.firstChunk, a.hasFirstChunk, bit = v, true, 1<<17
		case attrOperation:
			bit = 1 << 18 // read by Classify
			fallthrough
		default:
			if !genAIKeys && strings.HasPrefix(k, "gen_ai.") {
				break // the conventions' other attributes are no label's keys
			}
			twice := rankLabel(&a.env, &a.envRank, &labelSeen[0], l.Env, k, v)
			twice = rankLabel(&a.scene, &a.sceneRank, &labelSeen[1], l.Scene, k, v) || twice
			twice = rankLabel(&a.instance, &a.instanceRank, &labelSeen[2], l.Instance, k, v) || twice
			twice = rankLabel(&a.tenant, &a.tenantRank, &labelSeen[3], l.Tenant, k, v) || twice
			if twice && a.twice == "" {
				a.twice = k
			}
		}
		if seen&bit != 0 && a.twice == "" {
			a.twice = k
		}
		seen |= bit
	}
}

// genAIKeys reports whether a label is read from a key of the GenAI conventions
// (gen_ai.agent.name as the scene, say), which read otherwise skips.
func (l *Labels) genAIKeys() bool {
	for _, keys := range [...][]string{l.Env, l.Scene, l.Instance, l.Tenant} {
		for _, k := range keys {
			if strings.HasPrefix(k, "gen_ai.") {
				return true
			}
		}
	}
	return false
}

// other returns the token count under its other name.
func (a *spanAttrs) other(key string) (pcommon.Value, bool) {
	switch key {
	case attrPromptTokens:
		return a.prompt, a.hasPrompt
	case attrCompletionTokens:
		return a.completion, a.hasCompletion
	case attrInputTokens:
		return a.input, a.hasInput
	}
	return a.output, a.hasOutput
}

// rankLabel keeps v as the label when k is one of its keys, ranked before the one kept,
// and reports whether k was met before: seen has a bit for each of the first 64 keys.
func rankLabel(dst *string, rank *int, seen *uint64, keys []string, k string, v pcommon.Value) (twice bool) {
	for i, key := range keys {
		if key == k {
			if i < 64 {
				twice = *seen&(1<<i) != 0
				*seen |= 1 << i
			}
			if s := strOf(v); s != "" && (*rank < 0 || i < *rank) {
				*dst, *rank = s, i
			}
			return twice
		}
	}
	return false
}

func strOf(v pcommon.Value) string {
	if v.Type() != pcommon.ValueTypeStr {
		return ""
	}
	return v.Str()
}

// Map fills ev from a span of kind engine or app and the labels of its resource. The
// error, when the span lacks what an event needs, names the attribute and wraps
// events.ErrInvalidEvent and the reason's sentinel. ev is not validated against the
// contract: the caller does that, as for any event.
func (l *Labels) Map(res Resource, span ptrace.Span, kind Kind, ev *events.RequestEvent) error {
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
	var a spanAttrs
	a.read(l, span.Attributes())
	if a.twice != "" {
		return fieldErr(a.twice, events.ErrOutOfRange, "given twice: attribute keys are unique")
	}

	ev.Env, ev.Scene, ev.Instance, ev.Tenant = res.env, res.scene, res.instance, res.tenant
	if a.envRank >= 0 {
		ev.Env = a.env
	}
	if a.sceneRank >= 0 {
		ev.Scene = a.scene
	}
	if a.instanceRank >= 0 {
		ev.Instance = a.instance
	}
	if a.tenantRank >= 0 {
		ev.Tenant = a.tenant
	}
	ev.Model = cmp.Or(a.responseModel, a.requestModel)
	if ev.Model == "" {
		return fieldErr(attrResponseModel, events.ErrMissingField, "nor "+attrRequestModel)
	}
	ev.Provider = cmp.Or(a.provider, a.system)
	ev.Stream = a.stream
	ev.ConversationID = a.conversation
	ev.Status = events.StatusOK
	if a.errorType != "" || span.Status().Code() == ptrace.StatusCodeError {
		ev.Status, ev.ErrorCode = errorStatus(a.errorType)
	}

	// Tokens: required of a request that succeeded; a failed one may have none. vLLM and
	// older conventions say prompt and completion, the current ones input and output.
	need := ev.Status == events.StatusOK
	inKey, inV, inOK, inAlt := attrPromptTokens, a.prompt, a.hasPrompt, attrInputTokens
	outKey, outV, outOK, outAlt := attrCompletionTokens, a.completion, a.hasCompletion, attrOutputTokens
	if kind == KindApp {
		inKey, inV, inOK, inAlt = attrInputTokens, a.input, a.hasInput, attrPromptTokens
		outKey, outV, outOK, outAlt = attrOutputTokens, a.output, a.hasOutput, attrCompletionTokens
	}
	if !inOK {
		inV, inOK = a.other(inAlt)
	}
	if !outOK {
		outV, outOK = a.other(outAlt)
	}
	var err error
	if ev.InputTokens, err = tokens(inKey, inAlt, inV, inOK, need); err != nil {
		return err
	}
	if ev.OutputTokens, err = tokens(outKey, outAlt, outV, outOK, need); err != nil {
		return err
	}
	if cached, err := tokens(attrCacheReadTokens, "", a.cacheRead, a.hasCacheRead, false); err != nil {
		return err
	} else if cached <= ev.InputTokens {
		// The conventions count cached tokens inside input_tokens; an instrumentation
		// counting them apart would make cached exceed input, and is not taken.
		ev.CachedInputTokens = cached
	}

	switch kind {
	case KindEngine:
		if !a.hasTTFT && ev.Status == events.StatusOK {
			return fieldErr(attrTTFT, events.ErrMissingField, "")
		}
		if ev.TTFTMs, err = seconds(attrTTFT, a.ttft, a.hasTTFT); err != nil {
			return err
		}
		ev.TotalMs = spanMs
		if a.hasE2E {
			if ev.TotalMs, err = seconds(attrE2E, a.e2e, true); err != nil {
				return err
			}
		}
		if ev.QueueMs, err = seconds(attrQueue, a.queue, a.hasQueue); err != nil {
			return err
		}
		var prefill, decode float64
		if prefill, err = seconds(attrPrefill, a.prefill, a.hasPrefill); err != nil {
			return err
		}
		if decode, err = seconds(attrDecode, a.decode, a.hasDecode); err != nil {
			return err
		}
		setLayer(ev, KindEngine, prefill, decode)
	case KindApp:
		ev.TotalMs = spanMs
		// No first chunk recorded: the answer is taken as arriving whole, as the proxy
		// takes a body that is not streamed.
		ev.TTFTMs = spanMs
		if a.hasFirstChunk {
			if ev.TTFTMs, err = seconds(attrFirstChunk, a.firstChunk, true); err != nil {
				return err
			}
		}
		setLayer(ev, KindApp, 0, 0)
	}
	return nil
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

// str returns the attribute's value when it is a string, "" otherwise.
func str(attrs pcommon.Map, key string) string {
	v, ok := attrs.Get(key)
	if !ok || v.Type() != pcommon.ValueTypeStr {
		return ""
	}
	return v.Str()
}

// seconds returns an attribute in seconds as milliseconds. It may be a double, an int or a
// string holding a number; 0 when absent (ok false).
func seconds(key string, v pcommon.Value, ok bool) (ms float64, err error) {
	if !ok {
		return 0, nil
	}
	var s float64
	switch v.Type() {
	case pcommon.ValueTypeDouble:
		s = v.Double()
	case pcommon.ValueTypeInt:
		s = float64(v.Int())
	case pcommon.ValueTypeStr:
		if s, err = strconv.ParseFloat(strings.TrimSpace(v.Str()), 64); err != nil {
			return 0, fieldErr(key, events.ErrWrongType, "not a number of seconds")
		}
	default:
		return 0, fieldErr(key, events.ErrWrongType, "a "+strings.ToLower(v.Type().String())+", not a number of seconds")
	}
	// Not-a-number and infinities pass on, so the contract's check names them.
	return s * 1e3, nil
}

// tokens returns a token count. It may be an int, a whole double or a string holding an
// integer; alt, when not "", is the other name the count goes by, for the message.
func tokens(key, alt string, v pcommon.Value, ok, required bool) (int64, error) {
	if !ok {
		if !required {
			return 0, nil
		}
		if alt != "" {
			return 0, fieldErr(key, events.ErrMissingField, "nor "+alt)
		}
		return 0, fieldErr(key, events.ErrMissingField, "")
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
