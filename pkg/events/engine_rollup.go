package events

import (
	"math"
	"sort"
	"time"
)

// EngineRollup is one window × host × engine endpoint × model: what the aggregator writes
// to engine_rollups and publishes on rollup.engine.<host>, from the engine samples whose ts
// falls in the window. Like the other rollups it is either the window's row or a correction
// that adds samples which arrived after the window was written; every count and sum adds
// with plain sum(), and the means add when weighted by UpSamples.
type EngineRollup struct {
	V             int       `json:"v"`
	WindowStart   time.Time `json:"window_start"`
	WindowSeconds int       `json:"window_seconds"`
	Kind          string    `json:"kind"`

	Host   string `json:"host"`
	Engine string `json:"engine"` // vllm, sglang or tgi
	Name   string `json:"name"`   // the endpoint's name in GPUWATCH_ENGINES, unique per host
	Model  string `json:"model"`  // empty where the engine has no model label (TGI)

	Samples     uint64 `json:"samples"`      // samples of the window: UpSamples + DownSamples
	UpSamples   uint64 `json:"up_samples"`   // scrapes that answered
	DownSamples uint64 `json:"down_samples"` // scrapes that failed: the engine was down or unreadable

	// Gauges, over the up samples that carry them (0 where none does). Running is TGI's
	// current batch where the engine reports no running count.
	QueueDepthAvg   float64 `json:"queue_depth_avg"` // requests waiting
	QueueDepthMax   float64 `json:"queue_depth_max"`
	RunningAvg      float64 `json:"running_avg"` // requests in the batch
	RunningMax      float64 `json:"running_max"`
	KVCacheUsageAvg float64 `json:"kv_cache_usage_avg"` // fraction of the KV cache in use, 0–1
	KVCacheUsageMax float64 `json:"kv_cache_usage_max"`
	// CacheHitRateAvg is SGLang's own prefix-cache hit-rate gauge, averaged; engines with
	// counters get the exact rate from PrefixCacheHits / PrefixCacheQueries instead.
	CacheHitRateAvg float64 `json:"cache_hit_rate_avg"`

	// Sums of the samples' counter deltas. The window's prefix-cache hit rate is
	// PrefixCacheHits / PrefixCacheQueries (token-weighted), never an average of ratios.
	PrefixCacheQueries float64 `json:"prefix_cache_queries"`
	PrefixCacheHits    float64 `json:"prefix_cache_hits"`
	Preemptions        float64 `json:"preemptions"`
	PromptTokens       float64 `json:"prompt_tokens"`
	GenerationTokens   float64 `json:"generation_tokens"`
	// Per second of the window: the tokens ÷ WindowSeconds, so that correction rows add.
	PromptTokensPerS     float64 `json:"prompt_tokens_per_s"`
	GenerationTokensPerS float64 `json:"generation_tokens_per_s"`

	// The engine's histograms, summed bucket by bucket over the window (seconds).
	QueueTime   EngineHistogram `json:"queue_time_seconds"`
	TTFT        EngineHistogram `json:"ttft_seconds"`
	PrefillTime EngineHistogram `json:"prefill_time_seconds"`
	DecodeTime  EngineHistogram `json:"decode_time_seconds"`
}

// EngineHistogram is one engine histogram summed over a window. Le holds the finite
// upper bounds, increasing, and Counts one count per bucket (not cumulative), the last
// being the bucket above the highest bound: as in HistogramDelta, so bucket counts of any
// range of rows with the same bounds add element by element. Both are empty when the
// window saw no observation or the engine exports no such histogram. P50, P95 and P99 are
// interpolated within buckets as Prometheus's histogram_quantile does (see
// HistogramQuantile): they are estimates as fine as the buckets, 0 when Count is 0.
type EngineHistogram struct {
	Le     []float64 `json:"le"`
	Counts []float64 `json:"counts"`
	Sum    float64   `json:"sum"`
	Count  float64   `json:"count"`
	P50    float64   `json:"p50"`
	P95    float64   `json:"p95"`
	P99    float64   `json:"p99"`
}

// SetQuantiles fills P50, P95 and P99 from the bucket counts.
func (h *EngineHistogram) SetQuantiles() {
	h.P50, h.P95, h.P99 = 0, 0, 0
	if h.Count <= 0 {
		return
	}
	for _, q := range [...]struct {
		q   float64
		dst *float64
	}{{0.5, &h.P50}, {0.95, &h.P95}, {0.99, &h.P99}} {
		if v := HistogramQuantile(q.q, h.Le, h.Counts); !math.IsNaN(v) {
			*q.dst = v
		}
	}
}

// HistogramQuantile estimates the q-quantile (0 ≤ q ≤ 1) of a histogram given as finite
// increasing upper bounds le and per-bucket counts (len(le)+1 of them, the last above the
// highest bound), exactly as Prometheus's histogram_quantile does for classic buckets:
// linear interpolation within the bucket that holds the rank, the lowest bucket starting
// at 0 (or returning its bound if that is ≤ 0), and the highest finite bound when the rank
// falls in the +Inf bucket. It returns NaN for no observations, malformed input or q
// outside [0, 1]. Its error is at most the width of the bucket holding the quantile.
func HistogramQuantile(q float64, le, counts []float64) float64 {
	if math.IsNaN(q) || q < 0 || q > 1 || len(counts) != len(le)+1 || len(le) == 0 {
		return math.NaN()
	}
	// Cumulative counts as Prometheus holds them; monotonic by construction since per-bucket
	// counts are not negative (negative ones are treated as 0, as ensureMonotonic would).
	cum := make([]float64, len(counts))
	total := 0.0
	for i, c := range counts {
		if c > 0 {
			total += c
		}
		cum[i] = total
	}
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	b := sort.Search(len(cum)-1, func(i int) bool { return cum[i] >= rank })
	if b == len(cum)-1 {
		return le[len(le)-1]
	}
	if b == 0 && le[0] <= 0 {
		return le[0]
	}
	start, end, count := 0.0, le[b], cum[b]
	if b > 0 {
		start = le[b-1]
		count -= cum[b-1]
		rank -= cum[b-1]
	}
	return start + (end-start)*(rank/count)
}
