package sampler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

type metrics struct {
	ticks    prometheus.Counter
	skipped  prometheus.Counter
	lateness prometheus.Histogram
	duration prometheus.Histogram
	samples  prometheus.Counter
	invalid  *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	gpus     prometheus.Gauge

	hostSamples prometheus.Counter
	hostInvalid *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	fine := []float64{.0001, .0005, .001, .002, .005, .01, .02, .05, .1, .5, 1}
	m := &metrics{
		ticks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "ticks_total", Help: "Ticks taken: each samples every GPU once."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "ticks_skipped_total", Help: "Ticks skipped because the tick before ran past them."}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpuwatch", Name: "tick_lateness_seconds", Help: "How late a tick woke after its wall-clock time (jitter).", Buckets: fine}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpuwatch", Name: "tick_duration_seconds", Help: "How long a tick took to read, encode and queue every GPU's sample.", Buckets: fine}),
		samples: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "samples_total", Help: "Samples queued for publishing."}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "samples_invalid_total", Help: "Samples not published because they break the contract, by reason."},
			[]string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "readings_dropped_total", Help: "GPU and host readings left out of their sample because they break the contract (the sample is published with the rest), by reason."},
			[]string{"reason"}),
		gpus: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "gpuwatch", Name: "gpus", Help: "GPUs in the last tick."}),
		hostSamples: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "host_samples_total", Help: "Host samples queued for publishing."}),
		hostInvalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Name: "host_samples_invalid_total", Help: "Host samples not published because they break the contract, by reason."},
			[]string{"reason"}),
	}
	for _, r := range events.Reasons() {
		m.invalid.WithLabelValues(r)
		m.dropped.WithLabelValues(r)
		m.hostInvalid.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.ticks, m.skipped, m.lateness, m.duration, m.samples, m.invalid, m.dropped, m.gpus, m.hostSamples, m.hostInvalid)
	}
	return m
}
