package lib

import (
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestOnly(t *testing.T) {
	_ = os.Getenv("TEST_ONLY")
	prometheus.NewCounter(prometheus.CounterOpts{Name: "test_only_total"})
}
