package events

import (
	"encoding/json"
	"time"
)

// HostSample is one reading of the host a GPU sampler runs on, taken from procfs on the
// GPU tick. A reading that could not be read is nil and absent from the JSON — never zero.
// The rates are deltas of the kernel's counters since the previous tick, DeltaSeconds ago;
// they are absent on the first tick, which has nothing to subtract.
type HostSample struct {
	V    int       `json:"v"`
	TS   time.Time `json:"ts"`
	Host string    `json:"host"`

	MemTotalBytes     *uint64 `json:"mem_total_bytes,omitempty"`
	MemUsedBytes      *uint64 `json:"mem_used_bytes,omitempty"`      // total − available, as free(1) says
	MemAvailableBytes *uint64 `json:"mem_available_bytes,omitempty"` // what can be given to programs without swapping

	DeltaSeconds *float64 `json:"delta_seconds,omitempty"`  // the time the rates cover
	DiskReadBps  *float64 `json:"disk_read_bps,omitempty"`  // bytes/s read from the whole disks
	DiskWriteBps *float64 `json:"disk_write_bps,omitempty"` // bytes/s written to the whole disks
	NetRxBps     *float64 `json:"net_rx_bps,omitempty"`     // bytes/s received on the network interfaces
	NetTxBps     *float64 `json:"net_tx_bps,omitempty"`     // bytes/s sent on the network interfaces
}

// maxHostBps bounds a host's disk or network rate: 1 PB/s.
const maxHostBps = 1e15

// UnmarshalHostSample decodes one host sample, rejecting unknown JSON types with an error
// that wraps ErrInvalidEvent. It does not validate: call ValidateAt.
func UnmarshalHostSample(data []byte, s *HostSample) error {
	*s = HostSample{}
	return unmarshalSample(data, s, &s.V)
}

// MarshalHostSample encodes s as the contract's JSON, ts in the contract's millisecond
// layout.
func MarshalHostSample(s *HostSample) ([]byte, error) {
	type plain HostSample
	return json.Marshal(struct {
		*plain
		TS string `json:"ts"` // shadows plain's
	}{(*plain)(s), FormatTS(s.TS)})
}

// HostSampleSubject returns host.sample.<host>.
func HostSampleSubject(host string) string {
	return string(appendSubject(make([]byte, 0, 48), "host.sample.", host, "", false))
}

// ValidateAt checks the sample against the contract; see RequestEvent.ValidateAt.
func (s *HostSample) ValidateAt(now time.Time) error {
	if err := checkSampleHead(s.V, s.TS, s.Host, now); err != nil {
		return err
	}
	for _, f := range [...]struct {
		name string
		v    *float64
		max  float64
	}{
		{"delta_seconds", s.DeltaSeconds, 86400},
		{"disk_read_bps", s.DiskReadBps, maxHostBps},
		{"disk_write_bps", s.DiskWriteBps, maxHostBps},
		{"net_rx_bps", s.NetRxBps, maxHostBps},
		{"net_tx_bps", s.NetTxBps, maxHostBps},
	} {
		if f.v != nil {
			if err := checkReading(f.name, *f.v, f.max); err != nil {
				return err
			}
		}
	}
	if s.MemTotalBytes != nil {
		if s.MemUsedBytes != nil && *s.MemUsedBytes > *s.MemTotalBytes {
			return fieldErr("mem_used_bytes", ErrOutOfRange, "above mem_total_bytes")
		}
		if s.MemAvailableBytes != nil && *s.MemAvailableBytes > *s.MemTotalBytes {
			return fieldErr("mem_available_bytes", ErrOutOfRange, "above mem_total_bytes")
		}
	}
	return nil
}

// HostRollup is one window × host: what the aggregator writes to host_rollups and
// publishes on rollup.host.<host>. A mean covers the samples that had the reading:
// MemSamples for memory; DiskSeconds and NetSeconds, the time the rates covered, for disk
// and network, whose means are bytes moved ÷ that time (so SQL merges windows exactly with
// sum(mean × seconds) / sum(seconds)). Readings no sample had are zero, with a zero count.
type HostRollup struct {
	V             int       `json:"v"`
	WindowStart   time.Time `json:"window_start"`
	WindowSeconds int       `json:"window_seconds"`
	Kind          string    `json:"kind"`
	Host          string    `json:"host"`
	Samples       uint64    `json:"samples"`

	MemSamples           uint64  `json:"mem_samples"`
	MemTotalBytes        uint64  `json:"mem_total_bytes"`
	MemUsedAvgBytes      float64 `json:"mem_used_avg_bytes"`
	MemUsedMaxBytes      uint64  `json:"mem_used_max_bytes"`
	MemAvailableMinBytes uint64  `json:"mem_available_min_bytes"`

	DiskSeconds     float64 `json:"disk_seconds"`
	DiskReadAvgBps  float64 `json:"disk_read_avg_bps"`
	DiskReadMaxBps  float64 `json:"disk_read_max_bps"`
	DiskWriteAvgBps float64 `json:"disk_write_avg_bps"`
	DiskWriteMaxBps float64 `json:"disk_write_max_bps"`

	NetSeconds  float64 `json:"net_seconds"`
	NetRxAvgBps float64 `json:"net_rx_avg_bps"`
	NetRxMaxBps float64 `json:"net_rx_max_bps"`
	NetTxAvgBps float64 `json:"net_tx_avg_bps"`
	NetTxMaxBps float64 `json:"net_tx_max_bps"`
}

// HostRollupSubject returns rollup.host.<host>.
func HostRollupSubject(host string) string {
	return string(appendSubject(make([]byte, 0, 48), "rollup.host.", host, "", false))
}
