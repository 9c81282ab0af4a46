package window_test

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// TestGPUEnergyAfterRestartFromTheFloor: a GPU without energy_used_j gets each sample's
// energy from its previous one. Restarted from the floor that the windows it holds give
// (the position before the oldest one held), the replay must still bring the previous
// sample of the first open window's first one, or that interval's energy is lost.
func TestGPUEnergyAfterRestartFromTheFloor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sample func(i int) *events.GPUSample // one a second, 150 J apart
	}{
		{"counter", func(i int) *events.GPUSample {
			return &events.GPUSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", GPUUUID: "GPU-1", EnergyJ: f64(1000 + 150*float64(i))}
		}},
		{"power", func(i int) *events.GPUSample {
			return &events.GPUSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", GPUUUID: "GPU-1", PowerW: f64(150)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Before the restart: seconds 0–19 (positions 1–20); the window at t0 is stored.
			a := window.NewGPU(cfg(t), nil)
			for i := range 20 {
				a.Add(tc.sample(i), uint64(i+1), t0.Add(time.Duration(i)*time.Second))
			}
			now := t0.Add(50 * time.Second)
			units := a.Advance(now)
			if len(units) != 1 || !units[0].Start.Equal(t0) {
				t.Fatalf("%d units closed, want the one at t0", len(units))
			}
			a.Release(units[0])
			a.Flushed([]time.Time{t0}, 20, now)
			minSeq, ok := a.Held()
			if !ok {
				t.Fatal("nothing held")
			}
			floor := minSeq - 1
			// After: the replay from the floor.
			b := window.NewGPU(cfg(t), map[time.Time]uint64{t0: 20})
			for i := int(floor); i < 30; i++ {
				b.Add(tc.sample(i), uint64(i+1), t0.Add(time.Minute))
			}
			units = b.Advance(t0.Add(time.Hour))
			if len(units) != 1 {
				t.Fatalf("%d units, want the open window's only", len(units))
			}
			rows := b.Rollups(units[0], nil)
			if len(rows) != 1 || rows[0].Samples != 15 || rows[0].EnergyJ != 15*150 {
				t.Fatalf("replayed from position %d: %d samples, %v J, want 15 and 15 × 150 J", floor+1, rows[0].Samples, rows[0].EnergyJ)
			}
		})
	}
}
