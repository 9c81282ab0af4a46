package window

import (
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// GPUKey identifies one GPU.
type GPUKey struct {
	Host     string
	GPUIndex int
	GPUUUID  string
}

// GPUStats are one GPU's aggregates in one window.
type GPUStats struct {
	Name                      string
	Samples                   uint64
	utilSum                   float64
	utilN                     uint64
	UtilMax                   float64
	MemUsedMax, MemTotal      uint64
	powerSum                  float64
	powerN                    uint64
	PowerMaxW                 float64
	EnergyJ                   float64
	TempMaxC                  float64
	clockSum                  float64
	clockN                    uint64
	Throttled                 uint64
	hasUtil, hasPower, hasTmp bool
}

// GPUUnit is a unit of GPU-sample windows.
type GPUUnit = Unit[GPUKey, GPUStats]

type lastReading struct {
	ts     int64
	seq    uint64  // its stream position
	energy float64 // the counter, when the GPU has one
	hasE   bool
}

// GPUAggregator keeps GPU-sample windows. Energy used in a window is the sum of its samples'
// energy_used_j (each the energy used since the GPU's previous sample, so no energy falls
// between windows and no state spans samples: a restart loses nothing). A sample without it
// gets the delta of the GPU's energy counter since the GPU's previous sample, and a GPU
// without the counter gets power integrated over the sample interval instead. It is not
// safe for concurrent use.
type GPUAggregator struct {
	windows[GPUKey, GPUStats]
	cfg  Config
	last map[GPUKey]lastReading
	// primed holds, per GPU, the position of a last reading taken from a sample the replay
	// skipped, until a sample of the GPU is counted in a window (which then holds what it
	// needs, see holdPrevious): the floor stays before it, so that another start before then
	// replays it too.
	primed map[GPUKey]uint64
}

// NewGPU returns a GPUAggregator; done is as for New.
func NewGPU(cfg Config, done map[time.Time]uint64) *GPUAggregator {
	return &GPUAggregator{
		windows: newWindows[GPUKey, GPUStats](cfg.Window, cfg.Lateness, done,
			func() *GPUStats { return &GPUStats{} },
			func(s *GPUStats) { *s = GPUStats{} }),
		cfg:    cfg,
		last:   map[GPUKey]lastReading{},
		primed: map[GPUKey]uint64{},
	}
}

// idleReason is NVML's "GPU idle" clocks-event reason: not a throttle.
const idleReason = 0x1

// MaxGPUReadings bounds the GPUs whose last reading is kept (a fleet of 12,500 eight-GPU
// hosts): past it a new GPU's samples are still counted, but one without energy_used_j adds
// no energy until a remembered GPU has been silent for an hour. Without the bound a flood
// of GPUs would hold a reading each for an hour.
const MaxGPUReadings = 100_000

// maxIntegrationGap bounds the interval over which power is integrated when a GPU has no
// energy counter: longer gaps are missing samples, not energy to guess.
const maxIntegrationGap = int64(time.Minute)

// Add routes one valid sample at stream position seq; see Aggregator.Add.
func (a *GPUAggregator) Add(s *events.GPUSample, seq uint64, now time.Time) Result {
	ts := s.TS.UnixNano()
	k := GPUKey{Host: s.Host, GPUIndex: s.GPUIndex, GPUUUID: s.GPUUUID}
	u, res := a.route(ts, ts, seq, now.UnixNano())
	// A skipped sample was counted in a window stored before a restart, its delta with it:
	// it only primes the previous reading, so the next sample's delta is whole.
	prev, seen := a.remember(k, s, ts, seq)
	if res == Skipped {
		if r, ok := a.last[k]; ok && r.seq == seq {
			if _, ok := a.primed[k]; !ok {
				k = GPUKey{Host: strings.Clone(k.Host), GPUIndex: k.GPUIndex, GPUUUID: strings.Clone(k.GPUUUID)}
			}
			a.primed[k] = seq
		}
		return res
	}
	st := a.stats(u, k, func(k GPUKey) GPUKey {
		return GPUKey{Host: strings.Clone(k.Host), GPUIndex: k.GPUIndex, GPUUUID: strings.Clone(k.GPUUUID)}
	})
	if st.Name == "" && s.GPUName != "" {
		st.Name = strings.Clone(s.GPUName)
	}
	st.Samples++
	if v := s.UtilGPUPct; v != nil {
		st.utilSum += *v
		st.utilN++
		st.UtilMax = max(st.UtilMax, *v)
	}
	if v := s.MemUsedBytes; v != nil {
		st.MemUsedMax = max(st.MemUsedMax, *v)
	}
	if v := s.MemTotalBytes; v != nil {
		st.MemTotal = max(st.MemTotal, *v)
	}
	if v := s.PowerW; v != nil {
		st.powerSum += *v
		st.powerN++
		st.PowerMaxW = max(st.PowerMaxW, *v)
	}
	if v := s.TempC; v != nil {
		if !st.hasTmp || *v > st.TempMaxC {
			st.TempMaxC = *v
		}
		st.hasTmp = true
	}
	if v := s.SMClockMHz; v != nil {
		st.clockSum += *v
		st.clockN++
	}
	if v := s.ThrottleReasons; v != nil && *v&^idleReason != 0 {
		st.Throttled++
	}
	switch {
	case s.EnergyUsedJ != nil:
		st.EnergyJ += *s.EnergyUsedJ
	case !seen || ts <= prev.ts:
	case s.EnergyJ != nil && prev.hasE:
		if d := *s.EnergyJ - prev.energy; d >= 0 { // a negative delta is a counter reset
			st.EnergyJ += d
		}
		holdPrevious(u, prev)
	case s.EnergyJ == nil && s.PowerW != nil && ts-prev.ts <= maxIntegrationGap:
		st.EnergyJ += *s.PowerW * float64(ts-prev.ts) / 1e9
		holdPrevious(u, prev)
	}
	if len(a.primed) > 0 && (s.EnergyJ != nil || s.PowerW != nil) {
		delete(a.primed, k) // u holds this sample, the GPU's reading now or one before it
	}
	return res
}

// Held returns the lowest stream position held by a window not yet handed out, or by a
// reading a replay primed (see primed); see windows.Held.
func (a *GPUAggregator) Held() (minSeq uint64, ok bool) {
	minSeq, ok = a.windows.Held()
	for _, seq := range a.primed {
		if !ok || seq < minSeq {
			minSeq, ok = seq, true
		}
	}
	return minSeq, ok
}

// holdPrevious makes u hold the position of the reading its energy was taken from, so that
// the floor stays before it: a restart from the floor replays that reading (skipped, in its
// stored window, it primes the previous reading again) and takes the same energy. Without it
// the replay began at the open window's first sample, which had no previous reading, and
// the interval before it was lost.
func holdPrevious(u *GPUUnit, prev lastReading) {
	if prev.seq > 0 {
		u.MinSeq = min(u.MinSeq, prev.seq)
	}
}

// remember keeps s as its GPU's last reading when it is the latest and carries energy or
// power, and returns the reading before it. A sample with neither (a GPU whose NVML reads
// hung publishes its identity alone, before the late sample of the tick it was reading) is
// nothing to take a delta or integrate from.
func (a *GPUAggregator) remember(k GPUKey, s *events.GPUSample, ts int64, seq uint64) (prev lastReading, seen bool) {
	prev, seen = a.last[k]
	if seen && ts <= prev.ts || s.EnergyJ == nil && s.PowerW == nil {
		return prev, seen
	}
	r := lastReading{ts: ts, seq: seq}
	if s.EnergyJ != nil {
		r.energy, r.hasE = *s.EnergyJ, true
	}
	if !seen {
		if len(a.last) >= MaxGPUReadings {
			return prev, seen
		}
		k = GPUKey{Host: strings.Clone(k.Host), GPUIndex: k.GPUIndex, GPUUUID: strings.Clone(k.GPUUUID)}
	}
	a.last[k] = r
	return prev, seen
}

// Rollups turns a unit into one rollup per GPU.
func (a *GPUAggregator) Rollups(u *GPUUnit, dst []events.GPURollup) []events.GPURollup {
	kind := events.KindWindow
	if u.Correction {
		kind = events.KindCorrection
	}
	for k, s := range u.Keys {
		r := events.GPURollup{
			V: events.Version, WindowStart: u.Start, WindowSeconds: int(a.cfg.Window / time.Second), Kind: kind,
			Host: k.Host, GPUIndex: k.GPUIndex, GPUUUID: k.GPUUUID, GPUName: s.Name, Samples: s.Samples,
			UtilMax: s.UtilMax, MemUsedMax: s.MemUsedMax, MemTotal: s.MemTotal, PowerMaxW: s.PowerMaxW,
			EnergyJ: s.EnergyJ, TempMaxC: s.TempMaxC, Throttled: s.Throttled,
		}
		if s.utilN > 0 {
			r.UtilAvg = s.utilSum / float64(s.utilN)
		}
		if s.powerN > 0 {
			r.PowerAvgW = s.powerSum / float64(s.powerN)
		}
		if s.clockN > 0 {
			r.SMClockAvg = s.clockSum / float64(s.clockN)
		}
		dst = append(dst, r)
	}
	return dst
}

// Remembered returns how many GPUs' last readings are kept.
func (a *GPUAggregator) Remembered() int { return len(a.last) }

// ForgetIdle drops the last readings of GPUs silent for an hour.
func (a *GPUAggregator) ForgetIdle(now time.Time) {
	horizon := now.UnixNano() - int64(time.Hour)
	for k, r := range a.last {
		if r.ts < horizon {
			delete(a.last, k)
			delete(a.primed, k)
		}
	}
}
