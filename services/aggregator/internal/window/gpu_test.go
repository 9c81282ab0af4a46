package window_test

import (
	"math"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

func f64(v float64) *float64 { return &v }
func u64(v uint64) *uint64   { return &v }

func TestGPUWindows(t *testing.T) {
	a := window.NewGPU(cfg(t), nil)
	now := t0.Add(time.Minute)
	energy := 1000.0
	for i := range 30 { // one sample a second across two 15 s windows
		power := 100.0 + float64(i)
		s := &events.GPUSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h1", GPUIndex: 0, GPUUUID: "GPU-1", GPUName: "NVIDIA H200",
			UtilGPUPct: f64(float64(i % 10 * 10)), PowerW: f64(power), EnergyJ: f64(energy), TempC: f64(40 + float64(i)),
			MemUsedBytes: u64(uint64(i) << 30), MemTotalBytes: u64(141 << 30), ThrottleReasons: u64(uint64(1 + 4*(i%2)))}
		energy += 150 // joules between this sample and the next
		a.Add(s, uint64(i+1), now)
	}
	units := a.Advance(t0.Add(time.Hour))
	if len(units) != 2 {
		t.Fatalf("%d units", len(units))
	}
	var rows []events.GPURollup
	for _, u := range units {
		rows = a.Rollups(u, rows)
		a.Release(u)
	}
	first, second := rows[0], rows[1]
	if first.Samples != 15 || second.Samples != 15 {
		t.Fatalf("samples %d %d", first.Samples, second.Samples)
	}
	// The first window gets 14 deltas (its first sample has no predecessor), the second 15:
	// no energy falls between windows.
	if first.EnergyJ != 14*150 || second.EnergyJ != 15*150 {
		t.Fatalf("energy %v %v", first.EnergyJ, second.EnergyJ)
	}
	if first.UtilMax != 90 || math.Abs(first.UtilAvg-550.0/15) > 1e-9 || first.PowerMaxW != 114 || first.TempMaxC != 54 || first.MemUsedMax != 14<<30 {
		t.Fatalf("first %+v", first)
	}
	if first.Throttled != 7 { // odd seconds carry reason 5 (idle + power cap); idle alone is not a throttle
		t.Fatalf("throttled %d", first.Throttled)
	}
}

func TestGPUPowerIntegrationWithoutCounter(t *testing.T) {
	a := window.NewGPU(cfg(t), nil)
	for i := range 5 {
		a.Add(&events.GPUSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", GPUUUID: "u", PowerW: f64(200)}, uint64(i+1), t0.Add(time.Minute))
	}
	units := a.Advance(t0.Add(time.Hour))
	rows := a.Rollups(units[0], nil)
	if rows[0].EnergyJ != 800 {
		t.Fatalf("energy %v, want 4 s × 200 W", rows[0].EnergyJ)
	}
}
