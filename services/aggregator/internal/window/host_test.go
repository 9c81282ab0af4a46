package window_test

import (
	"math"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// TestHostWindows: two hosts, one sample a second across two 15 s windows. Disk and
// network means are bytes moved over the seconds covered (a two-second gap weighs
// twice), maxima are the highest rate, memory is mean and max used, min available; a
// reading missing from some samples is averaged over those that had it.
func TestHostWindows(t *testing.T) {
	a := window.NewHost(cfg(t), nil)
	now := t0.Add(time.Minute)
	seq := uint64(0)
	for i := range 30 {
		if i == 7 {
			continue // a missed tick: sample 8 covers two seconds
		}
		dt := 1.0
		if i == 8 {
			dt = 2
		}
		s := &events.HostSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h1",
			MemTotalBytes: u64(1000), MemUsedBytes: u64(uint64(100 + i)), MemAvailableBytes: u64(uint64(900 - i))}
		if i > 0 {
			s.DeltaSeconds = f64(dt)
			s.DiskReadBps, s.DiskWriteBps = f64(float64(1000*i)), f64(10)
		}
		if i%2 == 0 && i > 0 { // network read only on even ticks
			s.NetRxBps, s.NetTxBps = f64(500), f64(float64(i))
		}
		seq++
		a.Add(s, seq, now)
		seq++
		a.Add(&events.HostSample{V: 1, TS: s.TS, Host: "h2"}, seq, now) // a host whose readings all failed
	}
	units := a.Advance(t0.Add(time.Hour))
	if len(units) != 2 {
		t.Fatalf("%d units", len(units))
	}
	byHost := map[string][]events.HostRollup{}
	for _, u := range units {
		for _, r := range a.Rollups(u, nil) {
			byHost[r.Host] = append(byHost[r.Host], r)
		}
		a.Release(u)
	}
	first := byHost["h1"][0]
	if first.Samples != 14 || first.MemSamples != 14 || first.MemTotalBytes != 1000 || first.MemUsedMaxBytes != 114 || first.MemAvailableMinBytes != 886 {
		t.Fatalf("first %+v", first)
	}
	// Used 100..114 without 107: mean (sum(100..114) − 107) / 14.
	if want := (float64(15*107) - 107) / 14; math.Abs(first.MemUsedAvgBytes-want) > 1e-9 {
		t.Fatalf("mem_used_avg %v, want %v", first.MemUsedAvgBytes, want)
	}
	// Disk: ticks 1..14 but 7, tick 8 over two seconds: 14 seconds, bytes Σ 1000·i·dt.
	bytes := 0.0
	for i := 1; i <= 14; i++ {
		switch i {
		case 7:
		case 8:
			bytes += 1000 * 8 * 2
		default:
			bytes += 1000 * float64(i)
		}
	}
	if first.DiskSeconds != 14 || math.Abs(first.DiskReadAvgBps-bytes/14) > 1e-9 || first.DiskReadMaxBps != 14000 || first.DiskWriteAvgBps != 10 {
		t.Fatalf("disk %+v, want read avg %v", first, bytes/14)
	}
	// Network on 2, 4, 6, 8 (two seconds), 10, 12, 14: 8 seconds at 500 B/s.
	if first.NetSeconds != 8 || first.NetRxAvgBps != 500 || first.NetTxMaxBps != 14 || first.NetRxMaxBps != 500 {
		t.Fatalf("net %+v", first)
	}
	second := byHost["h1"][1]
	if second.Samples != 15 || second.DiskSeconds != 15 || second.Kind != events.KindWindow || second.WindowStart != t0.Add(15*time.Second) {
		t.Fatalf("second %+v", second)
	}
	empty := byHost["h2"][0]
	if empty.Samples != 14 || empty.MemSamples != 0 || empty.DiskSeconds != 0 || empty.NetSeconds != 0 || empty.MemUsedAvgBytes != 0 {
		t.Fatalf("host without readings %+v", empty)
	}
}

// TestHostLateSampleIsACorrection: a sample after its window was written goes into a
// correction row, which adds.
func TestHostLateSampleIsACorrection(t *testing.T) {
	a := window.NewHost(cfg(t), nil)
	a.Add(&events.HostSample{V: 1, TS: t0, Host: "h1", MemTotalBytes: u64(10), MemUsedBytes: u64(4), MemAvailableBytes: u64(6)}, 1, t0)
	for _, u := range a.Advance(t0.Add(time.Hour)) {
		a.Flushed([]time.Time{u.Start}, 1, t0.Add(time.Hour))
		a.Release(u)
	}
	if res := a.Add(&events.HostSample{V: 1, TS: t0.Add(time.Second), Host: "h1"}, 2, t0.Add(time.Hour)); res != window.AddedLate {
		t.Fatalf("result %v, want AddedLate", res)
	}
	units := a.Advance(t0.Add(2 * time.Hour))
	if len(units) != 1 {
		t.Fatalf("%d units", len(units))
	}
	rows := a.Rollups(units[0], nil)
	if len(rows) != 1 || rows[0].Kind != events.KindCorrection || rows[0].Samples != 1 {
		t.Fatalf("%+v", rows)
	}
}
