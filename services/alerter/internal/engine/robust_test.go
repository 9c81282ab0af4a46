package engine_test

import (
	"testing"

	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// TestSimulatedWeekRobust runs the simulated week with median ± k·MAD on every metric.
func TestSimulatedWeekRobust(t *testing.T) {
	rs := rules.NewSet()
	for m := range rs.Default.Dynamic {
		rs.Default.Dynamic[m].Method = rules.MedianMAD
	}
	res := simulate(t, rs, true)
	t.Logf("median/MAD: %s", res)
	found := 0
	for _, in := range incidents {
		if res.detected[in.name] > 0 {
			found++
		} else {
			t.Errorf("incident %q was not detected", in.name)
		}
	}
	if p := float64(res.tp) / float64(max(len(res.firings), 1)); p < 0.9 || float64(found)/float64(len(incidents)) < 0.9 {
		t.Errorf("precision %.2f, recall %d/%d", p, found, len(incidents))
	}
	if clean := simulate(t, rs, false); len(clean.firings) != 0 {
		t.Errorf("clean week: %s", clean)
	}
}
