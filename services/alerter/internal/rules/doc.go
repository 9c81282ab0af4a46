// Package rules holds the alerter's rules: the metrics it watches, the dynamic-threshold,
// static SLA and saturation rules with their built-in defaults (common SLA
// thresholds for interactive LLM services), and the YAML rules file that overrides them per scene. A bad file is
// rejected with the rule and field named, so the alerter stops at start instead of
// alerting on a rule nobody meant.
package rules
