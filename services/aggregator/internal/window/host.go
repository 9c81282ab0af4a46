package window

import (
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// HostStats are one host's aggregates in one window.
type HostStats struct {
	Samples uint64

	memN         uint64
	memUsedSum   float64
	MemTotal     uint64
	MemUsedMax   uint64
	MemAvailMin  uint64
	diskSeconds  float64
	diskRead     float64 // bytes
	diskWrite    float64
	DiskReadMax  float64
	DiskWriteMax float64
	netSeconds   float64
	netRx        float64 // bytes
	netTx        float64
	NetRxMax     float64
	NetTxMax     float64
}

// HostUnit is a unit of host-sample windows.
type HostUnit = Unit[string, HostStats]

// HostAggregator keeps host-sample windows, one key per host. A sample's rates cover the
// DeltaSeconds before its ts and go to the window of that ts, as GPU energy deltas do, so
// bytes moved add up across windows. It is not safe for concurrent use.
type HostAggregator struct {
	windows[string, HostStats]
	cfg Config
}

// NewHost returns a HostAggregator; done is as for New.
func NewHost(cfg Config, done map[time.Time]uint64) *HostAggregator {
	return &HostAggregator{
		windows: newWindows[string, HostStats](cfg.Window, cfg.Lateness, done,
			func() *HostStats { return &HostStats{} },
			func(s *HostStats) { *s = HostStats{} }),
		cfg: cfg,
	}
}

// Add routes one valid sample at stream position seq; see Aggregator.Add.
func (a *HostAggregator) Add(s *events.HostSample, seq uint64, now time.Time) Result {
	ts := s.TS.UnixNano()
	u, res := a.route(ts, ts, seq, now.UnixNano())
	if res == Skipped {
		return res
	}
	st := a.stats(u, s.Host, strings.Clone)
	st.Samples++
	if s.MemTotalBytes != nil {
		st.MemTotal = max(st.MemTotal, *s.MemTotalBytes)
	}
	if s.MemUsedBytes != nil && s.MemAvailableBytes != nil {
		if st.memN == 0 || *s.MemAvailableBytes < st.MemAvailMin {
			st.MemAvailMin = *s.MemAvailableBytes
		}
		st.memN++
		st.memUsedSum += float64(*s.MemUsedBytes)
		st.MemUsedMax = max(st.MemUsedMax, *s.MemUsedBytes)
	}
	if s.DeltaSeconds == nil {
		return res
	}
	dt := *s.DeltaSeconds
	if s.DiskReadBps != nil && s.DiskWriteBps != nil {
		st.diskSeconds += dt
		st.diskRead += *s.DiskReadBps * dt
		st.diskWrite += *s.DiskWriteBps * dt
		st.DiskReadMax = max(st.DiskReadMax, *s.DiskReadBps)
		st.DiskWriteMax = max(st.DiskWriteMax, *s.DiskWriteBps)
	}
	if s.NetRxBps != nil && s.NetTxBps != nil {
		st.netSeconds += dt
		st.netRx += *s.NetRxBps * dt
		st.netTx += *s.NetTxBps * dt
		st.NetRxMax = max(st.NetRxMax, *s.NetRxBps)
		st.NetTxMax = max(st.NetTxMax, *s.NetTxBps)
	}
	return res
}

// Rollups turns a unit into one rollup per host.
func (a *HostAggregator) Rollups(u *HostUnit, dst []events.HostRollup) []events.HostRollup {
	kind := events.KindWindow
	if u.Correction {
		kind = events.KindCorrection
	}
	for host, s := range u.Keys {
		r := events.HostRollup{
			V: events.Version, WindowStart: u.Start, WindowSeconds: int(a.cfg.Window / time.Second), Kind: kind,
			Host: host, Samples: s.Samples,
			MemSamples: s.memN, MemTotalBytes: s.MemTotal, MemUsedMaxBytes: s.MemUsedMax, MemAvailableMinBytes: s.MemAvailMin,
			DiskSeconds: s.diskSeconds, DiskReadMaxBps: s.DiskReadMax, DiskWriteMaxBps: s.DiskWriteMax,
			NetSeconds: s.netSeconds, NetRxMaxBps: s.NetRxMax, NetTxMaxBps: s.NetTxMax,
		}
		if s.memN > 0 {
			r.MemUsedAvgBytes = s.memUsedSum / float64(s.memN)
		}
		if s.diskSeconds > 0 {
			r.DiskReadAvgBps, r.DiskWriteAvgBps = s.diskRead/s.diskSeconds, s.diskWrite/s.diskSeconds
		}
		if s.netSeconds > 0 {
			r.NetRxAvgBps, r.NetTxAvgBps = s.netRx/s.netSeconds, s.netTx/s.netSeconds
		}
		dst = append(dst, r)
	}
	return dst
}
