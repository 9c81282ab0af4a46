package fakellm

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

// Options set how the fake behaves for every request; X-Fakellm-* headers override them for one.
type Options struct {
	TTFT           time.Duration // time to the first token
	PrefillPer1K   time.Duration // TTFT added per 1,000 input tokens, as prefill grows with the prompt
	TPOT           time.Duration // time between two output tokens
	Tokens         int           // output tokens the fake chooses to say; a request's max_tokens cuts it short
	ErrorRate      float64       // fraction of requests answered 500
	RateLimitRate  float64       // fraction answered 429
	StallRate      float64       // fraction of streams that stop sending halfway and hang
	DisconnectRate float64       // fraction of streams cut halfway
	Seed           uint64

	// The scheduler model, off unless MaxBatch, KVTokens or PrefixCache is set: then
	// requests wait for one of MaxBatch running slots and for their prompt's KV tokens out
	// of KVTokens, overflow preempts, a repeated prompt prefix skips its prefill, and
	// /metrics serves vLLM's engine metrics. Zero MaxBatch means 256, zero KVTokens 2^20.
	MaxBatch    int
	KVTokens    int
	PrefixCache bool
	MaxWaiting  int              // requests the queue holds before it answers 503; zero means 4096
	ModelName   string           // the model_name label; zero means fake-model
	Now         func() time.Time // the scheduler's clock; nil means time.Now

	// Tracer, when not nil, gets one llm_request span per request that ran to its end,
	// shaped as vLLM's, parented on the request's traceparent: queue and prefill times
	// from the scheduler when it is on, from the latency model otherwise.
	Tracer trace.Tracer
}

// The modes the X-Fakellm-Mode header selects.
const (
	ModeError      = "error"      // 500 with a provider error body
	ModeRateLimit  = "ratelimit"  // 429 with a provider error body
	ModeStall      = "stall"      // stream half the tokens, then hang until the client leaves
	ModeDisconnect = "disconnect" // stream half the tokens, then close the connection
	ModeMalformed  = "malformed"  // one data line mid-stream is not JSON
	ModeSSEError   = "sse-error"  // stream half the tokens, then the provider's error event
	ModeGzip       = "gzip"       // gzip the body
	ModeSilent     = "silent"     // never answer
)

var modes = []string{ModeError, ModeRateLimit, ModeStall, ModeDisconnect, ModeMalformed, ModeSSEError, ModeGzip, ModeSilent}

// The bounds of the X-Fakellm-* headers; a value outside them is answered 400, as a value
// that does not parse is. The flags are the operator's and are not bounded.
const (
	MaxHeaderTokens = 1_000_000        // X-Fakellm-Tokens and X-Fakellm-Cached
	MaxHeaderTTFT   = 10 * time.Minute // X-Fakellm-TTFT
	MaxHeaderTPOT   = 10 * time.Second // X-Fakellm-TPOT
	MaxHeaderAnswer = time.Hour        // TTFT + (tokens-1) × TPOT, when a header sets one of them
)

// header returns the value of the control header name; an empty one is no header. A
// header given twice is refused as a bad value, since which one counts would be a guess.
func header(h http.Header, name string) (string, bool) {
	vs := h.Values(name)
	switch {
	case len(vs) == 0 || len(vs) == 1 && vs[0] == "":
		return "", false
	case len(vs) == 1:
		return vs[0], true
	}
	return strings.Join(vs, ", "), true
}

// maxQuoted is how much of a bad header value an error quotes.
const maxQuoted = 64

func badHeader(name, v, want string) error {
	if len(v) > maxQuoted {
		v = strings.ToValidUTF8(v[:maxQuoted], "") + "…"
	}
	return fmt.Errorf("%s: %q must be %s", name, v, want)
}

// Server is the fake LLM's HTTP handler.
type Server struct {
	opts Options
	mux  *http.ServeMux
	mu   sync.Mutex
	rng  *rand.Rand
	eng  *engine // nil when the scheduler is off
}

