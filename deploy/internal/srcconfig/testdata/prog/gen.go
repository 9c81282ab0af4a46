//go:build ignore

// A generator run by hand, part of no build: its metric and variable are not the program's.
package main

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"
)

func main() {
	_ = os.Getenv("GENERATOR_ONLY")
	prometheus.NewCounter(prometheus.CounterOpts{Name: "generator_total"})
}
