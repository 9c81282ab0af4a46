package nvmlsource

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/exporter"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/sampler"
)

// TestEnergyExactThroughLateAndBusy: a GPU whose energy reading hangs now and then, for
// less than a tick or for several, has every joule its counter moved by published once:
// the energy_used_j of its samples, late and on time, add up to its counter's last value
// less its first; its samples with a counter go out in counter order; each Nats-Msg-Id
// is published once. Once it answers again no read goroutine is left behind.
func TestEnergyExactThroughLateAndBusy(t *testing.T) {
	srv, devs := h200(t, 2)
	var counter atomic.Uint64 // mJ
	counter.Store(123_456_789_500)
	var hangFor atomic.Int64 // how long the next energy read hangs
	devs[1].GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
		if d := time.Duration(hangFor.Load()); d > 0 {
			time.Sleep(d)
		}
		return counter.Add(uint64(1 + rand.IntN(5000))), nvml.SUCCESS
	}
	src, err := New(srv, Options{Recheck: time.Minute, Wait: 20 * time.Millisecond}, prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	pub := &published{}
	smp := sampler.New(src, pub, exporter.New(), sampler.Options{Host: "gpu-node-3", Interval: time.Second}, prometheus.NewRegistry(), discard())
	base := time.Now().Truncate(time.Second).Add(-time.Hour)
	ticks := 0
	tick := func() {
		smp.Tick(context.Background(), base.Add(time.Duration(ticks)*time.Second))
		ticks++
		time.Sleep(10 * time.Millisecond)
	}
	for range 200 {
		switch r := rand.IntN(10); {
		case r < 5:
			hangFor.Store(0)
		case r < 8:
			hangFor.Store(int64(25 * time.Millisecond)) // late, out at the next tick
		default:
			hangFor.Store(int64(time.Duration(50+rand.IntN(100)) * time.Millisecond)) // busy for a few ticks
		}
		tick()
	}
	hangFor.Store(0)
	for range 30 {
		tick()
	}
	var first, last, used float64
	var n int
	ids := map[string]bool{}
	lastTS := time.Time{}
	for _, m := range pub.take() {
		if ids[m.id] {
			t.Errorf("Nats-Msg-Id %q published twice", m.id)
		}
		ids[m.id] = true
		s := m.smp
		if s.GPUIndex != 1 || s.EnergyJ == nil {
			continue
		}
		if !s.TS.After(lastTS) {
			t.Errorf("GPU 1's sample of %s with a counter after one of %s", s.TS, lastTS)
		}
		lastTS = s.TS
		if n == 0 {
			first = *s.EnergyJ
		} else if s.EnergyUsedJ == nil {
			t.Errorf("GPU 1's sample of %s has its counter and no energy_used_j", s.TS)
		} else {
			used += *s.EnergyUsedJ
		}
		last = *s.EnergyJ
		n++
	}
	if n < 50 {
		t.Fatalf("GPU 1 published %d samples with a counter", n)
	}
	if want := last - first; math.Abs(used-want) > 1e-6*want {
		t.Errorf("energy_used_j adds up to %v J, the counter moved %v J", used, want)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before {
		t.Errorf("%d goroutines after the GPU answers again, %d before", g, before)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}
