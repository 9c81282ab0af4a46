package nvmlsource

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	readErrors   *prometheus.CounterVec
	supported    *prometheus.GaugeVec
	lagging      *prometheus.CounterVec
	readDuration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, gpus []*gpu) *metrics {
	m := &metrics{
		readErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Subsystem: "nvml", Name: "reading_errors_total",
			Help: "NVML readings that failed (left out of their sample), by reading and NVML return code.",
		}, []string{"reading", "code"}),
		supported: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gpuwatch", Subsystem: "nvml", Name: "reading_supported",
			Help: "1 when the GPU answers the reading, 0 when NVML says it is not supported (re-checked every GPUWATCH_RECHECK).",
		}, []string{"gpu", "reading"}),
		lagging: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Subsystem: "nvml", Name: "ticks_lagging_total",
			Help: "Ticks at which a GPU's sample was not read in time, by GPU and reason: late (its read was not done in time; the sample goes out at a later tick), busy (an earlier tick's read was still running; the sample has no readings).",
		}, []string{"gpu", "reason"}),
		readDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "gpuwatch", Subsystem: "nvml", Name: "read_duration_seconds",
			Help:    "How long one read of a GPU's readings (PCIe aside) took.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
	}
	for _, g := range gpus {
		for _, r := range [...]string{lagLate, lagBusy} {
			m.lagging.WithLabelValues(g.label, r)
		}
	}
	if reg != nil {
		reg.MustRegister(m.readErrors, m.supported, m.lagging, m.readDuration)
	}
	return m
}
