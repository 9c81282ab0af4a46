package replay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var start = time.Date(2027, 1, 5, 8, 0, 0, 0, time.UTC)

func TestPlayback(t *testing.T) {
	s, err := Open("testdata/two_gpus.jsonl", start)
	if err != nil {
		t.Fatal(err)
	}
	if s.Period() != 3*time.Second {
		t.Fatalf("period %s, want 3s (2s recorded plus a 1s step)", s.Period())
	}
	type want struct {
		util   []float64 // per GPU present
		energy []float64
	}
	f := func(at time.Duration, w want) {
		t.Helper()
		got := s.Sample(context.Background(), start.Add(at), nil)
		if len(got) != len(w.util) {
			t.Fatalf("at %s: %d samples, want %d", at, len(got), len(w.util))
		}
		for i, smp := range got {
			if smp.Source != events.SourceReplay {
				t.Fatalf("at %s: source %q", at, smp.Source)
			}
			if *smp.UtilGPUPct != w.util[i] || *smp.EnergyJ != w.energy[i] {
				t.Fatalf("at %s GPU %s: util %v energy %v, want %v %v", at, smp.GPUUUID, *smp.UtilGPUPct, *smp.EnergyJ, w.util[i], w.energy[i])
			}
		}
	}
	f(0, want{[]float64{0, 5}, []float64{1000, 5000}})
	f(1500*time.Millisecond, want{[]float64{100, 5}, []float64{1400, 5000}})
	f(2*time.Second, want{[]float64{100, 7}, []float64{2090, 5160}})
	// Second loop: the counters carry on from where the first loop left them.
	f(3*time.Second, want{[]float64{0, 5}, []float64{1000 + 1090, 5000 + 160}})
	f(5*time.Second, want{[]float64{100, 7}, []float64{2090 + 1090, 5160 + 160}})
	f(7*time.Second, want{[]float64{100, 5}, []float64{1400 + 2*1090, 5000 + 2*160}})
	// Before playback starts: the first samples.
	f(-time.Hour, want{[]float64{0, 5}, []float64{1000, 5000}})

	// The recording is not changed by playback.
	again := s.Sample(context.Background(), start, nil)
	if *again[0].EnergyJ != 1000 {
		t.Fatalf("playback changed the recording: energy %v", *again[0].EnergyJ)
	}
}

func TestReadRejects(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr error
		wantMsg string
	}{
		{"empty", "\n# nothing\n", nil, "no samples in 2 lines"},
		{"not JSON", `{"v":1,` + "\n", events.ErrMalformed, "line 1"},
		{"no uuid", `{"v":1,"ts":"2026-11-30T10:00:00Z","host":"h","gpu_index":0}`, events.ErrMissingField, "line 1"},
		{"bad reading", "\n" + `{"v":1,"ts":"2026-11-30T10:00:00Z","host":"h","gpu_index":0,"gpu_uuid":"G","util_gpu_pct":150}`, events.ErrOutOfRange, "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(tt.in), start)
			if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.wantErr, tt.wantMsg)
			}
		})
	}
	if _, err := Open("testdata/missing.jsonl", start); err == nil || !strings.Contains(err.Error(), "cannot open the replay file") {
		t.Fatalf("missing file: %v", err)
	}
}
