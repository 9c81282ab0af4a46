package events

import (
	"time"
)

// Version is the value of the v field of every message this package writes.
const Version = 1

// Status is how a request ended. Timeouts and cancels are kept apart from errors: a client
// hanging up is not the service failing, and a stalled stream is not a success.
type Status string

// The statuses a request event may carry.
const (
	StatusOK       Status = "ok"
	StatusError    Status = "error"
	StatusTimeout  Status = "timeout"
	StatusCanceled Status = "canceled"
)

// Outcome is the business-layer result an app reports on a conversation's last request.
type Outcome string

// The outcomes a request event may carry; empty means not reported.
const (
	OutcomeCompleted Outcome = "completed"
	OutcomeAbandoned Outcome = "abandoned"
)

// Layer is where a request was measured. The same request seen at two layers is two events,
// never summed across layers: every rollup, table and query keeps them apart.
type Layer string

// The layers a request event may carry. An event without a layer is a gateway event.
const (
	LayerGateway Layer = "gateway" // the emitter's proxy and HTTP ingest, or any edge publisher
	LayerEngine  Layer = "engine"  // the inference engine's own view (vLLM's llm_request span)
	LayerApp     Layer = "app"     // the calling application (an OpenTelemetry GenAI client span)
)

// Layers lists every layer, gateway first.
func Layers() []Layer { return []Layer{LayerGateway, LayerEngine, LayerApp} }

// OrGateway returns l, or LayerGateway when l is empty.
func (l Layer) OrGateway() Layer {
	if l == "" {
		return LayerGateway
	}
	return l
}

// RequestEvent is one LLM request as measured at one layer. Optional numeric fields use 0 for
// "not measured" and are omitted from the JSON when 0.
type RequestEvent struct {
	V       int       `json:"v"`
	EventID string    `json:"event_id"`
	TS      time.Time `json:"ts"` // request start

	Model    string `json:"model"`
	Scene    string `json:"scene"`
	Env      string `json:"env"`
	Instance string `json:"instance,omitempty"` // inference replica or upstream; equals gpuwatch's host
	Tenant   string `json:"tenant,omitempty"`
	Provider string `json:"provider,omitempty"`
	Layer    Layer  `json:"layer,omitempty"`    // empty is LayerGateway; the decoder fills it in
	TraceID  string `json:"trace_id,omitempty"` // W3C trace id: 32 lowercase hex digits, not all zero

	InputTokens       int64 `json:"input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens,omitempty"` // prefix-cache hits
	TokensEstimated   bool  `json:"tokens_estimated,omitempty"`    // no usage was reported; counts are estimates

	TTFTMs    float64 `json:"ttft_ms"`  // time to the first content token
	TotalMs   float64 `json:"total_ms"` // time to the last content token (or the end of the response)
	MaxITLMs  float64 `json:"max_itl_ms,omitempty"`
	QueueMs   float64 `json:"queue_ms,omitempty"`   // waiting for the engine's scheduler
	PrefillMs float64 `json:"prefill_ms,omitempty"` // the engine computing the prompt
	DecodeMs  float64 `json:"decode_ms,omitempty"`  // the engine generating the output

	Status     Status `json:"status"`
	ErrorCode  string `json:"error_code,omitempty"`
	HTTPStatus int    `json:"http_status,omitempty"`
	Stream     bool   `json:"stream,omitempty"`

	ConversationID string  `json:"conversation_id,omitempty"`
	Turn           int     `json:"turn,omitempty"`
	Outcome        Outcome `json:"outcome,omitempty"`

	// Scores are verdicts the app knows when it sends the event (a quality score, a task
	// marked completed), named as feedback names are; the JSON is an object of name to
	// number or true/false. Stored on the request's own row, each counts in the business
	// queries as a feedback verdict of source app on this request.
	Scores []Score `json:"scores,omitempty"`
}

// MaxScores bounds the scores one request event carries.
const MaxScores = 16

// Score is one inline verdict of a request event: a feedback name and its value (a JSON
// boolean is 1 or 0).
type Score struct {
	Name  string
	Value float64
}

// TPOT is the time per output token after the first, as vLLM's benchmark and genai-perf
// define it: (total − TTFT) / (output_tokens − 1). It is defined only when at least two
// output tokens were produced; ok is false otherwise.
func (e *RequestEvent) TPOT() (ms float64, ok bool) {
	return TPOT(e.TTFTMs, e.TotalMs, e.OutputTokens)
}

// TPOT computes (total − TTFT) / (outputTokens − 1); ok is false when outputTokens < 2.
func TPOT(ttftMs, totalMs float64, outputTokens int64) (ms float64, ok bool) {
	if outputTokens < 2 {
		return 0, false
	}
	return (totalMs - ttftMs) / float64(outputTokens-1), true
}

// RateLimited reports whether the upstream refused the request for rate (HTTP 429).
func (e *RequestEvent) RateLimited() bool {
	if e.HTTPStatus == 429 {
		return true
	}
	switch e.ErrorCode {
	case "429", "rate_limited", "rate_limit_error", "rate_limit_exceeded":
		return true
	}
	return false
}