// New returns the fake with opts; zero TTFT, TPOT and Tokens mean no wait and 16 tokens.
func New(opts Options) *Server {
	if opts.Tokens <= 0 {
		opts.Tokens = 16
	}
	s := &Server{opts: opts, mux: http.NewServeMux(), rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))}
	s.mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, chat) })
	s.mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, completions) })
	s.mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, messages) })
	s.mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, responses) })
	s.mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model","created":1700000000,"owned_by":"tokenscope"}]}`)
	})
	if opts.MaxBatch > 0 || opts.KVTokens > 0 || opts.PrefixCache {
		reg := prometheus.NewRegistry()
		s.eng = newEngine(opts, reg)
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	return s
}

// Finished returns what the scheduler measured of the last 4,096 requests that ran to
// their end, oldest first; nil when the scheduler is off.
func (s *Server) Finished() []EngineRecord {
	if s.eng == nil {
		return nil
	}
	return s.eng.records()
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type api int

const (
	chat api = iota
	completions
	messages
	responses // OpenAI's Responses API
)

// request is the part of a request body the fake reads.
type request struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	MaxTokens     *int            `json:"max_tokens"`
	MaxCompletion *int            `json:"max_completion_tokens"`
	MaxOutput     *int            `json:"max_output_tokens"` // the Responses API's
	Input         json.RawMessage `json:"input"`             // the Responses API's prompt: a string or input items
	Instructions  json.RawMessage `json:"instructions"`
	Messages      []message       `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	System        json.RawMessage `json:"system"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type message struct {
	Content json.RawMessage `json:"content"`
}

// plan is what one response will be.
type plan struct {
	api          api
	model        string
	stream       bool
	includeUsage bool
	input        int
	cached       int
	output       int
	truncated    bool // output was cut short by the request's max_tokens: stop_reason max_tokens, finish_reason length
	ttft, tpot   time.Duration
	mode         string
	id           string
	created      int64
	seed         uint64
	words        []string // the prompt's words in order, kept only for the prefix cache
	maxTokens    int      // the request's max_tokens (max_completion_tokens), 0 when absent
}

// finishReason is the OpenAI finish_reason of a response that ran to its end.
func (p *plan) finishReason() string {
	if p.truncated {
		return "length"
	}
	return "stop"
}

// stopReason is the Anthropic stop_reason of a response that ran to its end.
func (p *plan) stopReason() string {
	if p.truncated {
		return "max_tokens"
	}
	return "end_turn"
}

func (s *Server) roll() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Float64()
}

