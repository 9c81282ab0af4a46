package nvmlsource

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func TestSampleAllReadings(t *testing.T) {
	srv, devs := h200(t, 2)
	s, err := New(srv, Options{Recheck: time.Minute}, prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	got := s.Sample(context.Background(), t0, nil)
	if len(got) != 2 {
		t.Fatalf("got %d samples, want 2", len(got))
	}
	smp := got[1]
	smp.V, smp.TS, smp.Host = events.Version, t0, "gpu-node-3"
	if err := smp.ValidateAt(t0); err != nil {
		t.Fatalf("sample breaks the contract: %v", err)
	}
	if smp.GPUIndex != 1 || smp.GPUUUID != devs[1].UUID || smp.GPUName != "NVIDIA H200" || smp.Source != events.SourceNVML {
		t.Fatalf("identity: %+v", smp)
	}
	for _, c := range []struct {
		name string
		got  *float64
		want float64
	}{
		{"util_gpu_pct", smp.UtilGPUPct, 100},
		{"util_mem_pct", smp.UtilMemPct, 71},
		{"power_w", smp.PowerW, 689.2},
		{"power_limit_w", smp.PowerLimitW, 700},
		{"energy_j", smp.EnergyJ, 123_456_789.5},
		{"temp_c", smp.TempC, 54},
		{"sm_clock_mhz", smp.SMClockMHz, 1410},
		{"mem_clock_mhz", smp.MemClockMHz, 3201},
	} {
		if c.got == nil || *c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, deref(c.got), c.want)
		}
	}
	if smp.MemUsedBytes == nil || *smp.MemUsedBytes != 120000000000 || *smp.MemTotalBytes != 150754820096 {
		t.Errorf("memory (v2 wanted): %v of %v", deref(smp.MemUsedBytes), deref(smp.MemTotalBytes))
	}
	if smp.ThrottleReasons == nil || *smp.ThrottleReasons != 4 || smp.ECCUncorrected == nil || *smp.ECCUncorrected != 0 {
		t.Errorf("throttle %v, ecc %v", deref(smp.ThrottleReasons), deref(smp.ECCUncorrected))
	}
	if smp.PCIeTxBps != nil || smp.PCIeRxBps != nil {
		t.Errorf("PCIe readings with PCIe turned off: %v %v", deref(smp.PCIeTxBps), deref(smp.PCIeRxBps))
	}
}

func TestUnsupportedReadingsAreAbsentAndRechecked(t *testing.T) {
	srv, devs := h200(t, 1)
	d := devs[0]
	var mu sync.Mutex
	eccSupported := false
	d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if !eccSupported {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return 3, nvml.SUCCESS
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_FUNCTION_NOT_FOUND }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NO_PERMISSION }
	reg := prometheus.NewRegistry()
	s, err := New(srv, Options{Recheck: time.Minute}, reg, discard())
	if err != nil {
		t.Fatal(err)
	}
	smp := s.Sample(context.Background(), t0, nil)[0]
	if smp.ECCUncorrected != nil || smp.TempC != nil {
		t.Fatalf("unsupported readings present: ecc %v temp %v", deref(smp.ECCUncorrected), deref(smp.TempC))
	}
	if smp.MemUsedBytes == nil || *smp.MemUsedBytes != 120600000000 {
		t.Errorf("memory v1 fallback: %v", deref(smp.MemUsedBytes))
	}
	if smp.ThrottleReasons == nil || *smp.ThrottleReasons != 4 {
		t.Errorf("throttle-reasons fallback: %v", deref(smp.ThrottleReasons))
	}
	if smp.PowerW == nil {
		t.Errorf("a supported reading went missing")
	}
	if v := testutil.ToFloat64(s.m.supported.WithLabelValues("0", "ecc_uncorrected")); v != 0 {
		t.Errorf("supported{ecc} = %v, want 0", v)
	}
	if v := testutil.ToFloat64(s.m.supported.WithLabelValues("0", "power_w")); v != 1 {
		t.Errorf("supported{power} = %v, want 1", v)
	}

	// Before the re-check NVML is not asked again; after it, it is, and the reading returns.
	calls := len(d.GetTotalEccErrorsCalls())
	s.Sample(context.Background(), t0.Add(59*time.Second), nil)
	if n := len(d.GetTotalEccErrorsCalls()); n != calls {
		t.Fatalf("ECC asked %d more times before the re-check", n-calls)
	}
	mu.Lock()
	eccSupported = true
	mu.Unlock()
	smp = s.Sample(context.Background(), t0.Add(time.Minute), nil)[0]
	if smp.ECCUncorrected == nil || *smp.ECCUncorrected != 3 {
		t.Fatalf("ECC after the re-check: %v", deref(smp.ECCUncorrected))
	}
	if v := testutil.ToFloat64(s.m.supported.WithLabelValues("0", "ecc_uncorrected")); v != 1 {
		t.Errorf("supported{ecc} after re-check = %v, want 1", v)
	}
	if n := testutil.CollectAndCount(s.m.readErrors); n != 0 {
		t.Errorf("unsupported readings counted as errors: %d series", n)
	}
}

