package events

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Inference engines whose Prometheus endpoints gpuwatch reads.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
	EngineTGI    = "tgi"
)

// Histogram bounds in an engine sample.
const (
	MaxEngineBuckets = 128 // finite bucket bounds per histogram
)

// EngineSample is what one inference engine said about one model at one tick, read from
// its Prometheus endpoint. A reading the engine does not export is nil and absent from the
// JSON — never zero. Counters are deltas since the previous tick's scrape (DeltaSeconds
// ago), restarting from the new value when the engine restarted; they and the histograms
// are absent on the first scrape, which has nothing to subtract.
type EngineSample struct {
	V      int       `json:"v"`
	TS     time.Time `json:"ts"`
	Host   string    `json:"host"`
	Engine string    `json:"engine"`          // vllm, sglang or tgi
	Name   string    `json:"name"`            // the endpoint's name in GPUWATCH_ENGINES, unique per host
	Model  string    `json:"model,omitempty"` // the model_name label; absent where the engine has none (TGI)
	Up     bool      `json:"up"`
	// Error says why the scrape failed when Up is false: timeout, connect, http_status,
	// too_large or malformed.
	Error string `json:"error,omitempty"`

	DeltaSeconds *float64 `json:"delta_seconds,omitempty"` // the time the deltas cover

	// Gauges at the scrape.
	Running       *float64 `json:"running,omitempty"`        // requests running (in the batch)
	Waiting       *float64 `json:"waiting,omitempty"`        // requests waiting in the queue
	KVCacheUsage  *float64 `json:"kv_cache_usage,omitempty"` // fraction of the KV cache in use, 0–1
	BatchSize     *float64 `json:"batch_size,omitempty"`     // TGI's current batch
	CacheHitRate  *float64 `json:"cache_hit_rate,omitempty"` // SGLang's own prefix-cache hit rate, 0–1
	GenThroughput *float64 `json:"gen_throughput,omitempty"` // SGLang's generation tokens/s

	// Counter deltas since the previous scrape.
	PrefixCacheQueries *float64 `json:"prefix_cache_queries,omitempty"` // tokens looked up
	PrefixCacheHits    *float64 `json:"prefix_cache_hits,omitempty"`    // tokens found
	Preemptions        *float64 `json:"preemptions,omitempty"`
	PromptTokens       *float64 `json:"prompt_tokens,omitempty"`
	GenerationTokens   *float64 `json:"generation_tokens,omitempty"`

	// Histogram deltas since the previous scrape.
	QueueTime       *HistogramDelta `json:"queue_time_seconds,omitempty"`
	TTFT            *HistogramDelta `json:"ttft_seconds,omitempty"`
	PrefillTime     *HistogramDelta `json:"prefill_time_seconds,omitempty"`
	DecodeTime      *HistogramDelta `json:"decode_time_seconds,omitempty"`
	IterationTokens *HistogramDelta `json:"iteration_tokens,omitempty"`
	GeneratedTokens *HistogramDelta `json:"generated_tokens,omitempty"` // per request (TGI)
}

// HistogramDelta is how many observations fell in each bucket since the previous scrape.
// Le holds the finite upper bounds, increasing; Counts has one more entry than Le, the
// last being the bucket above the highest bound (+Inf). Counts are per bucket, not
// cumulative as Prometheus exposes them, so deltas of several ticks add bucket by bucket.
type HistogramDelta struct {
	Le     []float64 `json:"le"`
	Counts []float64 `json:"counts"`
	Sum    float64   `json:"sum"`
	Count  float64   `json:"count"`
}

// UnmarshalEngineSample decodes one engine sample, rejecting unknown JSON types with an
// error that wraps ErrInvalidEvent. It does not validate: call ValidateAt.
func UnmarshalEngineSample(data []byte, s *EngineSample) error {
	*s = EngineSample{}
	return unmarshalSample(data, s, &s.V)
}

// MarshalEngineSample encodes s as the contract's JSON, ts in the contract's millisecond
// layout as every other message writes it.
func MarshalEngineSample(s *EngineSample) ([]byte, error) {
	type plain EngineSample
	return json.Marshal(struct {
		*plain
		TS string `json:"ts"` // shadows plain's
	}{(*plain)(s), FormatTS(s.TS)})
}

// EngineSampleSubject returns engine.sample.<host>.
func EngineSampleSubject(host string) string {
	return string(appendSubject(make([]byte, 0, 48), "engine.sample.", host, "", false))
}

