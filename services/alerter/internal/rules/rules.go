package rules

import "time"

// Metric is one figure the alerter watches. The first NumSeriesMetrics are computed per
// env × scene × model × input bucket from token rollups; the next NumHostMetrics per host,
// joining token rollups by instance with GPU rollups by host; the next NumEngineMetrics per
// inference engine × model, from engine rollups; the last NumBusinessMetrics per env ×
// scene, from feedback rollups and token rollups' outcomes.
type Metric int

// The watched metrics.
const (
	TTFTP95     Metric = iota // ms, merged over the series' instances
	TPOTP95                   // ms
	TotalP99                  // ms
	ErrorRate                 // errors / requests
	TimeoutRate               // timeouts / requests (timeouts are never errors)
	OutputTPS                 // output tokens / window seconds

	GPUEfficiency  // output tokens/s ÷ mean GPU utilisation (%)
	TokensPerJoule // output tokens ÷ GPU energy used in the window

	QueueDepth   // requests waiting in the engine's queue, mean over the window
	QueueTimeP95 // ms requests waited in the engine's queue, p95 (bucket-interpolated)

	// Business metrics, per env × scene.
	Satisfaction   // share of positive verdicts among the window's SatisfactionFeedback verdicts
	CompletionRate // completed / (completed + abandoned): gateway requests' outcomes and CompletionFeedback verdicts

	NumMetrics
)

// How many metrics belong to token series, to hosts, to engines and to scenes' business
// series, in that order.
const (
	NumSeriesMetrics   = int(GPUEfficiency)
	NumHostMetrics     = int(QueueDepth) - NumSeriesMetrics
	NumEngineMetrics   = int(Satisfaction) - int(QueueDepth)
	NumBusinessMetrics = int(NumMetrics) - int(Satisfaction)
)

// SatisfactionFeedback is the name of the feedback whose share positive is satisfaction.
const SatisfactionFeedback = "thumbs"

// CompletionFeedback is the name of the feedback that reports a task's completion (value > 0
// completed, otherwise abandoned), the way an app behind the gateway proxy reports it: it
// counts in completion rate beside the requests' outcomes.
const CompletionFeedback = "task_completed"

var metricNames = [NumMetrics]string{
	"ttft_p95", "tpot_p95", "total_p99", "error_rate", "timeout_rate", "output_tps",
	"gpu_efficiency", "tokens_per_joule",
	"queue_depth", "queue_time_p95",
	"satisfaction", "completion_rate",
}

// String returns the metric's name as the rules file and alert names spell it.
func (m Metric) String() string {
	if m < 0 || m >= NumMetrics {
		return "unknown"
	}
	return metricNames[m]
}

// HostMetric reports whether m is computed per host rather than per token series.
func (m Metric) HostMetric() bool { return m >= GPUEfficiency && m < QueueDepth }

// EngineMetric reports whether m is computed per inference engine × model.
func (m Metric) EngineMetric() bool { return m >= QueueDepth && m < Satisfaction }

// BusinessMetric reports whether m is computed per env × scene from verdicts and outcomes.
func (m Metric) BusinessMetric() bool { return m >= Satisfaction && m < NumMetrics }

// HighIsBad reports the bad direction: latencies, rates and queues alert when high;
// throughput, efficiency, satisfaction and completion when low.
func (m Metric) HighIsBad() bool { return m <= TimeoutRate || m.EngineMetric() }

// ParseMetric returns the metric named s.
func ParseMetric(s string) (Metric, bool) {
	for i, n := range metricNames {
		if n == s {
			return Metric(i), true
		}
	}
	return 0, false
}

// Baseline methods.
const (
	MeanSigma = "mean_sigma" // mean ± k·σ; an incident in the baseline days widens σ and hides the next one
	MedianMAD = "median_mad" // median ± k·MAD (MAD scaled by 1.4826 to estimate σ), the default: robust to incidents and skew
	Static    = "static"     // a fixed threshold
)

// Dynamic is a seasonal threshold on one metric: fire when the value is beyond the
// baseline center by k spreads in the bad direction.
type Dynamic struct {
	Enabled  bool
	Method   string  // MeanSigma or MedianMAD
	K        float64 // spreads from the center
	Severity string
	// The threshold is never closer to the center than MinChange·|center| nor than MinDelta,
	// so a near-constant baseline (σ ≈ 0) does not fire on noise.
	MinChange float64
	MinDelta  float64
	// A dynamic rule may fire only with at least MinPoints baseline windows and MinRequests
	// requests in the evaluated window; below either, the static rule applies. For the
	// business metrics MinRequests counts verdicts (satisfaction) or outcomes (completion),
	// and a window with fewer does not enter the baseline either.
	MinPoints   int
	MinRequests uint64
}

