package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// gpuSamples makes n samples a second apart per host and GPU from base: utilisation is a
// whole percentage, every fifth sample is throttled (and every seventh only idle, which is
// no throttle).
// gpuSamples returns n seconds of samples of gpus GPUs per host, as gpuwatch sends them: each
// but a GPU's first carries energy_used_j, the delta of its energy counter.
func gpuSamples(hosts []string, gpus int, base time.Time, n int) []events.GPUSample {
	var out []events.GPUSample
	counters := map[string]float64{}
	for i := range n {
		for h, host := range hosts {
			for g := range gpus {
				util, used, total := float64((i*7+h*3+g)%101), uint64(1<<30+i*1024+g), uint64(80<<30)
				uuid := fmt.Sprintf("GPU-%s-%d", host, g)
				s := events.GPUSample{V: 1, TS: base.Add(time.Duration(i) * time.Second), Host: host, GPUIndex: g,
					GPUUUID: uuid, GPUName: "H200", UtilGPUPct: &util, MemUsedBytes: &used, MemTotalBytes: &total}
				energy := counters[uuid] + 100 + float64((i*5+h+g)%50) + 0.25
				if i == 0 {
					energy = 1e6 * float64(h+1)
				} else {
					d := energy - counters[uuid]
					s.EnergyUsedJ = &d
				}
				counters[uuid] = energy
				s.EnergyJ = &energy
				switch {
				case i%5 == 0:
					r := uint64(0x4)
					s.ThrottleReasons = &r
				case i%7 == 0:
					r := uint64(0x1)
					s.ThrottleReasons = &r
				}
				out = append(out, s)
			}
		}
	}
	return out
}

func (b *bed) publishGPU(t testing.TB, samples []events.GPUSample) {
	t.Helper()
	publishAll(t, b.js, samples, func(s *events.GPUSample) (string, string, []byte, error) {
		data, err := json.Marshal(s)
		return events.GPUSampleSubject(s.Host), s.GPUUUID + "/" + events.FormatTS(s.TS), data, err
	})
}

// gpuTotals are what the rollups of samples must add up to.
type gpuTotals struct {
	samples, throttled uint64
	util               float64 // sum of the samples' utilisation
	utilMax            float64
	memUsedMax         uint64
	energy             float64 // joules used
}

func wantGPU(samples []events.GPUSample) gpuTotals {
	var w gpuTotals
	for _, s := range samples {
		w.samples++
		w.util += *s.UtilGPUPct
		w.utilMax = max(w.utilMax, *s.UtilGPUPct)
		w.memUsedMax = max(w.memUsedMax, *s.MemUsedBytes)
		if s.EnergyUsedJ != nil {
			w.energy += *s.EnergyUsedJ
		}
		if s.ThrottleReasons != nil && *s.ThrottleReasons&^1 != 0 {
			w.throttled++
		}
	}
	return w
}

func (b *bed) gpuTotals(t testing.TB) gpuTotals {
	t.Helper()
	var g gpuTotals
	q := `SELECT sum(samples), sum(throttled_samples), sum(util_avg * samples), max(util_max), max(mem_used_max), sum(energy_j) FROM gpu_rollups`
	if err := b.db.Conn().QueryRow(context.Background(), q).Scan(&g.samples, &g.throttled, &g.util, &g.utilMax, &g.memUsedMax, &g.energy); err != nil {
		t.Fatal(err)
	}
	return g
}

func checkGPUTotals(t testing.TB, got, want gpuTotals) {
	t.Helper()
	if got.samples != want.samples || got.throttled != want.throttled || math.Abs(got.util-want.util) > 1e-6*max(1, want.util) ||
		got.utilMax != want.utilMax || got.memUsedMax != want.memUsedMax || math.Abs(got.energy-want.energy) > 1e-9*max(1, want.energy) {
		t.Fatalf("gpu_rollups add up to %+v, want %+v", got, want)
	}
}

