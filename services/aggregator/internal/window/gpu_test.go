package window_test

import (
	"math"
	"strconv"
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

// TestGPUEnergyAfterRestart: an aggregator restarted with the first window stored replays
// the stream from its floor; the first open window's energy is exact. With energy_used_j a
// sample needs no predecessor; with the counter alone the replay's stored-window sample,
// skipped, gives the first replayed sample of the open window its predecessor.
func TestGPUEnergyAfterRestart(t *testing.T) {
	sample := func(i int, used bool) *events.GPUSample { // one a second, 150 J apart
		s := &events.GPUSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", GPUUUID: "GPU-1", PowerW: f64(150), EnergyJ: f64(1000 + 150*float64(i))}
		if used && i > 0 {
			s.EnergyUsedJ = f64(150)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		used bool
		from int // the first second the replay holds (its stream position is second + 1)
	}{
		{"energy_used_j, replay from the open window", true, 15},
		{"energy_used_j, replay from the stored window", true, 10},
		{"counter only, replay from the stored window's last sample", false, 14},
		{"counter only, replay from the stored window", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := window.NewGPU(cfg(t), map[time.Time]uint64{t0: 15}) // seconds 0–14 stored
			for i := tc.from; i < 30; i++ {
				res := a.Add(sample(i, tc.used), uint64(i+1), t0.Add(time.Minute))
				if (i < 15) != (res == window.Skipped) {
					t.Fatalf("second %d: result %v", i, res)
				}
			}
			units := a.Advance(t0.Add(time.Hour))
			if len(units) != 1 {
				t.Fatalf("%d units, want the open window's only", len(units))
			}
			rows := a.Rollups(units[0], nil)
			if len(rows) != 1 || rows[0].Samples != 15 || rows[0].EnergyJ != 15*150 {
				t.Fatalf("rows %+v, want 15 samples and 15 × 150 J", rows)
			}
		})
	}
	// energy_used_j is summed as sent, ahead of the counter: a sample after the publisher's
	// own restart has none and gets the counter's delta.
	a := window.NewGPU(cfg(t), nil)
	a.Add(sample(0, true), 1, t0.Add(time.Minute))
	s := sample(1, true)
	s.EnergyUsedJ = f64(140) // the publisher's delta spans what it saw, not what this aggregator did
	a.Add(s, 2, t0.Add(time.Minute))
	a.Add(sample(2, false), 3, t0.Add(time.Minute))
	rows := a.Rollups(a.Advance(t0.Add(time.Hour))[0], nil)
	if rows[0].EnergyJ != 140+150 {
		t.Fatalf("energy %v, want 140 + 150", rows[0].EnergyJ)
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

// TestGPUPowerIntegrationAcrossAHungRead: a GPU whose reads hung publishes its busy ticks'
// samples (its identity, no readings) before the late sample of the tick it was reading:
// those carry nothing to integrate from, so they do not become its last reading, and the
// late sample's interval is still counted.
func TestGPUPowerIntegrationAcrossAHungRead(t *testing.T) {
	a := window.NewGPU(cfg(t), nil)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	power := func(s int) *events.GPUSample {
		return &events.GPUSample{V: 1, TS: at(s), Host: "h", GPUUUID: "u", PowerW: f64(100)}
	}
	bare := func(s int) *events.GPUSample { return &events.GPUSample{V: 1, TS: at(s), Host: "h", GPUUUID: "u"} }
	// Published order: tick 1, the busy ticks 3 and 4, the late tick 2, then tick 5.
	for i, s := range []*events.GPUSample{power(1), bare(3), bare(4), power(2), power(5)} {
		a.Add(s, uint64(i+1), t0.Add(time.Minute))
	}
	rows := a.Rollups(a.Advance(t0.Add(time.Hour))[0], nil)
	if rows[0].EnergyJ != 400 {
		t.Fatalf("energy %v, want 4 s × 100 W", rows[0].EnergyJ)
	}
}

// TestGPUReadingsBounded: a flood of GPUs that each send one sample (hostile, or a fleet
// far past one aggregator's size) keeps a bounded number of last readings, not one per GPU
// for an hour; the GPUs remembered first still get their counter deltas.
func TestGPUReadingsBounded(t *testing.T) {
	a := window.NewGPU(cfg(t), nil)
	now := t0.Add(time.Minute)
	first := &events.GPUSample{V: 1, TS: t0, Host: "h", GPUUUID: "GPU-first", EnergyJ: f64(1000)}
	a.Add(first, 1, now)
	seq := uint64(2)
	for i := range window.MaxGPUReadings + 1000 {
		a.Add(&events.GPUSample{V: 1, TS: t0, Host: "flood-" + strconv.Itoa(i), GPUUUID: "GPU-0", EnergyJ: f64(1)}, seq, now)
		seq++
	}
	if n := a.Remembered(); n > window.MaxGPUReadings {
		t.Fatalf("%d GPUs remembered, at most %d", n, window.MaxGPUReadings)
	}
	next := &events.GPUSample{V: 1, TS: t0.Add(time.Second), Host: "h", GPUUUID: "GPU-first", EnergyJ: f64(1150)}
	a.Add(next, seq, now)
	var energy float64
	for _, u := range a.Advance(t0.Add(time.Hour)) {
		for _, r := range a.Rollups(u, nil) {
			if r.Host == "h" {
				energy += r.EnergyJ
			}
		}
		a.Release(u)
	}
	if energy != 150 {
		t.Errorf("energy of the GPU remembered first %v, want 150", energy)
	}
}
