package events

import "time"

// Alert states.
const (
	AlertFiring   = "firing"
	AlertResolved = "resolved"
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
	Value       float64           `json:"value"`
	Threshold   float64           `json:"threshold"`
	// Baseline of a dynamic rule: mean and σ, or median and MAD for the robust variant.
	BaselineMethod string    `json:"baseline_method,omitempty"`
	BaselineCenter float64   `json:"baseline_center,omitempty"`
	BaselineSpread float64   `json:"baseline_spread,omitempty"`
	WindowStart    time.Time `json:"window_start"`
	StartsAt       time.Time `json:"starts_at"`
	EndsAt         time.Time `json:"ends_at,omitzero"`
	At             time.Time `json:"at"`
	Summary        string    `json:"summary,omitempty"`
}
