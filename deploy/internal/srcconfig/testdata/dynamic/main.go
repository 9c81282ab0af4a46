// A program whose variable and metric names are made at run time.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

func main() {
	_ = os.Getenv(fmt.Sprint("MADE", "_UP"))
	prometheus.NewCounter(prometheus.CounterOpts{Name: strings.ToLower("MADE_total")})
	f := counter
	f("passed_total")
}

func counter(name string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name})
}
