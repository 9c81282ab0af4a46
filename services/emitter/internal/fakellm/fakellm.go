package fakellm

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
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

// Server is the fake LLM's HTTP handler.
type Server struct {
	opts Options
	mux  *http.ServeMux
	mu   sync.Mutex
	rng  *rand.Rand
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
	s.mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model","created":1700000000,"owned_by":"tokenscope"}]}`)
	})
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type api int

const (
	chat api = iota
	completions
	messages
)

// request is the part of a request body the fake reads.
type request struct {
	Model         string          `json:"model"`
	Stream        bool            `json:"stream"`
	MaxTokens     *int            `json:"max_tokens"`
	MaxCompletion *int            `json:"max_completion_tokens"`
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
	count := func(raw json.RawMessage) {
		_, _ = h.Write(raw)
		words += countWords(raw)
	}
	count(req.Prompt)
	count(req.System)
	for _, m := range req.Messages {
		count(m.Content)
	}
	p := &plan{api: a, model: req.Model, stream: req.Stream, input: max(words, 1), output: s.opts.Tokens,
		ttft: s.opts.TTFT, tpot: s.opts.TPOT, seed: h.Sum64()}
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
	forced := false
	if v := hdr.Get("X-Fakellm-Tokens"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			p.output, forced = n, true
		}
	}
	if limit != nil && *limit < p.output {
		p.truncated = true
		if !forced {
			p.output = max(*limit, 1)
		}
	}
	if v := hdr.Get("X-Fakellm-Cached"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			p.cached = min(n, p.input)
		}
	}
	for name, d := range map[string]*time.Duration{"X-Fakellm-Ttft": &p.ttft, "X-Fakellm-Tpot": &p.tpot} {
		if v := hdr.Get(name); v != "" {
			if x, err := time.ParseDuration(v); err == nil && x >= 0 {
				*d = x
			}
		}
	}
	p.mode = hdr.Get("X-Fakellm-Mode")
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
	}
	p.id = fmt.Sprintf("%s%016x", prefix, p.seed)
	p.created = 1_700_000_000 + int64(p.seed%1_000_000)
	return p, nil
}

// countWords counts whitespace-separated words in the strings of a JSON value: a rough
// token count that is the same for the same prompt whatever the protocol.
func countWords(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return 0
	}
	n := 0
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			n += len(strings.Fields(x))
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
	return n
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

func (s *Server) serve(w http.ResponseWriter, r *http.Request, a api) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	p, err := s.plan(r, a, body)
	if err != nil {
		writeError(w, a, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	ctx := r.Context()
	if !sleep(r, p.ttft/2) {
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
	if !p.stream {
		if !sleep(r, p.ttft-p.ttft/2+time.Duration(p.output-1)*p.tpot) {
			return
		}
		s.whole(w, p)
		return
	}
	s.streamOut(w, r, p)
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
	if a == messages {
		_, _ = fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%q}}`, typ, msg)
		return
	}
	_, _ = fmt.Fprintf(w, `{"error":{"message":%q,"type":%q,"param":null,"code":%q}}`, msg, typ, typ)
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