// TestGPURollups: GPU samples of two hosts become one gpu_rollups row per window × GPU,
// and each row is published on rollup.gpu.<host> once stored, with the message id
// <flush_id>-<i> of the flush that stored it. A GPU sample that breaks the contract is a
// dead letter and changes nothing.
func TestGPURollups(t *testing.T) {
	b := newBed(t)
	dead, err := b.nc.SubscribeSync(events.SubjectInvalid)
	if err != nil {
		t.Fatal(err)
	}
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms"}))
	base := time.Now().UTC().Add(-time.Minute).Truncate(2 * time.Second)
	samples := gpuSamples([]string{"gpu-node-1", "gpu-node.2"}, 2, base, 10) // 5 windows × 4 GPUs
	b.publishGPU(t, samples)
	b.publishRaw(t, "gpu.sample.gpu-node-1", []byte(`{"v":1,"ts":"`+events.FormatTS(base)+`","host":"gpu-node-1","gpu_index":0,"gpu_uuid":"GPU-x","util_gpu_pct":101}`))
	b.waitRows(t, 30*time.Second, uint64(len(samples)), "SELECT sum(samples) FROM gpu_rollups")
	checkGPUTotals(t, b.gpuTotals(t), wantGPU(samples))
	if n := b.scalar(t, "SELECT count() FROM gpu_rollups"); n != 20 {
		t.Fatalf("%d rows, want 20 (5 windows × 4 GPUs)", n)
	}
	// One window of one GPU, exactly: seconds 2 and 3 of gpu-node.2's GPU 1 (h = 1, g = 1).
	var utilAvg, utilMax float64
	var throttled uint64
	if err := b.db.Conn().QueryRow(context.Background(), `SELECT util_avg, util_max, throttled_samples
		FROM gpu_rollups WHERE host = 'gpu-node.2' AND gpu_index = 1 AND window_start = ?`, base.Add(2*time.Second)).Scan(&utilAvg, &utilMax, &throttled); err != nil {
		t.Fatal(err)
	}
	if utilAvg != (18+25)/2.0 || utilMax != 25 || throttled != 0 {
		t.Fatalf("window 2 of gpu-node.2/1: util %v/%v throttled %d", utilAvg, utilMax, throttled)
	}
	msg, err := dead.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal("no dead letter for the invalid GPU sample")
	}
	if !strings.Contains(string(msg.Data), "util_gpu_pct") {
		t.Fatalf("dead letter %s", msg.Data)
	}

	flushes := map[string]bool{}
	rows, err := b.db.Conn().Query(context.Background(), "SELECT DISTINCT flush_id FROM gpu_rollups")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		flushes[id] = true
	}
	rows.Close()

	// Published after they were stored: one message per row, each valid JSON of the row.
	deadline := time.Now().Add(10 * time.Second)
	var rollups []events.GPURollup
	var ids []string
	for {
		rollups, ids = rollups[:0], ids[:0]
		for _, m := range b.rollupsStream(t) {
			if !strings.HasPrefix(m.subject, "rollup.gpu.") {
				continue
			}
			var r events.GPURollup
			if err := json.Unmarshal(m.data, &r); err != nil {
				t.Fatal(err)
			}
			if m.subject != events.GPURollupSubject(r.Host) {
				t.Fatalf("rollup of %s on %s", r.Host, m.subject)
			}
			rollups, ids = append(rollups, r), append(ids, m.id)
		}
		if len(rollups) >= 20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(rollups) != 20 {
		t.Fatalf("%d GPU rollups published, want 20", len(rollups))
	}
	var sum uint64
	for _, r := range rollups {
		sum += r.Samples
	}
	if sum != uint64(len(samples)) {
		t.Fatalf("published rollups hold %d samples, want %d", sum, len(samples))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		i := strings.LastIndexByte(id, '-')
		if i < 0 || !flushes[id[:i]] || seen[id] {
			t.Fatalf("message id %q: not <flush_id>-<i> of a stored flush %v, or seen twice", id, flushes)
		}
		if _, err := strconv.Atoi(id[i+1:]); err != nil {
			t.Fatalf("message id %q: %v", id, err)
		}
		seen[id] = true
	}
}

// TestGPUCrashExactlyOnce SIGKILLs the aggregator process at random points while GPU
// samples arrive, restarting it each time: the gpu_rollups add up to the samples exactly,
// every one counted once, with plain sum(), energy included.
func TestGPUCrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the aggregator repeatedly")
	}
	b := newBed(t)
	bin := buildBinary(t)
	base := time.Now().UTC().Add(-2 * time.Minute).Truncate(2 * time.Second)
	hosts := make([]string, 8)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("gpu-node-%d", i)
	}
	samples := gpuSamples(hosts, 4, base, 60) // 30 windows × 32 GPUs
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "50ms", "AGG_LOG_LEVEL": "warn"})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := 0; i < len(samples); i += 64 {
			b.publishGPU(t, samples[i:min(i+64, len(samples))])
			time.Sleep(100 * time.Millisecond)
		}
	}()
	killWhilePublishing(t, bin, vars, published, 3, 400*time.Millisecond, 800*time.Millisecond, 7)
	b.waitRows(t, time.Minute, uint64(len(samples)), "SELECT sum(samples) FROM gpu_rollups")
	time.Sleep(time.Second)
	checkGPUTotals(t, b.gpuTotals(t), wantGPU(samples))
	// Every stored GPU rollup is on ROLLUPS once, whatever the kills cut off.
	checkPublished(t, b, "aggregator", gpuRollups, uint64(len(samples)))
}
