package synthetic

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var start = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func newSource(t testing.TB, seed uint64, host string) *Source {
	t.Helper()
	s, err := New(Options{GPUs: 2, Seed: seed, Period: 10 * time.Minute, Host: host, Start: start})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDeterministic(t *testing.T) {
	now := start.Add(1234 * time.Second)
	a := newSource(t, 7, "h").Sample(context.Background(), now, nil)
	b := newSource(t, 7, "h").Sample(context.Background(), now, nil)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, start and now gave different samples")
	}
	c := newSource(t, 8, "h").Sample(context.Background(), now, nil)
	if reflect.DeepEqual(a, c) {
		t.Fatal("another seed gave the same samples")
	}
	d := newSource(t, 7, "other-host").Sample(context.Background(), now, nil)
	if a[0].GPUUUID == d[0].GPUUUID || a[0].GPUUUID == a[1].GPUUUID {
		t.Fatalf("UUIDs collide: %s %s %s", a[0].GPUUUID, a[1].GPUUUID, d[0].GPUUUID)
	}
}

// TestModel walks two periods second by second and checks the model's promises.
func TestModel(t *testing.T) {
	s := newSource(t, 1, "h")
	var prev []events.GPUSample
	var intPower [2]float64
	var peakPower, peakTemp [2]time.Duration
	var maxPower, maxTemp [2]float64
	throttled := 0
	for sec := 0; sec <= 1200; sec++ {
		now := start.Add(time.Duration(sec) * time.Second)
		cur := s.Sample(context.Background(), now, nil)
		for i := range cur {
			smp := cur[i]
			smp.V, smp.TS, smp.Host = events.Version, now, "h"
			if err := smp.ValidateAt(now); err != nil {
				t.Fatalf("t=%ds GPU %d: %v", sec, i, err)
			}
			if sec > 0 {
				intPower[i] += (*prev[i].PowerW + *smp.PowerW) / 2
				if *smp.EnergyJ < *prev[i].EnergyJ {
					t.Fatalf("t=%ds GPU %d: energy fell from %v to %v", sec, i, *prev[i].EnergyJ, *smp.EnergyJ)
				}
			}
			if *smp.PowerW > limitW || *smp.PowerW < idleW {
				t.Fatalf("t=%ds: power %v outside [%v, %v]", sec, *smp.PowerW, idleW, limitW)
			}
			if *smp.ThrottleReasons == reasonSWPCap {
				throttled++
				if *smp.SMClockMHz >= maxSMClock {
					t.Fatalf("t=%ds: throttled at full clock", sec)
				}
			}
			if sec <= 600 { // first period: find the peaks
				if *smp.PowerW > maxPower[i] {
					maxPower[i], peakPower[i] = *smp.PowerW, time.Duration(sec)*time.Second
				}
				if *smp.TempC > maxTemp[i] {
					maxTemp[i], peakTemp[i] = *smp.TempC, time.Duration(sec)*time.Second
				}
			}
		}
		prev = cur
	}
	for i := range prev {
		// Energy is power's integral: compare with the trapezoid sum over 1200 s.
		if got := *prev[i].EnergyJ; math.Abs(got-intPower[i])/intPower[i] > 0.001 {
			t.Errorf("GPU %d: energy %v J, integral of power %v J", i, got, intPower[i])
		}
		if peakTemp[i] <= peakPower[i] {
			t.Errorf("GPU %d: temperature peaks at %v, not after power (%v)", i, peakTemp[i], peakPower[i])
		}
	}
	if throttled == 0 {
		t.Error("the model never reached the power cap")
	}
}

func TestNewRejects(t *testing.T) {
	for _, o := range []Options{{GPUs: 0, Period: time.Minute}, {GPUs: 1, Period: time.Millisecond}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func BenchmarkSample(b *testing.B) {
	s := newSource(b, 1, "h")
	dst := make([]events.GPUSample, 0, 8)
	now := start
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Second)
		dst = s.Sample(context.Background(), now, dst[:0])
	}
}
