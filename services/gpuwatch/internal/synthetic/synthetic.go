package synthetic

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Model constants; see the package comment.
const (
	idleW        = 75.0
	limitW       = 700.0
	tau          = 60.0 // seconds, temperature and memory lag
	memTotal     = 150754820096
	maxSMClock   = 1980.0
	minSMClock   = 1410.0
	memClockMHz  = 3201.0
	pcieTxMax    = 2e9
	pcieRxMax    = 6e8
	reasonIdle   = 0x1
	reasonSWPCap = 0x4
)

// Options configure the model.
type Options struct {
	GPUs   int
	Seed   uint64
	Period time.Duration // of the slow load wave
	Host   string        // makes GPU UUIDs differ between hosts
	Start  time.Time     // when the made-up driver loaded: energy counts from here
}

// Source makes up samples for Options.GPUs GPUs.
type Source struct {
	opts  Options
	omega float64
	gpus  []gpu
}

type gpu struct {
	phase float64
	uuid  string
}

// New returns the model for opts.
func New(opts Options) (*Source, error) {
	if opts.GPUs < 1 {
		return nil, fmt.Errorf("cannot model %d GPUs", opts.GPUs)
	}
	if opts.Period < time.Second {
		return nil, fmt.Errorf("cannot model a load period of %s: it must be at least 1s", opts.Period)
	}
	s := &Source{opts: opts, omega: 2 * math.Pi / opts.Period.Seconds(), gpus: make([]gpu, opts.GPUs)}
	hostHash := fnv(opts.Host)
	for i := range s.gpus {
		h := mix(opts.Seed ^ mix(uint64(i)+1))
		u := mix(h ^ hostHash)
		s.gpus[i] = gpu{
			phase: 2 * math.Pi * float64(h>>11) / (1 << 53),
			uuid: fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x",
				uint32(u>>32), uint16(u>>16), uint16(u), uint16(h>>48), h&0xffffffffffff),
		}
	}
	return s, nil
}

// Sample appends one made-up sample per GPU at now.
func (s *Source) Sample(_ context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample {
	t := now.Sub(s.opts.Start).Seconds()
	sec := uint64(now.Unix())
	for i, g := range s.gpus {
		x := s.load(g.phase, t) / 0.9
		lag := s.laggedLoad(g.phase, t) / 0.9
		noise := 4*float64(mix(s.opts.Seed^mix(uint64(i)+1)^mix(sec))>>11)/(1<<53) - 2
		util := math.Round(clamp(100*x+noise, 0, 100)*10) / 10
		power := idleW + (limitW-idleW)*x
		var clock float64
		var reasons uint64
		switch {
		case power >= 0.95*limitW:
			clock = maxSMClock - (maxSMClock-minSMClock)*(power-0.95*limitW)/(0.05*limitW)
			reasons = reasonSWPCap
		case x < 0.05:
			clock, reasons = maxSMClock, reasonIdle
		default:
			clock = maxSMClock
		}
		dst = append(dst, events.GPUSample{
			GPUIndex:        i,
			GPUUUID:         g.uuid,
			GPUName:         "NVIDIA H200 (synthetic)",
			Source:          events.SourceSynthetic,
			UtilGPUPct:      ptr(util),
			UtilMemPct:      ptr(math.Round(0.7*util*10) / 10),
			MemUsedBytes:    ptr(uint64(memTotal * (0.25 + 0.6*clamp(lag, 0, 1)))),
			MemTotalBytes:   ptr(uint64(memTotal)),
			PowerW:          ptr(round3(power)),
			PowerLimitW:     ptr(limitW),
			EnergyJ:         ptr(round3(s.energy(g.phase, t))),
			TempC:           ptr(math.Round(30 + 30*lag)),
			SMClockMHz:      ptr(math.Round(clock)),
			MemClockMHz:     ptr(memClockMHz),
			PCIeTxBps:       ptr(math.Round(pcieTxMax * x)),
			PCIeRxBps:       ptr(math.Round(pcieRxMax * x)),
			ThrottleReasons: ptr(reasons),
			ECCUncorrected:  ptr(uint64(0)),
		})
	}
	return dst
}

// load is the model's load in [0, 0.9].
func (s *Source) load(phase, t float64) float64 {
	w := s.omega
	return 0.45 + 0.30*math.Sin(w*t+phase) + 0.15*math.Sin(7*w*t+2*phase)
}

// energy is the exact integral of power from 0 to t, in joules.
func (s *Source) energy(phase, t float64) float64 {
	if t <= 0 {
		return 0
	}
	w := s.omega
	// ∫ load = 0.45t + 0.30/ω·(cos φ − cos(ωt+φ)) + 0.15/(7ω)·(cos 2φ − cos(7ωt+2φ))
	intLoad := 0.45*t + 0.30/w*(math.Cos(phase)-math.Cos(w*t+phase)) + 0.15/(7*w)*(math.Cos(2*phase)-math.Cos(7*w*t+2*phase))
	return idleW*t + (limitW-idleW)/0.9*intLoad
}

// laggedLoad is load passed through a first-order lag of time constant tau, in steady
// state: each sine is scaled by 1/√(1+(ωτ)²) and delayed by atan(ωτ).
func (s *Source) laggedLoad(phase, t float64) float64 {
	lagged := func(w, amp, ph float64) float64 {
		wt := w * tau
		return amp / math.Sqrt(1+wt*wt) * math.Sin(w*t+ph-math.Atan(wt))
	}
	return 0.45 + lagged(s.omega, 0.30, phase) + lagged(7*s.omega, 0.15, 2*phase)
}

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

func ptr[T any](v T) *T { return &v }

// mix is splitmix64's finaliser: a fixed, well-spread hash of a 64-bit value.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func fnv(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
