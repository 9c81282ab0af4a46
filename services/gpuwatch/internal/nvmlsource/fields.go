package nvmlsource

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// field is one NVML query; some fill two keys of the sample (utilisation, memory).
type field int

const (
	fieldUtil field = iota
	fieldMemory
	fieldPower
	fieldPowerLimit
	fieldEnergy
	fieldTemp
	fieldSMClock
	fieldMemClock
	fieldThrottle
	fieldECC
	fieldNVLink // read by Source.readNVLink: it keeps the previous counters
	fieldPCIeTx
	fieldPCIeRx
	numFields
)

// Field names one reading in metrics and logs, and the sample keys it fills.
type Field struct {
	Name string
	Keys []string
}

var fields = [numFields]Field{
	fieldUtil:       {"util", []string{"util_gpu_pct", "util_mem_pct"}},
	fieldMemory:     {"memory", []string{"mem_used_bytes", "mem_total_bytes"}},
	fieldPower:      {"power_w", []string{"power_w"}},
	fieldPowerLimit: {"power_limit_w", []string{"power_limit_w"}},
	fieldEnergy:     {"energy_j", []string{"energy_j", "energy_used_j"}}, // the sampler's delta of it
	fieldTemp:       {"temp_c", []string{"temp_c"}},
	fieldSMClock:    {"sm_clock_mhz", []string{"sm_clock_mhz"}},
	fieldMemClock:   {"mem_clock_mhz", []string{"mem_clock_mhz"}},
	fieldThrottle:   {"throttle_reasons", []string{"throttle_reasons"}},
	fieldECC:        {"ecc_uncorrected", []string{"ecc_uncorrected"}},
	fieldNVLink:     {"nvlink", []string{"nvlink_tx_bps", "nvlink_rx_bps"}},
	fieldPCIeTx:     {"pcie_tx_bps", []string{"pcie_tx_bps"}},
	fieldPCIeRx:     {"pcie_rx_bps", []string{"pcie_rx_bps"}},
}

// Fields returns every reading the source takes, in a fixed order.
func Fields() []Field { return append([]Field(nil), fields[:]...) }

// readField queries f on d and stores the result in s. It returns SUCCESS, the NVML code
// that failed, or outOfRange for a value that cannot be right.
func readField(d nvml.Device, f field, s *events.GPUSample) nvml.Return {
	switch f {
	case fieldUtil:
		u, ret := d.GetUtilizationRates()
		if ret != nvml.SUCCESS {
			return ret
		}
		if u.Gpu > 100 || u.Memory > 100 {
			return outOfRange
		}
		s.UtilGPUPct, s.UtilMemPct = ptr(float64(u.Gpu)), ptr(float64(u.Memory))
	case fieldMemory:
		// v2 counts memory the driver reserves as neither used nor free, as nvidia-smi does;
		// older drivers only have v1.
		used, total, ret := memoryV2(d)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND || ret == nvml.ERROR_ARGUMENT_VERSION_MISMATCH {
			var m nvml.Memory
			m, ret = d.GetMemoryInfo()
			used, total = m.Used, m.Total
		}
		if ret != nvml.SUCCESS {
			return ret
		}
		if used > total {
			return outOfRange
		}
		s.MemUsedBytes, s.MemTotalBytes = ptr(used), ptr(total)
	case fieldPower:
		return milli(d.GetPowerUsage, &s.PowerW)
	case fieldPowerLimit:
		return milli(d.GetEnforcedPowerLimit, &s.PowerLimitW)
	case fieldEnergy:
		mj, ret := d.GetTotalEnergyConsumption()
		if ret != nvml.SUCCESS {
			return ret
		}
		s.EnergyJ = ptr(float64(mj) / 1000)
	case fieldTemp:
		return plain(func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) }, &s.TempC)
	case fieldSMClock:
		return plain(func() (uint32, nvml.Return) { return d.GetClockInfo(nvml.CLOCK_SM) }, &s.SMClockMHz)
	case fieldMemClock:
		return plain(func() (uint32, nvml.Return) { return d.GetClockInfo(nvml.CLOCK_MEM) }, &s.MemClockMHz)
	case fieldThrottle:
		r, ret := d.GetCurrentClocksEventReasons()
		if ret == nvml.ERROR_FUNCTION_NOT_FOUND { // drivers before 535 name it throttle reasons
			r, ret = d.GetCurrentClocksThrottleReasons()
		}
		if ret != nvml.SUCCESS {
			return ret
		}
		s.ThrottleReasons = ptr(r)
	case fieldECC:
		n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		if ret != nvml.SUCCESS {
			return ret
		}
		s.ECCUncorrected = ptr(n)
	case fieldPCIeTx:
		return pcie(d, nvml.PCIE_UTIL_TX_BYTES, &s.PCIeTxBps)
	case fieldPCIeRx:
		return pcie(d, nvml.PCIE_UTIL_RX_BYTES, &s.PCIeRxBps)
	}
	return nvml.SUCCESS
}

// outOfRange is not an NVML code: the reader returns it for a value it refuses.
const outOfRange nvml.Return = -1

func memoryV2(d nvml.Device) (used, total uint64, ret nvml.Return) {
	m, ret := d.GetMemoryInfo_v2()
	return m.Used, m.Total, ret
}

// milli stores a milliwatt reading in watts.
func milli(get func() (uint32, nvml.Return), dst **float64) nvml.Return {
	v, ret := get()
	if ret != nvml.SUCCESS {
		return ret
	}
	*dst = ptr(float64(v) / 1000)
	return nvml.SUCCESS
}

func plain(get func() (uint32, nvml.Return), dst **float64) nvml.Return {
	v, ret := get()
	if ret != nvml.SUCCESS {
		return ret
	}
	*dst = ptr(float64(v))
	return nvml.SUCCESS
}

// pcie stores NVML's KiB/s throughput in bytes per second.
func pcie(d nvml.Device, c nvml.PcieUtilCounter, dst **float64) nvml.Return {
	v, ret := d.GetPcieThroughput(c)
	if ret != nvml.SUCCESS {
		return ret
	}
	*dst = ptr(float64(v) * 1024)
	return nvml.SUCCESS
}

func ptr[T any](v T) *T { return &v }
