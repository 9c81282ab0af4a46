package events

import "time"

// Alert states.
const (
	AlertFiring   = "firing"
	AlertResolved = "resolved"
)

// Why a resolved alert resolved (Alert.ResolveReason).
const (
	// ResolvedNormal: its last windows were judged normal; Value and Threshold are the
	// latest one's value and the level it came back past.
	ResolvedNormal = "normal"
	// ResolvedSilent: at least one of its last windows had no value to judge (its series
	// sent no rollups, or its rule could no longer be evaluated). Value and Threshold are
	// those of the latest window judged normal, else of the last breaching window.
	ResolvedSilent = "silent"
	// ResolvedWithinSLA: a gpu_saturation alert whose host is still busy while no series
	// it serves breaks its TTFT SLA any more.
	ResolvedWithinSLA = "within_sla"
)

// Alert severities.
const (
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
)

// Alert is one alert state change, published on alerts.<severity>.<rule> and written to the
// alerts table. A firing alert is sent once (and re-sent at the resend interval) and
// resolved once; Fingerprint identifies it across both.
type Alert struct {
	V           int               `json:"v"`
	Fingerprint string            `json:"fingerprint"`
	Rule        string            `json:"rule"`
	State       string            `json:"state"`
	Severity    string            `json:"severity"`
	Labels      map[string]string `json:"labels"`
	// Value and Threshold are one window's (WindowStart): on a firing alert the value that
	// breached and the level it crossed; on a resolved one the value judged normal and the
	// level it came back past (the firing level moved toward normal by the hysteresis).
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	// Baseline of a dynamic rule: mean and σ, or median and MAD for the robust variant.
	BaselineMethod string    `json:"baseline_method,omitempty"`
	BaselineCenter float64   `json:"baseline_center,omitempty"`
	BaselineSpread float64   `json:"baseline_spread,omitempty"`
	WindowStart    time.Time `json:"window_start"`
	// JudgedWindowStart, on a firing alert: the start of its latest window with a value to
	// judge, breaching or normal (WindowStart or later). While its series has too little
	// traffic to judge, the alert is held, for 24 hours after this window; a restarted
	// alerter holds it for what is left of them.
	JudgedWindowStart time.Time `json:"judged_window_start,omitzero"`
	StartsAt          time.Time `json:"starts_at"`
	EndsAt            time.Time `json:"ends_at,omitzero"`
	At                time.Time `json:"at"`
	Summary           string    `json:"summary,omitempty"`
	// ResolveReason, on a resolved alert only: ResolvedNormal, ResolvedSilent or
	// ResolvedWithinSLA.
	ResolveReason string `json:"resolve_reason,omitempty"`
	// EngineCause, on a TTFT alert of a series served by a host with engine data, says
	// which of the engine's queue time and prefill time grew with it.
	EngineCause *EngineCause `json:"engine_cause,omitempty"`
}

// The causes an EngineCause names.
const (
	CauseQueueTime   = "queue_time"   // requests waited longer in the engine's queue
	CausePrefillTime = "prefill_time" // the engine took longer to compute the prompts
	CauseNeither     = "neither"      // neither grew: the delay is outside the engine's queue and prefill
)

// EngineCause compares an inference engine's queue time and prefill time (p95, ms,
// interpolated within the engine's histogram buckets) in an alert's window with their
// reference: the engine's seasonal baseline where it has enough history, else the median
// of its recent windows.
type EngineCause struct {
	Cause        string  `json:"cause"` // CauseQueueTime, CausePrefillTime or CauseNeither
	Host         string  `json:"host"`
	Engine       string  `json:"engine"` // the endpoint's name in GPUWATCH_ENGINES
	Model        string  `json:"model,omitempty"`
	Reference    string  `json:"reference"` // baseline or recent
	QueueP95Ms   float64 `json:"queue_p95_ms"`
	QueueRefMs   float64 `json:"queue_ref_ms"`
	PrefillP95Ms float64 `json:"prefill_p95_ms"`
	PrefillRefMs float64 `json:"prefill_ref_ms"`
}
