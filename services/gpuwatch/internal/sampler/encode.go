package sampler

import (
	"strconv"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// appendSample appends s as JSON: the document encoding/json writes for events.GPUSample,
// with ts in the contract's millisecond layout, without reflection.
func appendSample(dst []byte, s *events.GPUSample) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(s.V), 10)
	dst = append(dst, `,"ts":"`...)
	dst = events.AppendTime(dst, s.TS)
	dst = append(dst, `","host":`...)
	dst = events.AppendString(dst, s.Host)
	dst = append(dst, `,"gpu_index":`...)
	dst = strconv.AppendInt(dst, int64(s.GPUIndex), 10)
	dst = append(dst, `,"gpu_uuid":`...)
	dst = events.AppendString(dst, s.GPUUUID)
	if s.GPUName != "" {
		dst = append(dst, `,"gpu_name":`...)
		dst = events.AppendString(dst, s.GPUName)
	}
	if s.Source != "" {
		dst = append(dst, `,"source":`...)
		dst = events.AppendString(dst, s.Source)
	}
	dst = appendF(dst, "util_gpu_pct", s.UtilGPUPct)
	dst = appendF(dst, "util_mem_pct", s.UtilMemPct)
	dst = appendU(dst, "mem_used_bytes", s.MemUsedBytes)
	dst = appendU(dst, "mem_total_bytes", s.MemTotalBytes)
	dst = appendF(dst, "power_w", s.PowerW)
	dst = appendF(dst, "power_limit_w", s.PowerLimitW)
	dst = appendF(dst, "energy_j", s.EnergyJ)
	dst = appendF(dst, "energy_used_j", s.EnergyUsedJ)
	dst = appendF(dst, "temp_c", s.TempC)
	dst = appendF(dst, "sm_clock_mhz", s.SMClockMHz)
	dst = appendF(dst, "mem_clock_mhz", s.MemClockMHz)
	dst = appendF(dst, "pcie_tx_bps", s.PCIeTxBps)
	dst = appendF(dst, "pcie_rx_bps", s.PCIeRxBps)
	dst = appendF(dst, "nvlink_tx_bps", s.NVLinkTxBps)
	dst = appendF(dst, "nvlink_rx_bps", s.NVLinkRxBps)
	dst = appendU(dst, "throttle_reasons", s.ThrottleReasons)
	dst = appendU(dst, "ecc_uncorrected", s.ECCUncorrected)
	return append(dst, '}')
}

func appendF(dst []byte, name string, v *float64) []byte {
	if v == nil {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return events.AppendFloat(dst, *v)
}

func appendU(dst []byte, name string, v *uint64) []byte {
	if v == nil {
		return dst
	}
	dst = append(dst, ',', '"')
	dst = append(dst, name...)
	dst = append(dst, '"', ':')
	return strconv.AppendUint(dst, *v, 10)
}

// appendMsgID appends host/uuid/ts: one sample of one GPU at one tick.
func appendMsgID(dst []byte, s *events.GPUSample) []byte {
	dst = append(dst, s.Host...)
	dst = append(dst, '/')
	dst = append(dst, s.GPUUUID...)
	dst = append(dst, '/')
	return events.AppendTime(dst, s.TS)
}
