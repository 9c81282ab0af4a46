package nvmlsource

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/exporter"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/hostsource"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/sampler"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/scrape"
)

// BenchmarkSampler1Hz8GPUs runs gpuwatch's tick loop at 1 Hz over 8 mock H200s whose PCIe
// reads take 21 ms each; one op is one tick. It reports the worst tick jitter (how late
// Sample began after the tick's wall-clock time) and the CPU the whole process used, as a
// share of one core. The goals: jitter ≤ 10 ms, CPU ≤ 1 % of a core.
// Run it with -benchtime=10x for ten ticks.
func BenchmarkSampler1Hz8GPUs(b *testing.B) {
	srv, devs := h200(b, 8)
	for _, d := range devs {
		d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			time.Sleep(21 * time.Millisecond)
			return 1000, nvml.SUCCESS
		}
	}
	src, err := New(srv, Options{PCIeInterval: time.Second, Recheck: 5 * time.Minute}, prometheus.NewRegistry(), discard())
	if err != nil {
		b.Fatal(err)
	}
	timed := &timedSource{src: src, want: b.N, done: make(chan struct{})}
	smp := sampler.New(timed, nopPublisher{}, exporter.New(), sampler.Options{Host: "bench", Interval: time.Second},
		prometheus.NewRegistry(), discard())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = src.Run(ctx) })
	// Let the PCIe goroutines and the first tick settle before measuring.
	time.Sleep(100 * time.Millisecond)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, wall0 := cpuTime(b), time.Now()
	wg.Go(func() { _ = smp.Run(ctx) })
	<-timed.done
	cpu, wall := cpuTime(b)-cpu0, time.Since(wall0)
	b.StopTimer()
	cancel()
	wg.Wait()
	b.ReportMetric(float64(timed.maxLate.Microseconds())/1000, "max-jitter-ms")
	b.ReportMetric(float64(timed.sumLate.Microseconds())/1000/float64(timed.n), "mean-jitter-ms")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%core")
	b.ReportMetric(float64(timed.pcie)/float64(timed.n), "pcie-readings/tick")
}

// timedSource records how late each tick's Sample begins and stops the benchmark after
// want ticks.
type timedSource struct {
	src     *Source
	want    int
	n       int
	pcie    int
	maxLate time.Duration
	sumLate time.Duration
	done    chan struct{}
}

func (t *timedSource) Sample(ctx context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample {
	late := time.Since(now)
	t.sumLate += late
	if late > t.maxLate {
		t.maxLate = late
	}
	dst = t.src.Sample(ctx, now, dst)
	for _, s := range dst {
		if s.PCIeTxBps != nil {
			t.pcie++
		}
	}
	if t.n++; t.n == t.want {
		close(t.done)
	}
	return dst
}

// Late passes on the source's late samples (none here: every read answers in time).
func (t *timedSource) Late(dst []events.GPUSample) []events.GPUSample { return t.src.Late(dst) }

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, string, []byte) bool { return true }

// BenchmarkSample8GPUs is the work of one tick over 8 mock GPUs, PCIe aside.
func BenchmarkSample8GPUs(b *testing.B) {
	srv, _ := h200(b, 8)
	src, err := New(srv, Options{Recheck: 5 * time.Minute}, nil, discard())
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]events.GPUSample, 0, 8)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Second)
		dst = src.Sample(context.Background(), now, dst[:0])
	}
}

// BenchmarkAgent1Hz8GPUs8Engines is gpuwatch as a GPU host's agent at 1 Hz: the tick loop
// over 8 mock H200s (PCIe reads of 21 ms on their own goroutines, NVLink counters), the
// host sample from this machine's /proc and /sys, and 8 vLLM engines scraped on the same
// tick, each serving a 297-series exposition (33 KB) over loopback HTTP from this process.
// One op is one tick; -benchtime=10x runs ten. It reports the CPU the whole process used
// (the 8 HTTP servers included) as a share of one core; the goal is ≤ 2 %.
func BenchmarkAgent1Hz8GPUs8Engines(b *testing.B) {
	body, err := os.ReadFile("../scrape/testdata/vllm_300.prom")
	if err != nil {
		b.Fatal(err)
	}
	var targets []scrape.Target
	for i := range 8 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write(body)
		}))
		b.Cleanup(srv.Close)
		targets = append(targets, scrape.Target{Engine: events.EngineVLLM, Name: fmt.Sprint("vllm", i), URL: srv.URL})
	}
	gpus, devs := h200(b, 8)
	for _, d := range devs {
		d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			time.Sleep(21 * time.Millisecond)
			return 1000, nvml.SUCCESS
		}
	}
	src, err := New(gpus, Options{PCIeInterval: time.Second, Recheck: 5 * time.Minute}, prometheus.NewRegistry(), discard())
	if err != nil {
		b.Fatal(err)
	}
	host, err := hostsource.New(hostsource.Options{}, prometheus.NewRegistry(), discard())
	if err != nil {
		b.Skipf("no procfs here: %v", err)
	}
	pub := &countingPublisher{}
	timed := &timedSource{src: src, want: b.N, done: make(chan struct{})}
	smp := sampler.New(timed, pub, exporter.New(), sampler.Options{Host: "bench", Interval: time.Second, HostReader: host},
		prometheus.NewRegistry(), discard())
	scr := scrape.New(targets, pub, scrape.Options{Host: "bench", Interval: time.Second, Timeout: 800 * time.Millisecond,
		MaxBytes: 4 << 20, MaxModels: 16}, prometheus.NewRegistry(), discard())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = src.Run(ctx) })
	time.Sleep(100 * time.Millisecond)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, wall0 := cpuTime(b), time.Now()
	wg.Go(func() { _ = smp.Run(ctx) })
	wg.Go(func() { _ = scr.Run(ctx) })
	<-timed.done
	time.Sleep(500 * time.Millisecond) // the last tick's scrapes, begun with it
	cpu, wall := cpuTime(b)-cpu0, time.Since(wall0)
	b.StopTimer()
	cancel()
	wg.Wait()
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%core")
	b.ReportMetric(float64(pub.n.Load())/float64(timed.n), "msgs/tick")
	b.ReportMetric(float64(timed.maxLate.Microseconds())/1000, "max-jitter-ms")
}

type countingPublisher struct{ n atomic.Int64 }

func (p *countingPublisher) Publish(string, string, []byte) bool { p.n.Add(1); return true }
