// A program for Program's tests: os.Getenv("IN_A_COMMENT") and comment_total, in a comment,
// are not read nor defined.
package main

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/deploy/internal/srcconfig/testdata/prog/lib"
	"github.com/tokenscope/tokenscope/pkg/envconf"
)

const prefix = "PROG_"

type Config struct {
	Addr string     `env:"PROG_ADDR" envDefault:"127.0.0.1:1"`
	Lib  lib.Config `envPrefix:"LIB_"`
}

func (Config) Validate() error { return nil }

func main() {
	_, _ = envconf.Load[Config](os.Getenv)
	_ = os.Getenv("PROG_DIRECT")
	_, _ = os.LookupEnv(prefix + "LOOKUP")
	readAll(os.Getenv)
	environ := map[string]string{}
	_ = environ["PROG_FROM_MAP"]
	_, _ = envconf.Load[Config](func(k string) string { return environ[k] }) // Config's reads

	reg := prometheus.NewRegistry()
	lib.NewMetrics(reg, "prog")
	const ns = "prog"
	c := func(name string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name})
	}
	c("first_total")
	c("second_total")
	prometheus.NewDesc(prometheus.BuildFQName(ns, "sub", "desc"), "", nil, nil)
	prometheus.NewDesc("raw:name", "", nil, nil)
	opts := lib.Options{}
	opts.Namespace = "prog"
	lib.NewThing(opts)
	pair("a", "x")
	pair("b", "y")
}

func readAll(getenv func(string) string) {
	for _, k := range []string{"PROG_RANGED_A", "PROG_RANGED_B"} {
		_ = getenv(k)
	}
}

// pair's namespace and name come from the same call: a_x and b_y, never a_y.
func pair(ns, name string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: name})
}
