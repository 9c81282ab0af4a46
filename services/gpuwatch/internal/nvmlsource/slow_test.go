package nvmlsource

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/exporter"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/sampler"
)

// hang makes every NVML call of d but PCIe take callTime while on is set (a GPU falling
// off the bus, an XID storm): each call sleeps until callTime has passed or recover is
// closed. It counts the calls in flight at once.
type hang struct {
	on       atomic.Bool
	callTime time.Duration
	recover  chan struct{}
	inFlight atomic.Int32
	maxPar   atomic.Int32
}

func (h *hang) call() {
	if !h.on.Load() {
		return
	}
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for {
		m := h.maxPar.Load()
		if n <= m || h.maxPar.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-time.After(h.callTime):
	case <-h.recover:
	}
}

func (h *hang) install(d *server.Device) {
	util, mem, power, limit := d.GetUtilizationRatesFunc, d.GetMemoryInfo_v2Func, d.GetPowerUsageFunc, d.GetEnforcedPowerLimitFunc
	energy, temp, clock, reasons := d.GetTotalEnergyConsumptionFunc, d.GetTemperatureFunc, d.GetClockInfoFunc, d.GetCurrentClocksEventReasonsFunc
	ecc, fields := d.GetTotalEccErrorsFunc, d.GetFieldValuesFunc
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { h.call(); return util() }
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { h.call(); return mem() }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { h.call(); return power() }
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { h.call(); return limit() }
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { h.call(); return energy() }
	d.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) { h.call(); return temp(s) }
	d.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) { h.call(); return clock(c) }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { h.call(); return reasons() }
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		h.call()
		return ecc(t, c)
	}
	d.GetFieldValuesFunc = func(v []nvml.FieldValue) nvml.Return { h.call(); return fields(v) }
}

// published records what the sampler queues, and when.
type published struct {
	mu   sync.Mutex
	msgs []publishedMsg
}

type publishedMsg struct {
	id  string
	smp events.GPUSample
	at  time.Time
}