func TestFailingReadingsAreAbsentAndCounted(t *testing.T) {
	tests := []struct {
		name    string
		fault   func(d *server.Device)
		reading string
		code    string
		absent  func(s events.GPUSample) bool
	}{
		{
			name: "power fails",
			fault: func(d *server.Device) {
				d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			reading: "power_w", code: "ERROR_UNKNOWN",
			absent: func(s events.GPUSample) bool { return s.PowerW == nil },
		},
		{
			name: "GPU lost",
			fault: func(d *server.Device) {
				d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
			},
			reading: "energy_j", code: "ERROR_GPU_IS_LOST",
			absent: func(s events.GPUSample) bool { return s.EnergyJ == nil },
		},
		{
			name: "utilisation over 100",
			fault: func(d *server.Device) {
				d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 101}, nvml.SUCCESS }
			},
			reading: "util", code: codeOutOfRange,
			absent: func(s events.GPUSample) bool { return s.UtilGPUPct == nil && s.UtilMemPct == nil },
		},
		{
			name: "more memory used than there is",
			fault: func(d *server.Device) {
				d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{Total: 1, Used: 2}, nvml.SUCCESS }
			},
			reading: "memory", code: codeOutOfRange,
			absent: func(s events.GPUSample) bool { return s.MemUsedBytes == nil && s.MemTotalBytes == nil },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, devs := h200(t, 1)
			tt.fault(devs[0])
			s, err := New(srv, Options{Recheck: time.Minute}, prometheus.NewRegistry(), discard())
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				smp := s.Sample(context.Background(), t0.Add(time.Duration(i)*time.Second), nil)[0]
				if !tt.absent(smp) {
					t.Fatalf("tick %d: failed reading present: %+v", i, smp)
				}
				if smp.TempC == nil || smp.SMClockMHz == nil {
					t.Fatalf("tick %d: one failure took other readings with it", i)
				}
			}
			// A failure is not "unsupported": it is asked again every tick and counted.
			if v := testutil.ToFloat64(s.m.readErrors.WithLabelValues(tt.reading, tt.code)); v != 3 {
				t.Errorf("errors{%s,%s} = %v, want 3", tt.reading, tt.code, v)
			}
		})
	}
}

// TestSlowPCIeNeverDelaysATick blocks every PCIe read until the test ends: samples must
// still come, without PCIe readings, and once the reads answer they carry them.
func TestSlowPCIeNeverDelaysATick(t *testing.T) {
	srv, devs := h200(t, 8)
	release := make(chan struct{})
	for _, d := range devs {
		d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			<-release
			if c == nvml.PCIE_UTIL_TX_BYTES {
				return 1000, nvml.SUCCESS
			}
			return 500, nvml.SUCCESS
		}
	}
	s, err := New(srv, Options{PCIeInterval: 50 * time.Millisecond, Recheck: time.Minute}, prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	got := make(chan []events.GPUSample, 1)
	go func() { got <- s.Sample(ctx, time.Now(), nil) }()
	select {
	case samples := <-got:
		if len(samples) != 8 {
			t.Fatalf("%d samples", len(samples))
		}
		for _, smp := range samples {
			if smp.PCIeTxBps != nil || smp.UtilGPUPct == nil {
				t.Fatalf("GPU %d: PCIe %v util %v", smp.GPUIndex, deref(smp.PCIeTxBps), deref(smp.UtilGPUPct))
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sample waited for a blocked PCIe read")
	}

	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		smp := s.Sample(ctx, time.Now(), nil)[7]
		if smp.PCIeTxBps != nil && smp.PCIeRxBps != nil {
			if *smp.PCIeTxBps != 1000*1024 || *smp.PCIeRxBps != 500*1024 {
				t.Fatalf("PCIe %v %v, want bytes/s", *smp.PCIeTxBps, *smp.PCIeRxBps)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("PCIe readings never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A PCIe reading older than three PCIe intervals is stale and left out.
	if smp := s.Sample(ctx, time.Now().Add(time.Hour), nil)[0]; smp.PCIeTxBps != nil {
		t.Fatal("stale PCIe reading in a sample")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		fault   func(srv *server.Server, devs []*server.Device)
		wantN   int
		wantErr string
	}{
		{name: "all GPUs", fault: func(*server.Server, []*server.Device) {}, wantN: 3},
		{
			name: "a GPU without UUID is left out",
			fault: func(_ *server.Server, d []*server.Device) {
				d[1].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
			},
			wantN: 2,
		},
		{
			name: "a GPU without name keeps its place",
			fault: func(_ *server.Server, d []*server.Device) {
				d[1].GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
			},
			wantN: 3,
		},
		{
			name: "count fails",
			fault: func(srv *server.Server, _ []*server.Device) {
				srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_DRIVER_NOT_LOADED }
			},
			wantErr: "cannot count GPUs through NVML: ERROR_DRIVER_NOT_LOADED",
		},
		{
			name: "no GPU",
			fault: func(srv *server.Server, _ []*server.Device) {
				srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
			},
			wantErr: "NVML lists 0 GPUs and none can be read",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, devs := h200(t, 3)
			tt.fault(srv, devs)
			s, err := New(srv, Options{}, prometheus.NewRegistry(), discard())
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.GPUs() != tt.wantN {
				t.Fatalf("%d GPUs, want %d", s.GPUs(), tt.wantN)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

func TestLoadWithoutLibrary(t *testing.T) {
	_, err := Load("/nonexistent/libnvidia-ml.so.1")
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("err = %v, want ErrLibraryNotFound", err)
	}
	for _, want := range []string{"NVML library not found: ", "/nonexistent/libnvidia-ml.so.1", "No such file", "GPUWATCH_SOURCE=synthetic"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
