package nvmlsource

import (
	"encoding/binary"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// h200 returns go-nvml's mock DGX H200 with n GPUs whose readings answer with what an
// H200 under a matmul load answered: 100 % busy, 689 W of 700 W, 54 °C, SM
// clock 1410 MHz, throttled by the software power cap. Each has 18 active NVLinks whose
// data counters (KiB, every link together) advance by nvlinkStepKiB (TX) and half that
// (RX) at each read.
func h200(t testing.TB, n int) (*server.Server, []*server.Device) {
	t.Helper()
	srv := dgxh200.New()
	srv.Devices = srv.Devices[:n]
	devs := make([]*server.Device, n)
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		devs[i] = dev
		dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		var mu sync.Mutex
		tx, rx := uint64(5_000_000_000), uint64(4_000_000_000)
		dev.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			tx, rx = tx+nvlinkStepKiB, rx+nvlinkStepKiB/2
			for i := range vals {
				v := &vals[i]
				v.ValueType, v.NvmlReturn = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG), uint32(nvml.SUCCESS)
				switch {
				case v.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX && v.ScopeId == nvlinkScope:
					binary.NativeEndian.PutUint64(v.Value[:], tx)
				case v.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX && v.ScopeId == nvlinkScope:
					binary.NativeEndian.PutUint64(v.Value[:], rx)
				default:
					v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				}
			}
			return nvml.SUCCESS
		}
		dev.GetNameFunc = func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 100, Memory: 71}, nvml.SUCCESS
		}
		dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			return nvml.Memory_v2{Total: 150754820096, Used: 120000000000, Reserved: 600000000}, nvml.SUCCESS
		}
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 150754820096, Used: 120600000000}, nvml.SUCCESS
		}
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 689_200, nvml.SUCCESS }
		dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700_000, nvml.SUCCESS }
		dev.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 123_456_789_500, nvml.SUCCESS }
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 54, nvml.SUCCESS }
		dev.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			if c == nvml.CLOCK_SM {
				return 1410, nvml.SUCCESS
			}
			return 3201, nvml.SUCCESS
		}
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 4, nvml.SUCCESS }
		dev.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) { return 4, nvml.SUCCESS }
		dev.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.SUCCESS
		}
		dev.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			if c == nvml.PCIE_UTIL_TX_BYTES {
				return 1000, nvml.SUCCESS
			}
			return 500, nvml.SUCCESS
		}
	}
	return srv, devs
}

// nvlinkStepKiB is how far the mock's NVLink TX counter moves per read: 100 GB/s at 1 Hz.
const nvlinkStepKiB = 100_000_000_000 / 1024

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
