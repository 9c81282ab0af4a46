package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/nvmlsource"
)

// message is one published sample as it came off the wire.
type message struct {
	raw    []byte
	sample events.GPUSample
}

// result is one check: what was asserted, whether it held, and the figures behind it.
type result struct {
	name   string
	ok     bool
	detail string
}

// thresholds of the checks; an idle H200 draws about 75–120 W, one under a bf16 matmul
// close to its 700 W limit.
const (
	minLoadUtil   = 50.0 // % utilisation some sample under load must reach
	minPowerRiseW = 50.0 // mean power under load above mean power at idle
	energyTol     = 0.35 // energy counter delta against ∫ power dt, relative
)

// evaluate checks the samples of one run, which all must come from source. loadFrom is when the load started; samples
// before it are the idle baseline, samples from settle after it the loaded phase.
// unsupported maps a GPU index to the readings gpuwatch reported as unsupported.
func evaluate(msgs []message, source string, loadFrom time.Time, settle time.Duration, unsupported map[int][]string) []result {
	var out []result
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, result{name, ok, fmt.Sprintf(format, args...)})
	}
	byGPU := map[int][]message{}
	for _, m := range msgs {
		byGPU[m.sample.GPUIndex] = append(byGPU[m.sample.GPUIndex], m)
	}
	add("samples arrived", len(byGPU) > 0, "%d samples from %d GPUs", len(msgs), len(byGPU))
	invalid := 0
	var firstInvalid string
	for _, m := range msgs {
		if err := m.sample.ValidateAt(m.sample.TS); err != nil || m.sample.Source != source || strings.Contains(string(m.raw), "null") {
			if invalid == 0 {
				firstInvalid = fmt.Sprintf("%v source=%q %s", err, m.sample.Source, m.raw)
			}
			invalid++
		}
	}
	add("every sample valid, from "+source+", without nulls", invalid == 0, "%d bad; first: %s", invalid, firstInvalid)

	keys := map[string][]string{}
	for _, f := range nvmlsource.Fields() {
		keys[f.Name] = f.Keys
	}
	gpus := make([]int, 0, len(byGPU))
	for g := range byGPU {
		gpus = append(gpus, g)
	}
	sort.Ints(gpus)
	for _, g := range gpus {
		ms := byGPU[g]
		var idle, load []events.GPUSample
		for _, m := range ms {
			switch {
			case m.sample.TS.Before(loadFrom):
				idle = append(idle, m.sample)
			case !m.sample.TS.Before(loadFrom.Add(settle)):
				load = append(load, m.sample)
			}
		}
		p := fmt.Sprintf("GPU %d: ", g)
		add(p+"idle and loaded samples", len(idle) >= 2 && len(load) >= 2, "%d idle, %d loaded", len(idle), len(load))

		idleUtil, _ := mean(idle, func(s events.GPUSample) *float64 { return s.UtilGPUPct })
		loadUtil, maxUtil := mean(load, func(s events.GPUSample) *float64 { return s.UtilGPUPct })
		add(p+"utilisation rises", maxUtil >= minLoadUtil && loadUtil > idleUtil,
			"idle mean %.1f %%, loaded mean %.1f %%, loaded max %.1f %% (want max ≥ %.0f %%)", idleUtil, loadUtil, maxUtil, minLoadUtil)

		idleW, _ := mean(idle, func(s events.GPUSample) *float64 { return s.PowerW })
		loadW, maxW := mean(load, func(s events.GPUSample) *float64 { return s.PowerW })
		add(p+"power rises", loadW-idleW >= minPowerRiseW,
			"idle mean %.1f W, loaded mean %.1f W, max %.1f W (want a rise ≥ %.0f W)", idleW, loadW, maxW, minPowerRiseW)

		ok, detail := energyCheck(ms)
		out = append(out, result{p + "energy increases with power", ok, detail})
		ok, detail = energyUsedCheck(ms)
		out = append(out, result{p + "energy_used_j is the counter's delta", ok, detail})

		var absentWrong []string
		for _, reading := range unsupported[g] {
			for _, k := range keys[reading] {
				for _, m := range ms {
					var doc map[string]json.RawMessage
					if json.Unmarshal(m.raw, &doc) == nil {
						if _, present := doc[k]; present {
							absentWrong = append(absentWrong, k)
							break
						}
					}
				}
			}
		}
		add(p+"unsupported readings absent", len(absentWrong) == 0,
			"unsupported per gpuwatch: %v; present anyway: %v; readings seen: %s",
			unsupported[g], absentWrong, strings.Join(present(ms), " "))
	}
	return out
}

