package scrape

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Why a scrape failed; the sample's error field and the reason label.
var scrapeReasons = []string{"timeout", "connect", "http_status", "too_large", "malformed"}

// Why a part of an exposition was left out.
var dropReasons = []string{"models_over_limit", "bad_value", "histogram_malformed", "histogram_too_many_buckets", "histogram_bounds_mismatch", "invalid_reading", "duplicate_series", "series_over_limit"}

type metrics struct {
	scrapes  *prometheus.CounterVec
	failed   *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	up       *prometheus.GaugeVec
	models   *prometheus.GaugeVec
	duration *prometheus.HistogramVec
	samples  prometheus.Counter
	invalid  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, targets []Target) *metrics {
	fine := []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}
	m := &metrics{
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "engine_scrapes_total", Help: "Scrapes of each engine's /metrics, failed ones included."}, []string{"engine"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "engine_scrape_errors_total", Help: "Scrapes that failed, by engine and reason."}, []string{"engine", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "engine_series_dropped_total", Help: "Parts of an engine's exposition left out of its samples, by reason."}, []string{"engine", "reason"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gpuwatch", Name: "engine_up", Help: "1 when the engine's last scrape succeeded."}, []string{"engine"}),
		models: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gpuwatch", Name: "engine_models", Help: "Models in the engine's last successful scrape."}, []string{"engine"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "gpuwatch", Name: "engine_scrape_duration_seconds", Help: "Time to fetch, parse and turn an exposition into samples.", Buckets: fine}, []string{"engine"}),
		samples: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "engine_samples_total", Help: "Engine samples queued for publishing."}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "engine_samples_invalid_total", Help: "Engine samples not published because they break the contract, by reason."}, []string{"reason"}),
	}
	for _, t := range targets {
		m.scrapes.WithLabelValues(t.Name)
		for _, r := range scrapeReasons {
			m.failed.WithLabelValues(t.Name, r)
		}
		for _, r := range dropReasons {
			m.dropped.WithLabelValues(t.Name, r)
		}
	}
	for _, r := range events.Reasons() {
		m.invalid.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.scrapes, m.failed, m.dropped, m.up, m.models, m.duration, m.samples, m.invalid)
	}
	return m
}
