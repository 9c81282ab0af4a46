package lib

import "github.com/prometheus/client_golang/prometheus"

type Config struct {
	Level int `env:"LEVEL" envDefault:"3"`
}

type Options struct {
	Namespace string
}

func NewMetrics(reg prometheus.Registerer, namespace string) {
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem, Name: "up"}))
}

func NewThing(o Options) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: o.Namespace, Name: "things_total"})
}

// unused is never called: its metric is not the program's.
func unused(ns string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "never_total"})
}