func (s *Server) plan(r *http.Request, a api, body []byte) (*plan, error) {
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("cannot parse the request body as JSON: %w", err)
	}
	if req.Model == "" {
		return nil, fmt.Errorf("model is required")
	}
	h := fnv.New64a()
	_, _ = io.WriteString(h, req.Model)
	var words int
	var kept []string
	keep := s.eng != nil && s.eng.prefix != nil
	count := func(raw json.RawMessage) {
		_, _ = h.Write(raw)
		if keep {
			n := len(kept)
			kept = appendWords(kept, raw)
			words += len(kept) - n
			return
		}
		words += countWords(raw)
	}
	count(req.Prompt)
	count(req.System)
	count(req.Instructions)
	count(req.Input)
	for _, m := range req.Messages {
		count(m.Content)
	}
	p := &plan{api: a, model: req.Model, stream: req.Stream, input: max(words, 1), output: s.opts.Tokens,
		ttft: s.opts.TTFT, tpot: s.opts.TPOT, seed: h.Sum64(), words: kept}
	p.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	p.ttft += time.Duration(int64(s.opts.PrefillPer1K) * int64(p.input) / 1000)
	hdr := r.Header
	// Like a model, the fake says what it chose to say and stops on its own (end_turn,
	// stop), unless the request's limit cuts it short (max_tokens, length). X-Fakellm-Tokens
	// makes it say exactly that many, past the limit if need be (long streams in tests); the
	// stop reason still says whether that was over the limit.
	limit := req.MaxTokens
	if limit == nil {
		limit = req.MaxCompletion
	}
	if limit == nil {
		limit = req.MaxOutput
	}
	forced := false
	if v, ok := header(hdr, "X-Fakellm-Tokens"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxHeaderTokens {
			return nil, badHeader("X-Fakellm-Tokens", v, fmt.Sprintf("a whole number from 1 to %d", MaxHeaderTokens))
		}
		p.output, forced = n, true
	}
	if limit != nil {
		p.maxTokens = *limit
	}
	if limit != nil && *limit < p.output {
		p.truncated = true
		if !forced {
			p.output = max(*limit, 1)
		}
	}
	if v, ok := header(hdr, "X-Fakellm-Cached"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxHeaderTokens {
			return nil, badHeader("X-Fakellm-Cached", v, fmt.Sprintf("a whole number from 0 to %d", MaxHeaderTokens))
		}
		p.cached = min(n, p.input)
	}
	paced := forced
	for _, d := range []struct {
		name string
		max  time.Duration
		to   *time.Duration
	}{{"X-Fakellm-TTFT", MaxHeaderTTFT, &p.ttft}, {"X-Fakellm-TPOT", MaxHeaderTPOT, &p.tpot}} {
		if v, ok := header(hdr, d.name); ok {
			x, err := time.ParseDuration(v)
			if err != nil || x < 0 || x > d.max {
				return nil, badHeader(d.name, v, fmt.Sprintf("a duration from 0s to %v", d.max))
			}
			*d.to, paced = x, true
		}
	}
	// Each bound alone still lets a million tokens at 10 s each stream for months.
	// (In seconds: -tokens may be large enough to overflow a Duration.)
	if took := p.ttft.Seconds() + float64(p.output-1)*p.tpot.Seconds(); paced && took > MaxHeaderAnswer.Seconds() {
		return nil, fmt.Errorf("X-Fakellm-Tokens, X-Fakellm-TTFT and X-Fakellm-TPOT make an answer of %d tokens that takes %.0fs, over the %v maximum", p.output, took, MaxHeaderAnswer)
	}
	if v, ok := header(hdr, "X-Fakellm-Mode"); ok {
		switch v {
		case ModeError, ModeRateLimit, ModeStall, ModeDisconnect, ModeMalformed, ModeSSEError, ModeGzip, ModeSilent:
			p.mode = v
		default:
			return nil, badHeader("X-Fakellm-Mode", v, "one of "+strings.Join(modes, ", "))
		}
	}
	if p.mode == "" {
		switch x := s.roll(); {
		case x < s.opts.ErrorRate:
			p.mode = ModeError
		case x < s.opts.ErrorRate+s.opts.RateLimitRate:
			p.mode = ModeRateLimit
		case p.stream && x < s.opts.ErrorRate+s.opts.RateLimitRate+s.opts.StallRate:
			p.mode = ModeStall
		case p.stream && x < s.opts.ErrorRate+s.opts.RateLimitRate+s.opts.StallRate+s.opts.DisconnectRate:
			p.mode = ModeDisconnect
		}
	}
	prefix := "chatcmpl-"
	switch a {
	case completions:
		prefix = "cmpl-"
	case messages:
		prefix = "msg_"
	case responses:
		prefix = "resp_"
	}
	p.id = fmt.Sprintf("%s%016x", prefix, p.seed)
	p.created = 1_700_000_000 + int64(p.seed%1_000_000)
	return p, nil
}

// countWords counts whitespace-separated words in the strings of a JSON value: a rough
// token count that is the same for the same prompt whatever the protocol.
func countWords(raw json.RawMessage) int {
	n := 0
	walkStrings(raw, func(s string) { n += len(strings.Fields(s)) })
	return n
}

