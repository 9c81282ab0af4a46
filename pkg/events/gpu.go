package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"
)

// GPU sample sources.
const (
	SourceNVML      = "nvml"
	SourceReplay    = "replay"
	SourceSynthetic = "synthetic"
)

// MaxEnergyUsedJ bounds a GPU sample's energy_used_j: 100 kW for a day.
const MaxEnergyUsedJ = 100_000 * 86_400

// MaxEnergyJ bounds a GPU sample's energy_j counter. NVML's counts millijoules in 64 bits
// (at most 1.8e16 J); unbounded, deltas of hostile counters would sum to +Inf in a window,
// which no rollup can carry.
const MaxEnergyJ = 1e18

// GPUSample is one reading of one GPU. A reading the GPU does not support, or that failed,
// is nil and absent from the JSON — never zero.
type GPUSample struct {
	V        int       `json:"v"`
	TS       time.Time `json:"ts"`
	Host     string    `json:"host"`
	GPUIndex int       `json:"gpu_index"`
	GPUUUID  string    `json:"gpu_uuid"`
	GPUName  string    `json:"gpu_name,omitempty"`
	Source   string    `json:"source,omitempty"` // nvml, replay or synthetic

	UtilGPUPct    *float64 `json:"util_gpu_pct,omitempty"`
	UtilMemPct    *float64 `json:"util_mem_pct,omitempty"`
	MemUsedBytes  *uint64  `json:"mem_used_bytes,omitempty"`
	MemTotalBytes *uint64  `json:"mem_total_bytes,omitempty"`
	PowerW        *float64 `json:"power_w,omitempty"`
	PowerLimitW   *float64 `json:"power_limit_w,omitempty"`
	EnergyJ       *float64 `json:"energy_j,omitempty"` // monotonic counter since the driver loaded
	// EnergyUsedJ is the energy used since the publisher's previous sample of this GPU that
	// carried energy_j (the counter's delta); absent on the first such sample of a GPU,
	// after a counter reset and without energy_j. It makes the sample self-contained: a
	// consumer sums it without keeping the previous reading.
	EnergyUsedJ     *float64 `json:"energy_used_j,omitempty"`
	TempC           *float64 `json:"temp_c,omitempty"`
	SMClockMHz      *float64 `json:"sm_clock_mhz,omitempty"`
	MemClockMHz     *float64 `json:"mem_clock_mhz,omitempty"`
	PCIeTxBps       *float64 `json:"pcie_tx_bps,omitempty"`
	PCIeRxBps       *float64 `json:"pcie_rx_bps,omitempty"`
	NVLinkTxBps     *float64 `json:"nvlink_tx_bps,omitempty"` // data over every NVLink of the GPU
	NVLinkRxBps     *float64 `json:"nvlink_rx_bps,omitempty"`
	ThrottleReasons *uint64  `json:"throttle_reasons,omitempty"` // NVML clocks-event reasons bitmask
	ECCUncorrected  *uint64  `json:"ecc_uncorrected,omitempty"`
}

// UnmarshalGPUSample decodes one GPU sample, rejecting unknown JSON types with an error
// that wraps ErrInvalidEvent. It does not validate: call ValidateAt.
func UnmarshalGPUSample(data []byte, s *GPUSample) error {
	*s = GPUSample{}
	return unmarshalSample(data, s, &s.V)
}

// ValidateAt checks the sample against the contract; see RequestEvent.ValidateAt.
func (s *GPUSample) ValidateAt(now time.Time) error {
	if err := checkSampleHead(s.V, s.TS, s.Host, now); err != nil {
		return err
	}
	if err := checkLabel("gpu_uuid", s.GPUUUID, true); err != nil {
		return err
	}
	if err := checkLabel("gpu_name", s.GPUName, false); err != nil {
		return err
	}
	switch s.Source {
	case "", SourceNVML, SourceReplay, SourceSynthetic:
	default:
		return fieldErr("source", ErrUnknownStatus, quoteBounded(s.Source))
	}
	if s.GPUIndex < 0 || s.GPUIndex > 1023 {
		return fieldErr("gpu_index", ErrOutOfRange, strconv.Itoa(s.GPUIndex))
	}
	for _, f := range [...]struct {
		name string
		v    *float64
		max  float64
	}{
		{"util_gpu_pct", s.UtilGPUPct, 100},
		{"util_mem_pct", s.UtilMemPct, 100},
		{"power_w", s.PowerW, 100_000},
		{"power_limit_w", s.PowerLimitW, 100_000},
		{"energy_j", s.EnergyJ, MaxEnergyJ},
		{"energy_used_j", s.EnergyUsedJ, MaxEnergyUsedJ},
		{"temp_c", s.TempC, 1000},
		{"sm_clock_mhz", s.SMClockMHz, 100_000},
		{"mem_clock_mhz", s.MemClockMHz, 100_000},
		{"pcie_tx_bps", s.PCIeTxBps, 1e15},
		{"pcie_rx_bps", s.PCIeRxBps, 1e15},
		{"nvlink_tx_bps", s.NVLinkTxBps, 1e15},
		{"nvlink_rx_bps", s.NVLinkRxBps, 1e15},
	} {
		if f.v == nil {
			continue
		}
		switch v := *f.v; {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return fieldErr(f.name, ErrOutOfRange, "not a finite number")
		case v < 0 && f.name != "temp_c":
			return fieldErr(f.name, ErrNegative, formatMs(v))
		case v > f.max:
			return fieldErr(f.name, ErrOutOfRange, fmt.Sprintf("%g > %g", v, f.max))
		}
	}
	if s.MemUsedBytes != nil && s.MemTotalBytes != nil && *s.MemUsedBytes > *s.MemTotalBytes {
		return fieldErr("mem_used_bytes", ErrOutOfRange, "above mem_total_bytes")
	}
	return nil
}

// unmarshalSample decodes one JSON message into v with encoding/json. A mistyped field is
// ErrWrongType, unless the message says another version (*ver once decoded: json.Unmarshal
// reads on past the mistyped field), for a message of another version may type its fields
// otherwise and that is what is wrong with it; bad JSON is a SyntaxError, and so are a key
// given twice and a key in other letter case than its field's (see checkKeys).
func unmarshalSample(data []byte, v any, ver *int) error {
	if err := json.Unmarshal(data, v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			if *ver != Version && *ver != 0 {
				return fieldErr("v", ErrUnsupportedVersion, strconv.Itoa(*ver))
			}
			return fieldErr(te.Field, ErrWrongType, "want "+te.Type.String())
		}
		return &SyntaxError{Msg: err.Error()}
	}
	if err := checkKeys(data, reflect.TypeOf(v)); err != nil {
		if *ver != Version && *ver != 0 {
			return fieldErr("v", ErrUnsupportedVersion, strconv.Itoa(*ver))
		}
		return err
	}
	return nil
}

// checkSampleHead checks what every sample of a host starts with: its version, its time and
// its host.
func checkSampleHead(v int, ts time.Time, host string, now time.Time) error {
	if v != Version {
		if v == 0 {
			return fieldErr("v", ErrMissingField, "")
		}
		return fieldErr("v", ErrUnsupportedVersion, strconv.Itoa(v))
	}
	if err := checkTime("ts", ts, now); err != nil {
		return err
	}
	return checkLabel("host", host, true)
}
