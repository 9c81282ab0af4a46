package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// run makes 20 one-second samples of GPU 0: idle for 6 s, then loaded; change edits each.
func run(change func(i int, s *events.GPUSample)) []message {
	var out []message
	energy := 1000.0
	for i := range 20 {
		util, power := 0.0, 80.0
		if i >= 6 {
			util, power = 100, 689
		}
		if i > 0 {
			energy += (power + out[i-1].power()) / 2
		}
		s := events.GPUSample{V: 1, TS: t0.Add(time.Duration(i) * time.Second), Host: "h", GPUUUID: "GPU-1", Source: events.SourceNVML,
			UtilGPUPct: &util, PowerW: &power, EnergyJ: ptrF(energy)}
		if i > 0 {
			s.EnergyUsedJ = ptrF(energy - *out[i-1].sample.EnergyJ)
		}
		if change != nil {
			change(i, &s)
		}
		out = append(out, message{raw: appendJSON(&s), sample: s})
	}
	return out
}

func (m message) power() float64 { return *m.sample.PowerW }

func ptrF(v float64) *float64 { return &v }

func appendJSON(s *events.GPUSample) []byte {
	var b strings.Builder
	b.WriteString(`{"v":1,"ts":"` + events.FormatTS(s.TS) + `","host":"h","gpu_index":0,"gpu_uuid":"GPU-1","source":"` + s.Source + `"`)
	if s.UtilGPUPct != nil {
		b.WriteString(`,"util_gpu_pct":1`)
	}
	if s.PowerW != nil {
		b.WriteString(`,"power_w":1`)
	}
	if s.EnergyJ != nil {
		b.WriteString(`,"energy_j":1`)
	}
	if s.EnergyUsedJ != nil {
		b.WriteString(`,"energy_used_j":1`)
	}
	if s.ECCUncorrected != nil {
		b.WriteString(`,"ecc_uncorrected":0`)
	}
	b.WriteString("}")
	return []byte(b.String())
}

func TestEvaluate(t *testing.T) {
	zero := uint64(0)
	tests := []struct {
		name        string
		msgs        []message
		unsupported map[int][]string
		wantFail    string // the failing check, or "" for all passing
	}{
		{name: "a good run", msgs: run(nil), unsupported: map[int][]string{0: {"ecc_uncorrected"}}},
		{name: "utilisation flat", msgs: run(func(_ int, s *events.GPUSample) { s.UtilGPUPct = ptrF(3) }), wantFail: "utilisation rises"},
		{name: "power flat", msgs: run(func(_ int, s *events.GPUSample) { s.PowerW = ptrF(80) }), wantFail: "power rises"},
		{name: "energy falls", msgs: run(func(i int, s *events.GPUSample) {
			if i == 10 {
				s.EnergyJ = ptrF(0)
			}
		}), wantFail: "energy increases"},
		{name: "energy_used_j wrong", msgs: run(func(i int, s *events.GPUSample) {
			if i == 12 {
				*s.EnergyUsedJ += 1
			}
		}), wantFail: "energy_used_j is the counter's delta"},
		{name: "energy_used_j missing", msgs: run(func(_ int, s *events.GPUSample) { s.EnergyUsedJ = nil }), wantFail: "energy_used_j is the counter's delta"},
		{name: "energy_used_j on the first", msgs: run(func(i int, s *events.GPUSample) {
			if i == 0 {
				s.EnergyUsedJ = ptrF(3)
			}
		}), wantFail: "energy_used_j is the counter's delta"},
		{name: "energy stuck", msgs: run(func(_ int, s *events.GPUSample) { s.EnergyJ = ptrF(5) }), wantFail: "energy increases"},
		{name: "unsupported reading present", msgs: run(func(_ int, s *events.GPUSample) { s.ECCUncorrected = &zero }),
			unsupported: map[int][]string{0: {"ecc_uncorrected"}}, wantFail: "unsupported readings absent"},
		{name: "wrong source", msgs: run(func(_ int, s *events.GPUSample) { s.Source = events.SourceSynthetic }), wantFail: "every sample valid"},
		{name: "no load phase", msgs: run(nil)[:5], wantFail: "idle and loaded samples"},
		{name: "nothing", msgs: nil, wantFail: "samples arrived"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			results := evaluate(tt.msgs, events.SourceNVML, t0.Add(6*time.Second), 2*time.Second, tt.unsupported)
			var failed []string
			for _, r := range results {
				if !r.ok {
					failed = append(failed, r.name+": "+r.detail)
				}
			}
			if tt.wantFail == "" {
				if len(failed) > 0 {
					t.Fatalf("failed: %v", failed)
				}
				return
			}
			found := false
			for _, f := range failed {
				found = found || strings.Contains(f, tt.wantFail)
			}
			if !found {
				t.Fatalf("want %q to fail; failed: %v", tt.wantFail, failed)
			}
		})
	}
}

func TestUnsupportedReadings(t *testing.T) {
	m := `# TYPE gpuwatch_nvml_reading_supported gauge
gpuwatch_nvml_reading_supported{gpu="0",reading="ecc_uncorrected"} 0
gpuwatch_nvml_reading_supported{gpu="0",reading="power_w"} 1
gpuwatch_nvml_reading_supported{gpu="3",reading="pcie_tx_bps"} 0
`
	got := unsupportedReadings(m)
	if len(got) != 2 || got[0][0] != "ecc_uncorrected" || got[3][0] != "pcie_tx_bps" || len(got[0]) != 1 {
		t.Fatalf("got %v", got)
	}
}