// ValidateAt checks the sample against the contract; see RequestEvent.ValidateAt.
func (s *EngineSample) ValidateAt(now time.Time) error {
	if err := checkSampleHead(s.V, s.TS, s.Host, now); err != nil {
		return err
	}
	switch s.Engine {
	case EngineVLLM, EngineSGLang, EngineTGI:
	case "":
		return fieldErr("engine", ErrMissingField, "")
	default:
		return fieldErr("engine", ErrUnknownStatus, quoteBounded(s.Engine))
	}
	if err := checkLabel("name", s.Name, true); err != nil {
		return err
	}
	if err := checkLabel("model", s.Model, false); err != nil {
		return err
	}
	switch s.Error {
	case "", "timeout", "connect", "http_status", "too_large", "malformed":
	default:
		return fieldErr("error", ErrUnknownStatus, quoteBounded(s.Error))
	}
	for _, f := range [...]struct {
		name string
		v    *float64
		max  float64
	}{
		{"delta_seconds", s.DeltaSeconds, 86400},
		{"running", s.Running, 1e9},
		{"waiting", s.Waiting, 1e9},
		{"kv_cache_usage", s.KVCacheUsage, 1},
		{"batch_size", s.BatchSize, 1e9},
		{"cache_hit_rate", s.CacheHitRate, 1},
		{"gen_throughput", s.GenThroughput, 1e12},
		{"prefix_cache_queries", s.PrefixCacheQueries, 1e18},
		{"prefix_cache_hits", s.PrefixCacheHits, 1e18},
		{"preemptions", s.Preemptions, 1e18},
		{"prompt_tokens", s.PromptTokens, 1e18},
		{"generation_tokens", s.GenerationTokens, 1e18},
	} {
		if f.v != nil {
			if err := checkReading(f.name, *f.v, f.max); err != nil {
				return err
			}
		}
	}
	if s.PrefixCacheHits != nil && s.PrefixCacheQueries != nil && *s.PrefixCacheHits > *s.PrefixCacheQueries {
		return fieldErr("prefix_cache_hits", ErrOutOfRange, "above prefix_cache_queries")
	}
	for _, h := range [...]struct {
		name string
		h    *HistogramDelta
	}{
		{"queue_time_seconds", s.QueueTime}, {"ttft_seconds", s.TTFT},
		{"prefill_time_seconds", s.PrefillTime}, {"decode_time_seconds", s.DecodeTime},
		{"iteration_tokens", s.IterationTokens}, {"generated_tokens", s.GeneratedTokens},
	} {
		if h.h != nil {
			if err := h.h.validate(h.name); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkReading(name string, v, maxV float64) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fieldErr(name, ErrOutOfRange, "not a finite number")
	case v < 0:
		return fieldErr(name, ErrNegative, strconv.FormatFloat(v, 'g', -1, 64))
	case v > maxV:
		return fieldErr(name, ErrOutOfRange, fmt.Sprintf("%g > %g", v, maxV))
	}
	return nil
}

// maxHistogramSum bounds a histogram delta's sum: 1e18 observations of 1e12 each.
const maxHistogramSum = 1e30

func (h *HistogramDelta) validate(name string) error {
	switch {
	case h.Le == nil:
		return fieldErr(name+".le", ErrMissingField, "")
	case h.Counts == nil:
		return fieldErr(name+".counts", ErrMissingField, "")
	case len(h.Le) > MaxEngineBuckets:
		return fieldErr(name+".le", ErrTooLong, fmt.Sprintf("%d bounds, at most %d", len(h.Le), MaxEngineBuckets))
	case len(h.Counts) != len(h.Le)+1:
		return fieldErr(name+".counts", ErrOutOfRange, fmt.Sprintf("%d counts for %d bounds, want one more", len(h.Counts), len(h.Le)))
	}
	for i, le := range h.Le {
		if math.IsNaN(le) || math.IsInf(le, 0) {
			return fieldErr(name+".le", ErrOutOfRange, "not a finite number")
		}
		if i > 0 && le <= h.Le[i-1] {
			return fieldErr(name+".le", ErrOutOfRange, "bounds not increasing")
		}
	}
	total := 0.0
	for _, c := range h.Counts {
		// The field's name is built only for an error: a scrape checks hundreds of counts.
		if c < 0 || c > 1e18 || math.IsNaN(c) || math.IsInf(c, 0) {
			return checkReading(name+".counts", c, 1e18)
		}
		total += c
	}
	if err := checkReading(name+".count", h.Count, 1e18); err != nil {
		return err
	}
	switch {
	case math.IsNaN(h.Sum) || math.IsInf(h.Sum, 0):
		return fieldErr(name+".sum", ErrOutOfRange, "not a finite number")
	case math.Abs(h.Sum) > maxHistogramSum:
		// Unbounded, the sums of a window's samples could reach ±Inf, which no rollup can carry.
		return fieldErr(name+".sum", ErrOutOfRange, fmt.Sprintf("|%g| > %g", h.Sum, maxHistogramSum))
	}
	if math.Abs(total-h.Count) > 1e-6*max(1, h.Count) {
		return fieldErr(name+".count", ErrOutOfRange, "not the sum of counts")
	}
	return nil
}
