package nvmlsource

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	readErrors *prometheus.CounterVec
	supported  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, gpus int) *metrics {
	m := &metrics{
		readErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuwatch", Subsystem: "nvml", Name: "reading_errors_total",
			Help: "NVML readings that failed (left out of their sample), by reading and NVML return code.",
		}, []string{"reading", "code"}),
		supported: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gpuwatch", Subsystem: "nvml", Name: "reading_supported",
			Help: "1 when the GPU answers the reading, 0 when NVML says it is not supported (re-checked every GPUWATCH_RECHECK).",
		}, []string{"gpu", "reading"}),
	}
	if reg != nil {
		reg.MustRegister(m.readErrors, m.supported)
	}
	return m
}
