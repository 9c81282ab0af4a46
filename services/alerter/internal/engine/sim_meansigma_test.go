package engine_test

import (
	"testing"

	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// TestSimulatedWeekMeanSigma runs the simulated week with mean ± k·σ on every metric, the
// method a rules file may still choose: its week of clean history finds every incident too.
func TestSimulatedWeekMeanSigma(t *testing.T) {
	rs := rules.NewSet()
	for m := range rs.Default.Dynamic {
		rs.Default.Dynamic[m].Method = rules.MeanSigma
	}
	res := simulate(t, rs, true)
	t.Logf("mean/σ: %s", res)
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
