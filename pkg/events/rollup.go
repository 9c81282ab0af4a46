package events

import "time"

// Rollup kinds: the row written when a window closes, and a row that adds events that
// arrived after it closed. Both add up with plain sum().
const (
	KindWindow     = "window"
	KindCorrection = "correction"
)

// TokenRollup is one window × env × scene × model × layer × input bucket (× instance): what the
// aggregator writes to token_rollups and publishes on rollup.tokens.<env>.<scene>.
// Latency fields are in milliseconds; each digest's centroids travel as means and weights
// so that any range of windows can be merged without averaging percentiles.
type TokenRollup struct {
	V             int       `json:"v"`
	WindowStart   time.Time `json:"window_start"`
	WindowSeconds int       `json:"window_seconds"`
	Kind          string    `json:"kind"`

	Env      string `json:"env"`
	Scene    string `json:"scene"`
	Model    string `json:"model"`
	Instance string `json:"instance"`
	Layer    Layer  `json:"layer"` // never summed with another layer's rollups
	Bucket   string `json:"bucket"`

	Requests    uint64 `json:"requests"`
	OK          uint64 `json:"ok"`
	Errors      uint64 `json:"errors"`
	Timeouts    uint64 `json:"timeouts"`
	Canceled    uint64 `json:"canceled"`
	RateLimited uint64 `json:"rate_limited"`
	Late        uint64 `json:"late"`
	Estimated   uint64 `json:"estimated"` // events whose token counts were estimated
	Unpriced    uint64 `json:"unpriced"`  // events of a model missing from the price table
	// Requests by business outcome (the request event's outcome): completion rate is
	// completed / (completed + abandoned). Requests without an outcome count in neither.
	Completed uint64 `json:"completed"`
	Abandoned uint64 `json:"abandoned"`

	InputTokens       uint64  `json:"input_tokens"`
	OutputTokens      uint64  `json:"output_tokens"`
	CachedInputTokens uint64  `json:"cached_input_tokens"`
	CostUSD           float64 `json:"cost_usd"`
	MaxITLMs          float64 `json:"max_itl_ms"`

	TTFT  Latency `json:"ttft"`
	TPOT  Latency `json:"tpot"`
	Total Latency `json:"total"`
}

// Latency summarises one latency digest of a rollup, in milliseconds. Count is the number of
// samples (a request without a defined TPOT adds none).
type Latency struct {
	Count   uint64    `json:"count"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	P50     float64   `json:"p50"`
	P90     float64   `json:"p90"`
	P95     float64   `json:"p95"`
	P99     float64   `json:"p99"`
	Means   []float64 `json:"means"`
	Weights []uint64  `json:"weights"`
}

// GPURollup is one window × host × GPU: what the aggregator writes to gpu_rollups and
// publishes on rollup.gpu.<host>.
type GPURollup struct {
	V             int       `json:"v"`
	WindowStart   time.Time `json:"window_start"`
	WindowSeconds int       `json:"window_seconds"`
	Kind          string    `json:"kind"`
	Host          string    `json:"host"`
	GPUIndex      int       `json:"gpu_index"`
	GPUUUID       string    `json:"gpu_uuid"`
	GPUName       string    `json:"gpu_name"`
	Samples       uint64    `json:"samples"`

	UtilAvg    float64 `json:"util_avg"`
	UtilMax    float64 `json:"util_max"`
	MemUsedMax uint64  `json:"mem_used_max"`
	MemTotal   uint64  `json:"mem_total"`
	PowerAvgW  float64 `json:"power_avg_w"`
	PowerMaxW  float64 `json:"power_max_w"`
	EnergyJ    float64 `json:"energy_j"` // used in the window: the samples' energy_used_j, else the counter's delta
	TempMaxC   float64 `json:"temp_max_c"`
	SMClockAvg float64 `json:"sm_clock_avg_mhz"`
	Throttled  uint64  `json:"throttled_samples"` // samples with any throttle reason but idle
}