// Level is one static threshold and the severity it fires with.
type Level struct {
	Severity  string
	Threshold float64
}

// StaticRule is a fixed SLA threshold on a high-is-bad metric, with a warning and a
// critical level (a level at 0 is off).
type StaticRule struct {
	Enabled     bool
	Warning     float64
	Critical    float64
	MinRequests uint64
	// Always evaluates the SLA even where the dynamic rule is eligible; by default the
	// static rule is the fallback for series without enough baseline or traffic.
	Always bool
}

// Levels returns the enabled levels, critical last, without allocating.
func (s StaticRule) Levels() (lv [2]Level, n int) {
	if s.Warning > 0 {
		lv[n] = Level{"warning", s.Warning}
		n++
	}
	if s.Critical > 0 {
		lv[n] = Level{"critical", s.Critical}
		n++
	}
	return lv, n
}

// Saturation fires for a host whose mean GPU utilisation is at least UtilPct while a series
// served by it breaks its TTFT p95 SLA (warning level): 100 % busy is a warning sign,
// not efficiency.
type Saturation struct {
	Enabled  bool
	UtilPct  float64
	Severity string
}

// EngineLevel is a static rule on inference engines' rollups: it fires once the condition
// has held in every window for For (rounded up to whole windows), at Severity.
type EngineLevel struct {
	Enabled   bool
	Threshold float64
	For       time.Duration
	Severity  string
}

// Windows returns how many consecutive windows of the given length make For.
func (l EngineLevel) Windows(windowSeconds int) int {
	if windowSeconds <= 0 {
		return 1
	}
	w := time.Duration(windowSeconds) * time.Second
	return max(int((l.For+w-1)/w), 1)
}

// EngineRules are the rules on inference engines beside their dynamic ones (queue depth and
// queue time against their baselines).
type EngineRules struct {
	// KVCache fires while the engine's KV-cache usage (mean over the window, 0–1) is at
	// least Threshold.
	KVCache EngineLevel
	// Preemptions fires while the engine preempts more than Threshold requests per second.
	Preemptions EngineLevel
	// Down fires while no scrape of the engine succeeded in the window.
	Down EngineLevel
	// TTFTHint makes a TTFT alert on a series served by a host with engine data say which
	// of the engine's queue time and prefill time grew with it.
	TTFTHint bool
}

// The engine rules' names.
const (
	KVCacheName     = "kv_cache_saturation"
	PreemptionsName = "engine_preemptions"
	DownName        = "engine_down"
)

// Rules is the full rule set for one scene (or, for host and engine rules, for every host).
type Rules struct {
	// For is how many consecutive breaching windows turn pending into firing.
	For int
	// KeepFiringFor is how many consecutive normal windows resolve a firing alert.
	KeepFiringFor int
	// Hysteresis moves the threshold of a firing alert toward normal by this fraction of its
	// distance from the baseline center (static: of the threshold), so a value hovering at
	// the threshold does not flap.
	Hysteresis float64

	Dynamic    [NumMetrics]Dynamic
	Static     [NumMetrics]StaticRule
	Saturation Saturation
	Engine     EngineRules
}

var dynamicNames, staticNames [NumMetrics]string

func init() {
	for m := Metric(0); m < NumMetrics; m++ {
		dynamicNames[m] = m.String() + "_dynamic"
		staticNames[m] = m.String() + "_sla"
	}
}

// DynamicName returns the dynamic rule's name for m, as alerts and subjects spell it.
func DynamicName(m Metric) string { return dynamicNames[m] }

// StaticName returns the static SLA rule's name for m.
func StaticName(m Metric) string { return staticNames[m] }

// SaturationName is the saturation rule's name.
const SaturationName = "gpu_saturation"

