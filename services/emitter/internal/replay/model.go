package replay

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Model is the latency model of a simulated replay, that of a continuously batching
// inference server (vLLM, TGI):
//
//	load   = requests in flight when the request arrives (in trace time)
//	TTFT   = (BaseTTFT + input × PrefillPerToken) × (1 + QueuePerLoad × load) × jitter
//	TPOT   = BaseTPOT × (1 + DecodePerLoad × load) × jitter
//	total  = TTFT + TPOT × (output − 1)
//
// Prefill is linear in the prompt, so long prompts get long TTFTs; decode steps slow down as
// the batch grows, so TPOT rises with load. jitter is log-normal with σ = Jitter. A request
// fails with probability ErrorRate (half of them 429, half 500), and one whose total would pass
// Timeout ends as a timeout at Timeout. Incidents change all of these for a while. The
// longest gap between two tokens (max_itl_ms) is reported as three TPOTs, the usual spread
// of a decode step that waits for a prefill batched alongside it.
type Model struct {
	BaseTTFT        time.Duration
	PrefillPerToken time.Duration
	BaseTPOT        time.Duration
	QueuePerLoad    float64
	DecodePerLoad   float64
	Jitter          float64
	ErrorRate       float64
	Timeout         time.Duration
}

// DefaultModel resembles a 70B model on one H100 node: 150 ms base TTFT, 0.15 ms of prefill
// per input token (about 1.2 s for 8k tokens), 25 ms TPOT, both degrading with load.
var DefaultModel = Model{BaseTTFT: 150 * time.Millisecond, PrefillPerToken: 150 * time.Microsecond,
	BaseTPOT: 25 * time.Millisecond, QueuePerLoad: 0.01, DecodePerLoad: 0.004, Jitter: 0.15,
	ErrorRate: 0.002, Timeout: 600 * time.Second}

// Validate names the first of the command's flags that sets a field m cannot use: a
// negative duration or growth, or an error rate outside 0–1 (NaN included).
func (m Model) Validate() error {
	for _, d := range [...]struct {
		flag string
		v    time.Duration
	}{{"-model-ttft", m.BaseTTFT}, {"-model-prefill", m.PrefillPerToken}, {"-model-tpot", m.BaseTPOT}} {
		if d.v < 0 {
			return fmt.Errorf("%s=%s must not be negative", d.flag, d.v)
		}
	}
	for _, f := range [...]struct {
		flag string
		v    float64
	}{{"-model-queue", m.QueuePerLoad}, {"-model-decode", m.DecodePerLoad}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%s=%g must be a number, 0 or more", f.flag, f.v)
		}
	}
	if !(m.ErrorRate >= 0 && m.ErrorRate <= 1) {
		return fmt.Errorf("-model-errors=%g must be between 0 and 1", m.ErrorRate)
	}
	return nil
}

// positive reports whether f is a finite number above 0.
func positive(f float64) bool { return f > 0 && !math.IsInf(f, 0) }

// Incident is a stretch of time (in trace time) where the service degrades.
type Incident struct {
	Start, Duration time.Duration
	TTFTFactor      float64 // multiplies TTFT (1 = unchanged)
	TPOTFactor      float64
	ErrorRate       float64 // replaces the model's error rate when above it
}

// ParseIncident reads "start=10m,for=2m,ttft=4,tpot=2,errors=0.1"; start and for are required.
func ParseIncident(s string) (Incident, error) {
	in := Incident{TTFTFactor: 1, TPOTFactor: 1, Duration: -1, Start: -1}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return in, fmt.Errorf("incident %q: %q is not key=value", s, kv)
		}
		var err error
		switch k {
		case "start":
			in.Start, err = time.ParseDuration(v)
		case "for":
			in.Duration, err = time.ParseDuration(v)
		case "ttft":
			in.TTFTFactor, err = strconv.ParseFloat(v, 64)
		case "tpot":
			in.TPOTFactor, err = strconv.ParseFloat(v, 64)
		case "errors":
			in.ErrorRate, err = strconv.ParseFloat(v, 64)
		default:
			return in, fmt.Errorf("incident %q: unknown key %q (start, for, ttft, tpot, errors)", s, k)
		}
		if err != nil {
			return in, fmt.Errorf("incident %q: %s=%q: %w", s, k, v, err)
		}
	}
	switch {
	case in.Start < 0 || in.Duration <= 0:
		return in, fmt.Errorf("incident %q: start and a positive for are required", s)
	case !positive(in.TTFTFactor) || !positive(in.TPOTFactor):
		return in, fmt.Errorf("incident %q: ttft and tpot factors must be positive numbers", s)
	case !(in.ErrorRate >= 0 && in.ErrorRate <= 1): // NaN too
		return in, fmt.Errorf("incident %q: errors must be between 0 and 1", s)
	}
	return in, nil
}

// Sample is one simulated request's measurements.
type Sample struct {
	TTFT, Total time.Duration
	Status      events.Status
	ErrorCode   string
	HTTPStatus  int
	Load        int
}

// Simulator applies a Model to records in trace order. It is deterministic for a seed.
type Simulator struct {
	model     Model
	incidents []Incident
	rng       *rand.Rand
	ends      endHeap // trace-time ends of the requests in flight
}

// NewSimulator returns a simulator of model with incidents.
func NewSimulator(model Model, incidents []Incident, seed uint64) *Simulator {
	return &Simulator{model: model, incidents: incidents, rng: rand.New(rand.NewPCG(seed, seed^0xda3e39cb94b95bdb))}
}

// Next simulates rec; records must come in order of At.
func (s *Simulator) Next(rec Record) Sample {
	for len(s.ends) > 0 && s.ends[0] <= rec.At {
		heap.Pop(&s.ends)
	}
	load := len(s.ends)
	m := s.model
	ttftF, tpotF, errRate := 1.0, 1.0, m.ErrorRate
	for _, in := range s.incidents {
		if rec.At >= in.Start && rec.At < in.Start+in.Duration {
			ttftF *= in.TTFTFactor
			tpotF *= in.TPOTFactor
			errRate = max(errRate, in.ErrorRate)
		}
	}
	jitter := func() float64 { return math.Exp(m.Jitter * s.rng.NormFloat64()) }
	ttft := time.Duration(float64(m.BaseTTFT+time.Duration(rec.Input)*m.PrefillPerToken) * (1 + m.QueuePerLoad*float64(load)) * ttftF * jitter())
	tpot := time.Duration(float64(m.BaseTPOT) * (1 + m.DecodePerLoad*float64(load)) * tpotF * jitter())
	smp := Sample{Load: load, Status: events.StatusOK, TTFT: ttft, Total: ttft + tpot*time.Duration(max(rec.Output-1, 0))}
	if s.rng.Float64() < errRate {
		smp.Status, smp.TTFT = events.StatusError, 0
		smp.Total = time.Duration(float64(m.BaseTTFT) * jitter())
		smp.HTTPStatus = 500
		if s.rng.IntN(2) == 0 {
			smp.HTTPStatus = 429
		}
		smp.ErrorCode = strconv.Itoa(smp.HTTPStatus)
	} else if m.Timeout > 0 && smp.Total > m.Timeout {
		smp.Status, smp.ErrorCode, smp.Total = events.StatusTimeout, "upstream_timeout", m.Timeout
		if smp.TTFT > m.Timeout {
			smp.TTFT = 0
		}
	}
	heap.Push(&s.ends, rec.At+smp.Total)
	return smp
}

type endHeap []time.Duration

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
