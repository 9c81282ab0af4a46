package exporter

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

const mib = 1 << 20

// labels are dcgm-exporter's, spelled as it spells them.
var labels = []string{"gpu", "UUID", "modelName", "Hostname"}

// reading is one exported metric: its description and how to find its value in a sample.
type reading struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(s *events.GPUSample) (float64, bool)
}

func f64(p *float64, scale float64) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return *p * scale, true
}

func u64(p *uint64, scale float64) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return float64(*p) * scale, true
}

func gauge(name, help string, value func(s *events.GPUSample) (float64, bool)) reading {
	return reading{prometheus.NewDesc(name, help, labels, nil), prometheus.GaugeValue, value}
}

func counter(name, help string, value func(s *events.GPUSample) (float64, bool)) reading {
	return reading{prometheus.NewDesc(name, help, labels, nil), prometheus.CounterValue, value}
}

var readings = []reading{
	gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.UtilGPUPct, 1) }),
	gauge("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.UtilMemPct, 1) }),
	gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
		func(s *events.GPUSample) (float64, bool) { return u64(s.MemUsedBytes, 1.0/mib) }),
	gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB), memory the driver reserves included.",
		func(s *events.GPUSample) (float64, bool) {
			if s.MemUsedBytes == nil || s.MemTotalBytes == nil {
				return 0, false
			}
			return float64(*s.MemTotalBytes-*s.MemUsedBytes) / mib, true
		}),
	gauge("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).",
		func(s *events.GPUSample) (float64, bool) { return u64(s.MemTotalBytes, 1.0/mib) }),
	gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.PowerW, 1) }),
	gauge("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "Effective power limit the driver enforces (in W).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.PowerLimitW, 1) }),
	counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since the driver loaded (in mJ).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.EnergyJ, 1000) }),
	gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.TempC, 1) }),
	gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.SMClockMHz, 1) }),
	gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.MemClockMHz, 1) }),
	gauge("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe transmit throughput (in B/s).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.PCIeTxBps, 1) }),
	gauge("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe receive throughput (in B/s).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.PCIeRxBps, 1) }),
	gauge("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink transmit throughput of data, every link (in B/s).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.NVLinkTxBps, 1) }),
	gauge("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink receive throughput of data, every link (in B/s).",
		func(s *events.GPUSample) (float64, bool) { return f64(s.NVLinkRxBps, 1) }),
	gauge("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock event (throttle) reasons, NVML's bitmask.",
		func(s *events.GPUSample) (float64, bool) { return u64(s.ThrottleReasons, 1) }),
	counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Uncorrectable (double-bit) ECC errors since the driver loaded.",
		func(s *events.GPUSample) (float64, bool) { return u64(s.ECCUncorrected, 1) }),
}

// Collector holds the latest sample of every GPU and exports it when scraped.
type Collector struct {
	mu     sync.Mutex
	latest []events.GPUSample
}

// New returns an empty Collector; register it on the service's registry.
func New() *Collector { return &Collector{} }

// Update replaces the exported samples with samples, one per GPU. A GPU missing from
// samples disappears from /metrics, as dcgm-exporter drops a GPU it no longer sees.
func (c *Collector) Update(samples []events.GPUSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.latest = append(c.latest[:0], samples...)
}

// Describe sends the description of every metric Collect may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, r := range readings {
		ch <- r.desc
	}
}

// Collect sends the readings present in the latest samples.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.latest {
		s := &c.latest[i]
		lv := []string{strconv.Itoa(s.GPUIndex), s.GPUUUID, s.GPUName, s.Host}
		for _, r := range readings {
			if v, ok := r.value(s); ok {
				ch <- prometheus.MustNewConstMetric(r.desc, r.kind, v, lv...)
			}
		}
	}
}