// energyCheck asserts the energy counter never falls, grows over the run, and grows by
// about the integral of the power readings.
func energyCheck(ms []message) (bool, string) {
	var prev *events.GPUSample
	var first, last *events.GPUSample
	integral := 0.0
	for i := range ms {
		s := &ms[i].sample
		if s.EnergyJ == nil || s.PowerW == nil {
			continue
		}
		if prev != nil {
			if *s.EnergyJ < *prev.EnergyJ {
				return false, fmt.Sprintf("counter fell from %.3f J to %.3f J at %s", *prev.EnergyJ, *s.EnergyJ, s.TS.Format(time.RFC3339Nano))
			}
			integral += (*s.PowerW + *prev.PowerW) / 2 * s.TS.Sub(prev.TS).Seconds()
		} else {
			first = s
		}
		prev, last = s, s
	}
	if first == nil || first == last {
		return false, "fewer than two samples with energy and power"
	}
	delta := *last.EnergyJ - *first.EnergyJ
	rel := math.Abs(delta-integral) / integral
	return delta > 0 && rel <= energyTol, fmt.Sprintf("counter +%.1f J over %s; ∫ power dt %.1f J (off by %.0f %%, want ≤ %.0f %%)",
		delta, last.TS.Sub(first.TS), integral, 100*rel, 100*energyTol)
}

// energyUsedCheck asserts each sample's energy_used_j is its energy counter's delta since the
// GPU's previous sample with the counter, and that the first such sample has none.
func energyUsedCheck(ms []message) (bool, string) {
	var prev *events.GPUSample
	n := 0
	for i := range ms {
		s := &ms[i].sample
		if s.EnergyJ == nil {
			continue
		}
		switch {
		case prev == nil && s.EnergyUsedJ != nil:
			return false, fmt.Sprintf("the first sample with the counter has energy_used_j %.3f J", *s.EnergyUsedJ)
		case prev == nil:
		case s.EnergyUsedJ == nil:
			if *s.EnergyJ >= *prev.EnergyJ {
				return false, fmt.Sprintf("no energy_used_j at %s though the counter rose", s.TS.Format(time.RFC3339Nano))
			}
		default:
			want := *s.EnergyJ - *prev.EnergyJ
			if math.Abs(*s.EnergyUsedJ-want) > 1e-9*max(1, *s.EnergyJ) {
				return false, fmt.Sprintf("energy_used_j %.6f J at %s, want the counter's delta %.6f J", *s.EnergyUsedJ, s.TS.Format(time.RFC3339Nano), want)
			}
			n++
		}
		prev = s
	}
	return n > 0, fmt.Sprintf("%d samples carry the counter's delta", n)
}

func mean(ss []events.GPUSample, get func(events.GPUSample) *float64) (avg, maxV float64) {
	n := 0
	for _, s := range ss {
		if v := get(s); v != nil {
			avg += *v
			maxV = max(maxV, *v)
			n++
		}
	}
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	return avg / float64(n), maxV
}

// present lists the sample keys seen in any of ms.
func present(ms []message) []string {
	seen := map[string]bool{}
	for _, m := range ms {
		var doc map[string]json.RawMessage
		if json.Unmarshal(m.raw, &doc) == nil {
			for k := range doc {
				seen[k] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