// Defaults returns the built-in rules: median ± 2·MAD on every metric, and the
// SLA thresholds: TTFT p95 over 2 s warning, 5 s critical; TPOT p95 over 100 ms / 200 ms;
// error rate over 5 % / 20 %; timeout rate over 2 % / 10 %.
func Defaults() Rules {
	r := Rules{For: 2, KeepFiringFor: 2, Hysteresis: 0.2}
	// The median, not the mean: a past incident is in the baseline's days (yesterday's hour
	// of 5× TTFT), and a mean and σ that learn it hide the next one at that time of day. The
	// median and MAD move only once a change is on more than half of the days they read, so
	// an incident never teaches the baseline, and a lasting change becomes normal after a
	// few days.
	for m := Metric(0); m < NumMetrics; m++ {
		r.Dynamic[m] = Dynamic{
			Enabled:     true,
			Method:      MedianMAD,
			K:           2,
			Severity:    "warning",
			MinChange:   0.1,
			MinPoints:   60,
			MinRequests: 20,
		}
	}
	// A latency percentile must be 30 % worse than usual, whatever σ says: with k = 2 and
	// for = 2, Gaussian noise alone would breach a few times a week per series.
	for _, m := range []Metric{TTFTP95, TPOTP95, TotalP99} {
		r.Dynamic[m].MinChange = 0.3
		r.Dynamic[m].MinRequests = 100 // a p95 of fewer requests is too noisy to alert on
	}
	// Rates near zero: a few extra errors in a small window are not an incident.
	for _, m := range []Metric{ErrorRate, TimeoutRate} {
		r.Dynamic[m].MinDelta = 0.03
		r.Dynamic[m].MinRequests = 100
	}
	r.Dynamic[OutputTPS].MinChange = 0.3
	// Efficiency must fall clearly, not wobble with load.
	r.Dynamic[GPUEfficiency].MinChange = 0.2
	r.Dynamic[TokensPerJoule].MinChange = 0.2
	// Shares of verdicts and outcomes: 10 points below the usual, with at least 20 of them
	// in the window (and in each baseline window), so a quiet window neither fires nor
	// teaches the baseline a share of 3 verdicts.
	for _, m := range []Metric{Satisfaction, CompletionRate} {
		r.Dynamic[m].MinDelta = 0.1
		r.Dynamic[m].MinRequests = 20
		r.Dynamic[m].MinPoints = 30
	}

	r.Static[TTFTP95] = StaticRule{Enabled: true, Warning: 2000, Critical: 5000, MinRequests: 20}
	r.Static[TPOTP95] = StaticRule{Enabled: true, Warning: 100, Critical: 200, MinRequests: 20}
	r.Static[ErrorRate] = StaticRule{Enabled: true, Warning: 0.05, Critical: 0.2, MinRequests: 100}
	r.Static[TimeoutRate] = StaticRule{Enabled: true, Warning: 0.02, Critical: 0.1, MinRequests: 100}
	r.Saturation = Saturation{Enabled: true, UtilPct: 95, Severity: "warning"}

	// Engines: a queue is often empty, so its baseline's spread is near zero; it must grow
	// by half and by two requests (or 250 ms) before it is an incident. A queue-time p95 of
	// fewer than 20 requests is noise; queue depth is a gauge and needs none.
	r.Dynamic[QueueDepth].MinChange, r.Dynamic[QueueDepth].MinDelta, r.Dynamic[QueueDepth].MinRequests = 0.5, 2, 0
	r.Dynamic[QueueTimeP95].MinChange, r.Dynamic[QueueTimeP95].MinDelta = 0.5, 250
	r.Engine = EngineRules{
		KVCache:     EngineLevel{Enabled: true, Threshold: 0.95, For: 2 * time.Minute, Severity: "warning"},
		Preemptions: EngineLevel{Enabled: true, Threshold: 0, For: 2 * time.Minute, Severity: "warning"},
		Down:        EngineLevel{Enabled: true, For: 30 * time.Second, Severity: "critical"},
		TTFTHint:    true,
	}
	return r
}

// Set is the rules in force: the defaults, and per-scene overrides of them.
type Set struct {
	Default Rules
	Scenes  map[string]*Rules
	Source  string // the file they came from, or "built-in"
}

// NewSet returns a set with the built-in defaults and no scene overrides.
func NewSet() *Set {
	return &Set{Default: Defaults(), Scenes: map[string]*Rules{}, Source: "built-in"}
}

// For returns the rules of scene: its overrides, or the defaults.
func (s *Set) For(scene string) *Rules {
	if r, ok := s.Scenes[scene]; ok {
		return r
	}
	return &s.Default
}
