package window_test

import (
	"fmt"
	"math/rand/v2"
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

// TestGPUPrimedReadingHoldsTheFloor: a replay that has so far only skipped the stored
// window's last sample holds its position: another restart from the floor then must
// replay it again, or the next sample has no previous reading.
func TestGPUPrimedReadingHoldsTheFloor(t *testing.T) {
	b := window.NewGPU(cfg(t), map[time.Time]uint64{t0: 20}) // seconds 0–14 stored, through position 20
	s := &events.GPUSample{V: 1, TS: t0.Add(14 * time.Second), Host: "h", GPUUUID: "GPU-1", EnergyJ: f64(1000)}
	if r := b.Add(s, 15, t0.Add(time.Minute)); r != window.Skipped {
		t.Fatalf("result %v", r)
	}
	for _, u := range b.Advance(t0.Add(time.Minute)) {
		b.Release(u)
	}
	b.Flushed(nil, 15, t0.Add(time.Minute))
	if seq, ok := b.Held(); !ok || seq != 15 {
		t.Fatalf("held %d, %v; want the primed reading's position 15", seq, ok)
	}
	s = &events.GPUSample{V: 1, TS: t0.Add(15 * time.Second), Host: "h", GPUUUID: "GPU-1", EnergyJ: f64(1150)}
	if r := b.Add(s, 16, t0.Add(time.Minute)); r != window.Added {
		t.Fatalf("result %v", r)
	}
	if seq, ok := b.Held(); !ok || seq != 15 {
		t.Fatalf("held %d, %v; want 15, the reading the open window's energy was taken from", seq, ok)
	}
}

// TestGPUEnergyExactlyOnceAcrossRestarts runs GPUs without energy_used_j (a counter only, or
// power only) through windows flushed at random, with crashes at random and restarts from
// the floor and the ledger: the energy of every interval between two samples is counted
// once.
func TestGPUEnergyExactlyOnceAcrossRestarts(t *testing.T) {
	for iter := range 1000 {
		r := rand.New(rand.NewPCG(uint64(iter), 9))
		c := cfg(t)
		c.Window = []time.Duration{5 * time.Second, 15 * time.Second, time.Minute}[iter%3]
		c.Lateness = []time.Duration{5 * time.Second, 30 * time.Second}[iter/3%2]
		power := iter%2 == 1
		gpus := 1 + r.IntN(4)
		var samples []*events.GPUSample
		var clock time.Duration
		for range 20 + r.IntN(100) { // each GPU once a tick, in any order
			clock += time.Duration(200+r.IntN(800)) * time.Millisecond
			for _, g := range r.Perm(gpus) {
				s := &events.GPUSample{V: 1, TS: t0.Add(clock), Host: "h", GPUUUID: fmt.Sprint("GPU-", g)}
				if power {
					s.PowerW = f64(100)
				} else {
					s.EnergyJ = f64(float64(clock.Milliseconds()) * 10) // 10 kW
				}
				samples = append(samples, s)
			}
		}
		var want float64
		prev := map[string]*events.GPUSample{}
		for _, s := range samples {
			if p := prev[s.GPUUUID]; p != nil {
				if power {
					want += 100 * s.TS.Sub(p.TS).Seconds()
				} else {
					want += *s.EnergyJ - *p.EnergyJ
				}
			}
			prev[s.GPUUUID] = s
		}
		n := uint64(len(samples))
		type row struct {
			start   time.Time
			through uint64
		}
		var rows []row
		var got float64
		var floor uint64
		var delay time.Duration // the clock of each start is later
		crashes := 1 + r.IntN(3)
		for proc := 0; ; proc++ {
			done := map[time.Time]uint64{}
			for _, rw := range rows {
				if rw.through > floor {
					done[rw.start] = max(done[rw.start], rw.through)
				}
			}
			a := window.NewGPU(c, done)
			last := floor
			crashAt := n
			if proc < crashes {
				crashAt = floor + uint64(r.IntN(int(n-floor)+1))
			}
			flush := func(now time.Time) {
				var starts []time.Time
				for _, u := range a.Advance(now) {
					for _, rr := range a.Rollups(u, nil) {
						got += rr.EnergyJ
					}
					rows = append(rows, row{u.Start, last})
					starts = append(starts, u.Start)
					a.Release(u)
				}
				a.Flushed(starts, last, now)
				if m, ok := a.Held(); ok {
					floor = max(floor, m-1)
				} else {
					floor = max(floor, last)
				}
			}
			for seq := floor + 1; seq <= n; seq++ {
				now := samples[seq-1].TS.Add(delay)
				a.Add(samples[seq-1], seq, now)
				last = seq
				if r.IntN(10) == 0 {
					flush(now)
				}
				if seq >= crashAt && proc < crashes {
					break
				}
			}
			if proc >= crashes {
				flush(t0.Add(clock + delay + 10*time.Hour))
				break
			}
			delay += time.Duration(r.IntN(60)) * time.Second
		}
		if d := got - want; d > 1e-6 || d < -1e-6 {
			t.Fatalf("iter %d (power only: %v): %v J, want %v", iter, power, got, want)
		}
	}
}