// appendWords appends the words countWords counts, in order.
func appendWords(words []string, raw json.RawMessage) []string {
	walkStrings(raw, func(s string) { words = append(words, strings.Fields(s)...) })
	return words
}

func walkStrings(raw json.RawMessage, f func(string)) {
	if len(raw) == 0 {
		return
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			f(x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			if t, ok := x["text"]; ok {
				walk(t)
			}
			if c, ok := x["content"]; ok {
				walk(c)
			}
		}
	}
	walk(v)
}

var vocabulary = strings.Fields(`the a token stream measures what users feel latency of every request
depends on input and output length so percentiles are kept per bucket never averaged across
prompts long context prefill grows while decode speed follows load`)

func (p *plan) word(i int) string {
	return vocabulary[(int(p.seed%97)+i)%len(vocabulary)] + " "
}

func (p *plan) text(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(p.word(i))
	}
	return b.String()
}

// MaxBody is the largest request body the fake reads; a larger one gets 413.
const MaxBody = 64 << 20

func (s *Server) serve(w http.ResponseWriter, r *http.Request, a api) {
	arrived := time.Now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, a, http.StatusRequestEntityTooLarge, "invalid_request_error", fmt.Sprintf("the request body is over %d bytes", MaxBody))
		}
		return
	}
	p, err := s.plan(r, a, body)
	if err != nil {
		writeError(w, a, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	ctx := r.Context()
	// Under the scheduler the time to the first token is queueing and prefill, which the
	// scheduler paces; failures are answered at once, before the queue.
	if s.eng == nil && !sleep(r, p.ttft/2) {
		return
	}
	switch p.mode {
	case ModeSilent:
		<-ctx.Done()
		return
	case ModeError:
		writeError(w, a, http.StatusInternalServerError, "server_error", "the fake LLM was told to fail")
		return
	case ModeRateLimit:
		w.Header().Set("Retry-After", "1")
		typ := "rate_limit_exceeded"
		if a == messages {
			typ = "rate_limit_error"
		}
		writeError(w, a, http.StatusTooManyRequests, typ, "the fake LLM was told to rate-limit")
		return
	}
	if s.eng != nil {
		s.serveScheduled(w, r, p, arrived)
		return
	}
	if !p.stream {
		if !sleep(r, p.ttft-p.ttft/2+time.Duration(p.output-1)*p.tpot) {
			return
		}
		s.whole(w, p)
	} else if !s.streamOut(w, r, p, nil) {
		return
	}
	if s.opts.Tracer != nil {
		s.exportSpan(r, p, modelTimes(p, arrived, time.Now()))
	}
}

// serveScheduled answers p through the scheduler: it queues, waits for admission, spends
// its prefill, and takes a KV slot for each token, waiting again when preempted.
func (s *Server) serveScheduled(w http.ResponseWriter, r *http.Request, p *plan, arrived time.Time) {
	sq := &seq{input: p.input}
	if s.eng.prefix != nil {
		sq.blocks = blockHashes(p.model, p.words)
	}
	if err := s.eng.submit(sq, p.output); err != nil {
		if errors.Is(err, errQueueFull) {
			w.Header().Set("Retry-After", "1")
			writeError(w, p.api, http.StatusServiceUnavailable, "server_error", err.Error())
			return
		}
		writeError(w, p.api, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	completed := false
	defer func() {
		if !completed {
			s.eng.abort(sq)
			return
		}
		rec := s.eng.finish(sq)
		if s.opts.Tracer != nil {
			s.exportSpan(r, p, engineTimes(rec, arrived, time.Now()))
		}
	}()
	if p.stream {
		completed = s.streamOut(w, r, p, sq)
		return
	}
	pause := func(d time.Duration) bool { return sleep(r, d) }
	if !s.admit(r.Context(), sq, p, pause) {
		return
	}
	for i := range p.output {
		if i > 0 && !pause(p.tpot) {
			return
		}
		if !s.step(r.Context(), sq, p, pause) {
			return
		}
	}
	completed = true
	s.whole(w, p)
}

// admit waits for sq's admission and spends its prefill.
func (s *Server) admit(ctx context.Context, sq *seq, p *plan, pause func(time.Duration) bool) bool {
	return s.eng.wait(ctx, sq) && pause(s.eng.prefillTime(p, sq, s.opts.PrefillPer1K))
}

// step takes sq's next token's KV slot; preempted, it waits to be admitted again and
// recomputes before it tries again.
func (s *Server) step(ctx context.Context, sq *seq, p *plan, pause func(time.Duration) bool) bool {
	for !s.eng.grow(sq) {
		if !s.admit(ctx, sq, p, pause) {
			return false
		}
	}
	return true
}

func sleep(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

func writeError(w http.ResponseWriter, a api, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// JSON's escapes, not Go's: a message may quote a client's bytes.
	m, _ := json.Marshal(msg)
	if a == messages {
		_, _ = fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%s}}`, typ, m)
		return
	}
	_, _ = fmt.Fprintf(w, `{"error":{"message":%s,"type":%q,"param":null,"code":%q}}`, m, typ, typ)
}

func (s *Server) whole(w http.ResponseWriter, p *plan) {
	text := p.text(p.output)
	var body []byte
	switch p.api {
	case chat:
		body = fmt.Appendf(nil, `{"id":%q,"object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q,"refusal":null},"logprobs":null,"finish_reason":%q}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			p.id, p.created, p.model, text, p.finishReason(), p.input, p.output, p.input+p.output, p.cached)
	case completions:
		body = fmt.Appendf(nil, `{"id":%q,"object":"text_completion","created":%d,"model":%q,"choices":[{"text":%q,"index":0,"logprobs":null,"finish_reason":%q}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			p.id, p.created, p.model, text, p.finishReason(), p.input, p.output, p.input+p.output)
	case messages:
		body = fmt.Appendf(nil, `{"id":%q,"type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":%q}],"stop_reason":%q,"stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":%d,"output_tokens":%d}}`,
			p.id, p.model, text, p.stopReason(), p.input-p.cached, p.cached, p.output)
	case responses:
		body = p.responseObject(p.status(), text)
	}
	w.Header().Set("Content-Type", "application/json")
	if p.mode == ModeMalformed {
		body = body[:len(body)/2]
	}
	if p.mode == ModeGzip {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = zw.Write(body)
		_ = zw.Close()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// status is the Responses API status of a response that ran to its end.
func (p *plan) status() string {
	if p.truncated {
		return "incomplete"
	}
	return "completed"
}

// responseObject is a Responses API response object: in_progress with no output yet, or
// ended with text as its one message.
func (p *plan) responseObject(status, text string) []byte {
	incomplete, output, usage := "null", "[]", "null"
	if p.truncated && status == "incomplete" {
		incomplete = `{"reason":"max_output_tokens"}`
	}
	if status != "in_progress" {
		output = fmt.Sprintf(`[{"id":"msg_%s","type":"message","status":%q,"content":[{"type":"output_text","annotations":[],"logprobs":[],"text":%q}],"role":"assistant"}]`,
			p.id[len("resp_"):], status, text)
		usage = fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}`,
			p.input, p.cached, p.output, p.input+p.output)
	}
	maxOutput := "null"
	if p.maxTokens > 0 {
		maxOutput = strconv.Itoa(p.maxTokens)
	}
	return fmt.Appendf(nil, `{"id":%q,"object":"response","created_at":%d,"status":%q,"background":false,"error":null,"incomplete_details":%s,"instructions":null,"max_output_tokens":%s,"model":%q,"output":%s,"parallel_tool_calls":true,"previous_response_id":null,"store":false,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":%s,"metadata":{}}`,
		p.id, p.created, status, incomplete, maxOutput, p.model, output, usage)
}
