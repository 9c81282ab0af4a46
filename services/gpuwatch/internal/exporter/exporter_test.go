package exporter

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

func ptr[T any](v T) *T { return &v }

func TestCollector(t *testing.T) {
	c := New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	full := events.GPUSample{
		TS: time.Now(), Host: "gpu-node-3", GPUIndex: 0, GPUUUID: "GPU-5e6f", GPUName: "NVIDIA H200",
		UtilGPUPct: ptr(100.0), UtilMemPct: ptr(71.0),
		MemUsedBytes: ptr(uint64(120 * mib)), MemTotalBytes: ptr(uint64(140 * mib)),
		PowerW: ptr(689.2), PowerLimitW: ptr(700.0), EnergyJ: ptr(1234.5), TempC: ptr(54.0),
		SMClockMHz: ptr(1410.0), MemClockMHz: ptr(3201.0), PCIeTxBps: ptr(1.2e9), PCIeRxBps: ptr(3.4e8), NVLinkTxBps: ptr(2.5e11), NVLinkRxBps: ptr(2.4e11),
		ThrottleReasons: ptr(uint64(4)), ECCUncorrected: ptr(uint64(0)),
	}
	// A GPU that answers only utilisation: everything else must be absent, not zero.
	sparse := events.GPUSample{TS: time.Now(), Host: "gpu-node-3", GPUIndex: 1, GPUUUID: "GPU-0000", UtilGPUPct: ptr(12.5)}
	c.Update([]events.GPUSample{full, sparse})

	want := `
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB), memory the driver reserves included.
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{Hostname="gpu-node-3",UUID="GPU-5e6f",gpu="0",modelName="NVIDIA H200"} 20
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-3",UUID="GPU-0000",gpu="1",modelName=""} 12.5
DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-3",UUID="GPU-5e6f",gpu="0",modelName="NVIDIA H200"} 100
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{Hostname="gpu-node-3",UUID="GPU-5e6f",gpu="0",modelName="NVIDIA H200"} 689.2
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since the driver loaded (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="gpu-node-3",UUID="GPU-5e6f",gpu="0",modelName="NVIDIA H200"} 1.2345e+06
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_FREE"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c); n != len(readings)+1 {
		t.Fatalf("%d series, want %d for the full GPU and 1 for the sparse one", n, len(readings)+1)
	}

	// A GPU that stops reporting disappears.
	c.Update([]events.GPUSample{sparse})
	if n := testutil.CollectAndCount(c); n != 1 {
		t.Fatalf("%d series after the full GPU left, want 1", n)
	}
}

func BenchmarkCollect(b *testing.B) {
	c := New()
	samples := make([]events.GPUSample, 8)
	for i := range samples {
		samples[i] = events.GPUSample{GPUIndex: i, GPUUUID: "GPU-x", Host: "h", UtilGPUPct: ptr(50.0), PowerW: ptr(400.0), EnergyJ: ptr(1e6)}
	}
	c.Update(samples)
	b.ReportAllocs()
	for b.Loop() {
		ch := make(chan prometheus.Metric, 64)
		c.Collect(ch)
		close(ch)
		for range ch {
		}
	}
}