func (p *published) Publish(_, msgID string, data []byte) bool {
	var smp events.GPUSample
	if err := events.UnmarshalGPUSample(data, &smp); err != nil {
		panic(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, publishedMsg{id: msgID, smp: smp, at: time.Now()})
	return true
}

func (p *published) take() []publishedMsg {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.msgs
	p.msgs = nil
	return m
}

// TestSlowGPUDelaysNoOtherGPU hangs GPU 3 of 8 (5 s per NVML call, a dozen calls a read):
// at every tick the other 7 GPUs' samples are queued at once, GPU 3 is read once however
// many ticks its read takes, its ticks are counted and carry a sample without readings, and
// once it answers its late sample goes out with the time of its tick and every GPU is on
// time again.
func TestSlowGPUDelaysNoOtherGPU(t *testing.T) {
	srv, devs := h200(t, 8)
	h := &hang{callTime: 5 * time.Second, recover: make(chan struct{})}
	h.install(devs[3])
	reg := prometheus.NewRegistry()
	src, err := New(srv, Options{Recheck: time.Minute, Wait: 100 * time.Millisecond}, reg, discard())
	if err != nil {
		t.Fatal(err)
	}
	pub := &published{}
	exp := exporter.New()
	smp := sampler.New(src, pub, exp, sampler.Options{Host: "gpu-node-3", Interval: time.Second}, reg, discard())
	ctx := context.Background()
	base := time.Now().Truncate(time.Second).Add(-time.Minute)
	at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Second).UTC() }

	// tick runs one tick; it must be over well within the interval, whatever GPU 3 does.
	tick := func(i int) []publishedMsg {
		t.Helper()
		began := time.Now()
		done := make(chan struct{})
		go func() { smp.Tick(ctx, at(i)); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			close(h.recover) // let the tick end, so the test does
			<-done
			t.Fatalf("tick %d waited %s for the slow GPU", i, time.Since(began))
		}
		if took := time.Since(began); took > 600*time.Millisecond {
			t.Errorf("tick %d took %s", i, took)
		}
		return pub.take()
	}
	byGPU := func(msgs []publishedMsg) map[int][]events.GPUSample {
		m := map[int][]events.GPUSample{}
		for _, msg := range msgs {
			m[msg.smp.GPUIndex] = append(m[msg.smp.GPUIndex], msg.smp)
		}
		return m
	}
	onTime := func(i int, got map[int][]events.GPUSample, gpu int) {
		t.Helper()
		s := got[gpu]
		if len(s) != 1 || !s[0].TS.Equal(at(i)) || s[0].PowerW == nil || s[0].UtilGPUPct == nil {
			t.Fatalf("tick %d: GPU %d's samples %+v, want one of the tick with its readings", i, gpu, s)
		}
	}

	for i := range 2 {
		got := byGPU(tick(i))
		for g := range 8 {
			onTime(i, got, g)
		}
	}

	h.on.Store(true)
	const hung = 6
	for i := 2; i < 2+hung; i++ {
		got := byGPU(tick(i))
		for g := range 8 {
			if g != 3 {
				onTime(i, got, g)
			}
		}
		s := got[3]
		switch {
		case i == 2 && len(s) != 0: // the tick its read began at: no sample yet
			t.Fatalf("tick %d: GPU 3 published %+v before its read finished", i, s)
		case i > 2 && (len(s) != 1 || !s[0].TS.Equal(at(i)) || s[0].PowerW != nil || s[0].EnergyJ != nil || s[0].GPUUUID != devs[3].UUID):
			t.Fatalf("tick %d: GPU 3's samples %+v, want one of the tick without readings", i, s)
		}
	}
	if n := h.maxPar.Load(); n != 1 {
		t.Errorf("GPU 3 had %d NVML calls in flight at once, want 1", n)
	}
	if v := testutil.ToFloat64(src.m.lagging.WithLabelValues("3", lagLate)); v != 1 {
		t.Errorf("lagging{gpu=3,late} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(src.m.lagging.WithLabelValues("3", lagBusy)); v != hung-1 {
		t.Errorf("lagging{gpu=3,busy} = %v, want %d", v, hung-1)
	}
	if v := testutil.ToFloat64(src.m.lagging.WithLabelValues("2", lagLate)) + testutil.ToFloat64(src.m.lagging.WithLabelValues("2", lagBusy)); v != 0 {
		t.Errorf("GPU 2 counted lagging %v times", v)
	}
	// /metrics shows GPU 3 without readings while it hangs, the others as they are.
	if n := testutil.CollectAndCount(exp, "DCGM_FI_DEV_POWER_USAGE"); n != 7 {
		t.Errorf("%d GPUs with power on /metrics, want 7", n)
	}

	// GPU 3 answers: its read of tick 2 finishes, and goes out with tick 2's time at the
	// next tick, energy and all; from the tick after, it is on time again.
	h.on.Store(false)
	close(h.recover)
	deadline := time.Now().Add(5 * time.Second)
	i := 2 + hung
	for {
		msgs := tick(i)
		got := byGPU(msgs)
		for g := range 8 {
			if g != 3 {
				onTime(i, got, g)
			}
		}
		if j := slices.IndexFunc(got[3], func(s events.GPUSample) bool { return s.TS.Equal(at(2)) }); j >= 0 {
			late := got[3][j]
			if late.PowerW == nil || late.EnergyJ == nil || late.UtilGPUPct == nil {
				t.Fatalf("GPU 3's late sample lacks readings: %+v", late)
			}
			for _, msg := range msgs {
				if msg.smp.GPUIndex == 3 && msg.smp.TS.Equal(at(2)) && !strings.HasSuffix(msg.id, string(events.AppendTime(nil, at(2)))) {
					t.Errorf("late sample's Nats-Msg-Id %q is not its tick's", msg.id)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GPU 3's late sample never came")
		}
		i++
	}
	lagging := testutil.ToFloat64(src.m.lagging.WithLabelValues("3", lagLate)) + testutil.ToFloat64(src.m.lagging.WithLabelValues("3", lagBusy))
	for j := i + 1; j < i+4; j++ {
		got := byGPU(tick(j))
		if j > i+1 { // the tick after the late one may still be waiting for no GPU 3
			for g := range 8 {
				onTime(j, got, g)
			}
		}
	}
	after := testutil.ToFloat64(src.m.lagging.WithLabelValues("3", lagLate)) + testutil.ToFloat64(src.m.lagging.WithLabelValues("3", lagBusy))
	if after > lagging+1 {
		t.Errorf("GPU 3 still lagging after it recovered: %v more ticks", after-lagging)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWithAHungGPU: shutting down while a GPU's reads (the tick's and PCIe's) are
// stuck in NVML ends Run at once and Close within its bound, and does not shut NVML down
// under a call in flight.
func TestCloseWithAHungGPU(t *testing.T) {
	srv, devs := h200(t, 2)
	h := &hang{callTime: time.Minute, recover: make(chan struct{})}
	defer close(h.recover)
	h.install(devs[1])
	pcie := devs[1].GetPcieThroughputFunc
	devs[1].GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) { h.call(); return pcie(c) }
	h.on.Store(true)
	var shutdowns atomic.Int32
	srv.ShutdownFunc = func() nvml.Return { shutdowns.Add(1); return nvml.SUCCESS }
	src, err := New(srv, Options{PCIeInterval: 50 * time.Millisecond, Recheck: time.Minute, Wait: 50 * time.Millisecond},
		prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- src.Run(ctx) }()
	if got := src.Sample(ctx, t0, nil); len(got) != 1 || got[0].GPUIndex != 0 {
		t.Fatalf("samples %+v, want GPU 0's alone", got)
	}
	time.Sleep(100 * time.Millisecond) // the PCIe loops' first reads
	cancel()
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatal("Run waits for a PCIe read stuck in NVML")
	}
	began := time.Now()
	err = src.Close()
	if err == nil || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(began); took > closeWait+time.Second {
		t.Errorf("Close took %s", took)
	}
	if n := shutdowns.Load(); n != 0 {
		t.Errorf("NVML shut down %d times under a call in flight", n)
	}
}
