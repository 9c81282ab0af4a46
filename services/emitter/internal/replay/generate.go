package replay

import (
	"math"
	"math/rand/v2"
	"time"
)

// Shape describes a workload: arrival rate with bursts and a slow swell, and log-normal
// input and output token counts, as fitted to the Azure traces.
type Shape struct {
	Name                    string
	Rate                    float64 // mean requests per second outside bursts
	BurstFactor             float64 // rate multiplier during a burst
	BurstEvery, BurstLength time.Duration
	SwellPeriod             time.Duration // period of a ±SwellDepth sinusoidal change of the rate
	SwellDepth              float64
	InputMu, InputSigma     float64 // ln(input tokens) ~ N(mu, sigma)
	OutputMu, OutputSigma   float64
	MinInput, MaxInput      int64
	MinOutput, MaxOutput    int64
}

// Shapes fitted to AzureLLMInferenceTrace_conv.csv and _code.csv (Nov 2023): mu is the log of
// the trace's median and sigma the standard deviation of its log token counts, the bounds are
// the trace's. Conversation has median input 1,020 and output 129 tokens at about 5.5
// requests/s; code completion has longer inputs (median 1,469) and very short outputs
// (median 13) at about 2.6 requests/s.
var (
	Conversation = Shape{Name: "conversation", Rate: 5.5, BurstFactor: 3, BurstEvery: 5 * time.Minute, BurstLength: 20 * time.Second,
		SwellPeriod: 20 * time.Minute, SwellDepth: 0.25,
		InputMu: 6.93, InputSigma: 0.99, OutputMu: 4.86, OutputSigma: 0.86, MinInput: 1, MaxInput: 14_050, MinOutput: 7, MaxOutput: 1_000}
	Code = Shape{Name: "code", Rate: 2.6, BurstFactor: 4, BurstEvery: 4 * time.Minute, BurstLength: 15 * time.Second,
		SwellPeriod: 20 * time.Minute, SwellDepth: 0.3,
		InputMu: 7.29, InputSigma: 1.36, OutputMu: 2.565, OutputSigma: 0.85, MinInput: 1, MaxInput: 7_437, MinOutput: 6, MaxOutput: 1_899}
)

// rate is the arrival rate at t.
func (s *Shape) rate(t time.Duration, burstUntil time.Duration) float64 {
	r := s.Rate
	if s.SwellPeriod > 0 {
		r *= 1 + s.SwellDepth*math.Sin(2*math.Pi*t.Seconds()/s.SwellPeriod.Seconds())
	}
	if t < burstUntil {
		r *= s.BurstFactor
	}
	return max(r, 1e-6)
}

// Generate returns d's worth of requests shaped like s, the same for the same seed.
// Arrivals are Poisson with a rate that swells sinusoidally and jumps by BurstFactor during
// bursts, which start at exponentially distributed intervals averaging BurstEvery.
func Generate(s Shape, d time.Duration, seed uint64) []Record {
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	var out []Record
	nextBurst := expDur(rng, s.BurstEvery)
	burstUntil := time.Duration(0)
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / s.rate(t, burstUntil) * float64(time.Second))
		if t >= d {
			return out
		}
		if s.BurstEvery > 0 && t >= nextBurst {
			burstUntil = t + s.BurstLength
			nextBurst = t + expDur(rng, s.BurstEvery)
		}
		out = append(out, Record{At: t,
			Input:  clamp(int64(math.Exp(s.InputMu+s.InputSigma*rng.NormFloat64())), s.MinInput, s.MaxInput),
			Output: clamp(int64(math.Exp(s.OutputMu+s.OutputSigma*rng.NormFloat64())), s.MinOutput, s.MaxOutput)})
	}
}

func expDur(rng *rand.Rand, mean time.Duration) time.Duration {
	if mean <= 0 {
		return math.MaxInt64
	}
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
