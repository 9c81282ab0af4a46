package sampler

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
)

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func h200(i int) events.GPUSample {
	return events.GPUSample{
		GPUIndex: i, GPUUUID: "GPU-5e6f7a8b-1111-2222-3333-44445555666" + string(rune('0'+i)), GPUName: "NVIDIA H200", Source: events.SourceNVML,
		UtilGPUPct: ptr(100.0), UtilMemPct: ptr(71.0),
		MemUsedBytes: ptr(uint64(120000000000)), MemTotalBytes: ptr(uint64(150754820096)),
		PowerW: ptr(689.2), PowerLimitW: ptr(700.0), EnergyJ: ptr(123456789.5), TempC: ptr(54.0),
		SMClockMHz: ptr(1410.0), MemClockMHz: ptr(3201.0), PCIeTxBps: ptr(1.2e9), PCIeRxBps: ptr(3.4e8),
		NVLinkTxBps: ptr(2.5e11), NVLinkRxBps: ptr(2.4e11),
		ThrottleReasons: ptr(uint64(4)), ECCUncorrected: ptr(uint64(0)),
	}
}

// fakeSource returns its samples, copied, at every tick, and records the tick times.
type fakeSource struct {
	mu      sync.Mutex
	samples []events.GPUSample
	ticks   []time.Time
}

func (f *fakeSource) Sample(_ context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ticks = append(f.ticks, now)
	return append(dst, f.samples...)
}

type published struct{ subject, id, data string }

type fakePublisher struct {
	mu   sync.Mutex
	msgs []published
}

func (p *fakePublisher) Publish(subject, msgID string, data []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, published{subject, msgID, string(data)})
	return true
}

type fakeExporter struct{ got []events.GPUSample }

func (e *fakeExporter) Update(s []events.GPUSample) { e.got = append(e.got[:0], s...) }

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestTick(t *testing.T) {
	bad := h200(1)
	bad.UtilGPUPct = ptr(150.0)               // a source bug must not reach the wire
	bad.MemUsedBytes = ptr(uint64(200 << 30)) // above mem_total_bytes
	sparse := events.GPUSample{GPUIndex: 2, GPUUUID: "GPU-0", Source: events.SourceSynthetic, UtilGPUPct: ptr(12.5)}
	noUUID := events.GPUSample{GPUIndex: 3, UtilGPUPct: ptr(12.5)} // nothing to publish it as
	src := &fakeSource{samples: []events.GPUSample{h200(0), bad, sparse, noUUID}}
	pub := &fakePublisher{}
	exp := &fakeExporter{}
	reg := prometheus.NewRegistry()
	s := New(src, pub, exp, Options{Host: "gpu-node.3", Interval: time.Second}, reg, discard())
	s.Tick(context.Background(), t0)

	if len(pub.msgs) != 3 {
		t.Fatalf("published %d, want 3", len(pub.msgs))
	}
	// The bad sample goes out without its bad readings: the good ones beside them are kept.
	fixed := h200(1)
	fixed.UtilGPUPct, fixed.MemUsedBytes = nil, nil
	for i, want := range []events.GPUSample{h200(0), fixed, sparse} {
		m := pub.msgs[i]
		if m.subject != "gpu.sample.gpu-node_3" {
			t.Errorf("subject %q", m.subject)
		}
		if wantID := "gpu-node.3/" + want.GPUUUID + "/2026-11-30T10:00:00.000Z"; m.id != wantID {
			t.Errorf("msg id %q, want %q", m.id, wantID)
		}
		var got events.GPUSample
		if err := events.UnmarshalGPUSample([]byte(m.data), &got); err != nil {
			t.Fatal(err)
		}
		want.V, want.TS, want.Host = events.Version, t0, "gpu-node.3"
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decoded\n%+v\nwant\n%+v", got, want)
		}
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("out_of_range")); v != 2 {
		t.Errorf("readings_dropped{out_of_range} = %v, want 2", v)
	}
	if v := testutil.ToFloat64(s.m.invalid.WithLabelValues("missing_field")); v != 1 {
		t.Errorf("invalid{missing_field} = %v, want 1", v)
	}
	if len(exp.got) != 3 || exp.got[2].GPUUUID != "GPU-0" || exp.got[0].Host != "gpu-node.3" {
		t.Errorf("exporter got %+v", exp.got)
	}
	if v := testutil.ToFloat64(s.m.samples); v != 3 {
		t.Errorf("samples_total = %v", v)
	}
	if s.LastTick().IsZero() {
		t.Error("LastTick not set")
	}
}

// flakyPublisher refuses the messages whose index (from 0) is in refuse.
type flakyPublisher struct {
	fakePublisher
	n      int
	refuse map[int]bool
}

func (p *flakyPublisher) Publish(subject, msgID string, data []byte) bool {
	p.n++
	if p.refuse[p.n-1] {
		return false
	}
	return p.fakePublisher.Publish(subject, msgID, data)
}

// TestTickEnergyUsed: each published sample carries the energy its GPU used since the GPU's
// previous published sample with the counter, from the counter's delta; the first carries
// none, nor does one after a counter reset; a sample that was not queued, or that lacks the
// counter, is spanned by the next delta; a source's own value never reaches the wire.
func TestTickEnergyUsed(t *testing.T) {
	counters := []*float64{ptr(1000.0), ptr(1700.5), ptr(2400.0), nil, ptr(3800.0), ptr(4500.0), ptr(10.0), ptr(710.0)}
	// want: the energy_used_j of each published tick's sample (tick 2 is refused by the bus).
	want := map[int]*float64{0: nil, 1: ptr(700.5), 3: nil, 4: ptr(3800.0 - 1700.5), 5: ptr(700.0), 6: nil, 7: ptr(700.0)}
	src := &fakeSource{}
	pub := &flakyPublisher{refuse: map[int]bool{2: true}}
	s := New(src, pub, &fakeExporter{}, Options{Host: "h", Interval: time.Second}, prometheus.NewRegistry(), discard())
	for i, c := range counters {
		smp := events.GPUSample{GPUIndex: 0, GPUUUID: "GPU-0", PowerW: ptr(700.0), EnergyJ: c, EnergyUsedJ: ptr(1e6)}
		src.samples = []events.GPUSample{smp}
		s.Tick(context.Background(), t0.Add(time.Duration(i)*time.Second))
	}
	if len(pub.msgs) != len(want) {
		t.Fatalf("published %d, want %d", len(pub.msgs), len(want))
	}
	for _, m := range pub.msgs {
		var got events.GPUSample
		if err := events.UnmarshalGPUSample([]byte(m.data), &got); err != nil {
			t.Fatal(err)
		}
		if err := got.ValidateAt(t0.Add(time.Minute)); err != nil {
			t.Fatalf("%s: %v", m.data, err)
		}
		i := int(got.TS.Sub(t0) / time.Second)
		w, ok := want[i]
		switch {
		case !ok:
			t.Fatalf("tick %d published, but its sample was refused", i)
		case w == nil && got.EnergyUsedJ != nil:
			t.Errorf("tick %d: energy_used_j %v, want none", i, *got.EnergyUsedJ)
		case w != nil && (got.EnergyUsedJ == nil || *got.EnergyUsedJ != *w):
			t.Errorf("tick %d: energy_used_j %v, want %v (%s)", i, got.EnergyUsedJ, *w, m.data)
		}
	}
	// A GPU silent past the horizon starts afresh: its old reading is gone.
	src.samples = []events.GPUSample{{GPUIndex: 0, GPUUUID: "GPU-0", EnergyJ: ptr(5000.0)}}
	s.Tick(context.Background(), t0.Add(2*time.Hour))
	if len(s.energy) != 1 || !strings.Contains(pub.msgs[len(pub.msgs)-1].data, `"energy_j":5000`) || strings.Contains(pub.msgs[len(pub.msgs)-1].data, "energy_used_j") {
		t.Fatalf("after two silent hours: %d readings, last message %s", len(s.energy), pub.msgs[len(pub.msgs)-1].data)
	}
}

// TestBadReadingsLoggedOnce: a sick GPU whose temperature and power read as garbage at
// every tick, another whose power does, each with values that change, are logged once per
// GPU and reading, not at every tick; a reading that breaks again after a good tick is
// logged again.
func TestBadReadingsLoggedOnce(t *testing.T) {
	src := &fakeSource{}
	var log bytes.Buffer
	s := New(src, &fakePublisher{}, &fakeExporter{}, Options{Host: "h", Interval: time.Second}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(&log, nil)))
	tick := func(i int, sick bool) {
		a, b := h200(0), h200(1)
		if sick {
			a.TempC, a.PowerW = ptr(4.29e9+float64(i)), ptr(4.29e6+float64(i))
		}
		b.PowerW = ptr(2e5 + float64(i))
		src.samples = []events.GPUSample{a, b}
		s.Tick(context.Background(), t0.Add(time.Duration(i)*time.Second))
	}
	for i := range 5 {
		tick(i, true)
	}
	if got := strings.Count(log.String(), "left out of the sample"); got != 3 {
		t.Errorf("%d lines over 5 ticks, want 3 (GPU 0's temperature and power, GPU 1's power):\n%s", got, log.String())
	}
	tick(5, false) // GPU 0 well again
	tick(6, true)  // and sick again
	if got := strings.Count(log.String(), "left out of the sample"); got != 5 {
		t.Errorf("%d lines, want 5: GPU 0's two readings logged again once they broke again:\n%s", got, log.String())
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("out_of_range")); v != 5*3+1+3 {
		t.Errorf("readings_dropped_total{out_of_range} = %v, want %d", v, 5*3+1+3)
	}
}

// TestEncode checks the hand-written encoder against encoding/json, the Go decoder and the
// JSON Schema other languages read.
func TestEncode(t *testing.T) {
	raw, err := fs.ReadFile(schemas.JSON, "gpu_sample.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("gpu_sample.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("gpu_sample.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	quoted := h200(0)
	quoted.GPUName = "NVIDIA \"H200\"\n\x01é"
	for name, s := range map[string]events.GPUSample{
		"full":   h200(0),
		"sparse": {GPUIndex: 0, GPUUUID: "GPU-0"},
		"quoted": quoted,
		"tiny":   {GPUIndex: 1023, GPUUUID: "GPU-1", PCIeTxBps: ptr(1e-7), EnergyJ: ptr(events.MaxEnergyJ)},
		"used":   {GPUIndex: 2, GPUUUID: "GPU-2", EnergyJ: ptr(123457478.7), EnergyUsedJ: ptr(689.2)},
	} {
		t.Run(name, func(t *testing.T) {
			s.V, s.TS, s.Host = events.Version, t0.Add(123*time.Millisecond), "h"
			got := appendSample(nil, &s)
			want, err := json.Marshal(&s)
			if err != nil {
				t.Fatal(err)
			}
			var a, b map[string]any
			if err := json.Unmarshal(got, &a); err != nil {
				t.Fatalf("not JSON: %s: %v", got, err)
			}
			if err := json.Unmarshal(want, &b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("appendSample\n%s\nencoding/json\n%s", got, want)
			}
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(got))
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(inst); err != nil {
				t.Fatalf("schema rejects %s: %v", got, err)
			}
		})
	}
}

// TestRun runs the loop at 20 ms: ticks fall on multiples of the interval, in order.
func TestRun(t *testing.T) {
	src := &fakeSource{samples: []events.GPUSample{h200(0)}}
	pub := &fakePublisher{}
	const interval = 20 * time.Millisecond
	s := New(src, pub, &fakeExporter{}, Options{Host: "h", Interval: interval}, prometheus.NewRegistry(), discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		src.mu.Lock()
		n := len(src.ticks)
		src.mu.Unlock()
		if n >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ticks in 10s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	for i, tk := range src.ticks {
		if !tk.Equal(tk.Truncate(interval)) {
			t.Errorf("tick %d at %s is not a multiple of %s", i, tk.Format(time.RFC3339Nano), interval)
		}
		if i > 0 && !tk.After(src.ticks[i-1]) {
			t.Errorf("tick %d at %s not after the one before", i, tk)
		}
	}
	if got := testutil.ToFloat64(s.m.ticks); int(got) != len(src.ticks) {
		t.Errorf("ticks_total %v, source saw %d", got, len(src.ticks))
	}
}

func TestNextTick(t *testing.T) {
	f := func(at string, d time.Duration, want string) {
		t.Helper()
		now, _ := time.Parse(time.RFC3339Nano, at)
		if got := nextTick(now, d).Format(time.RFC3339Nano); got != want {
			t.Errorf("nextTick(%s, %s) = %s, want %s", at, d, got, want)
		}
	}
	f("2026-11-30T10:00:00.3Z", time.Second, "2026-11-30T10:00:01Z")
	f("2026-11-30T10:00:00Z", time.Second, "2026-11-30T10:00:01Z")
	f("2026-11-30T10:00:07.9Z", 5*time.Second, "2026-11-30T10:00:10Z")
}

func BenchmarkTick8GPUs(b *testing.B) {
	src := &fakeSource{}
	for i := range 8 {
		src.samples = append(src.samples, h200(i))
	}
	s := New(src, nopPublisher{}, &fakeExporter{}, Options{Host: "gpu-node-3", Interval: time.Second}, nil, discard())
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		src.ticks = src.ticks[:0]
		now = now.Add(time.Second)
		s.Tick(context.Background(), now)
	}
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, string, []byte) bool { return true }

type fakeHost struct{ s events.HostSample }

func (h *fakeHost) Read(time.Time) events.HostSample { return h.s }

// TestTickHost: the host sample goes out on the GPU tick, with the tick's ts, to
// host.sample.<host>, once per tick (its Nats-Msg-Id names host and tick); a reading that
// breaks the contract is left out and counted, the rest published.
func TestTickHost(t *testing.T) {
	host := &fakeHost{s: events.HostSample{MemTotalBytes: ptr(uint64(100)), MemUsedBytes: ptr(uint64(40)),
		MemAvailableBytes: ptr(uint64(60)), DeltaSeconds: ptr(1.0), NetRxBps: ptr(1e6), NetTxBps: ptr(2e6)}}
	pub := &fakePublisher{}
	src := &fakeSource{samples: []events.GPUSample{h200(0)}}
	s := New(src, pub, &fakeExporter{}, Options{Host: "gpu-node.3", Interval: time.Second, HostReader: host},
		prometheus.NewRegistry(), discard())
	s.Tick(context.Background(), t0)
	if len(pub.msgs) != 2 {
		t.Fatalf("published %d, want a GPU and a host sample", len(pub.msgs))
	}
	m := pub.msgs[1]
	if m.subject != "host.sample.gpu-node_3" || m.id != "gpu-node.3/host/2026-11-30T10:00:00.000Z" {
		t.Fatalf("subject %q, id %q", m.subject, m.id)
	}
	var got events.HostSample
	if err := events.UnmarshalHostSample([]byte(m.data), &got); err != nil {
		t.Fatal(err)
	}
	want := host.s
	want.V, want.TS, want.Host = events.Version, t0, "gpu-node.3"
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if v := testutil.ToFloat64(s.m.hostSamples); v != 1 {
		t.Fatalf("host_samples_total = %v", v)
	}

	host.s.MemUsedBytes = ptr(uint64(101)) // above the total: left out, the rest published
	s.Tick(context.Background(), t0.Add(time.Second))
	if len(pub.msgs) != 4 || pub.msgs[3].subject != "host.sample.gpu-node_3" {
		t.Fatalf("published %+v, want the GPU and the host sample", pub.msgs[2:])
	}
	got = events.HostSample{}
	if err := events.UnmarshalHostSample([]byte(pub.msgs[3].data), &got); err != nil {
		t.Fatal(err)
	}
	if got.MemUsedBytes != nil || got.NetRxBps == nil || *got.NetRxBps != 1e6 {
		t.Fatalf("host sample %+v, want it without mem_used_bytes and with the rest", got)
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("out_of_range")); v != 1 {
		t.Fatalf("readings_dropped_total{out_of_range} = %v", v)
	}

	host.s.MemUsedBytes = ptr(uint64(40))
	host.s.DeltaSeconds = ptr(-1.0)
	s.Tick(context.Background(), t0.Add(2*time.Second))
	if len(pub.msgs) != 6 {
		t.Fatalf("published %d, want 6", len(pub.msgs))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("negative")); v != 1 {
		t.Fatalf("readings_dropped_total{negative} = %v", v)
	}
}

// lateFakeSource is a fakeSource whose Late gives, once, the samples of an earlier tick.
type lateFakeSource struct {
	fakeSource
	late []events.GPUSample
}

func (f *lateFakeSource) Late(dst []events.GPUSample) []events.GPUSample {
	dst = append(dst, f.late...)
	f.late = nil
	return dst
}

// TestTickLateSamples: a sample of an earlier tick that a source gives late goes out with
// that tick's ts and Nats-Msg-Id, before the GPU's sample of this tick: its energy delta
// runs from the GPU's sample before it, and this tick's from it. /metrics shows the GPU's
// newest sample alone.
func TestTickLateSamples(t *testing.T) {
	src := &lateFakeSource{}
	pub := &fakePublisher{}
	exp := &fakeExporter{}
	reg := prometheus.NewRegistry()
	s := New(src, pub, exp, Options{Host: "gpu-node-3", Interval: time.Second}, reg, discard())
	at := func(i int, energy float64) events.GPUSample {
		smp := h200(0)
		smp.EnergyJ = ptr(energy)
		smp.TS = t0.Add(time.Duration(i) * time.Second)
		return smp
	}
	src.samples = []events.GPUSample{at(0, 1000)}
	s.Tick(context.Background(), t0)
	// tick 1's read came late: tick 1 had no sample of the GPU; at tick 3 its sample comes
	// beside tick 3's
	src.samples = nil
	s.Tick(context.Background(), t0.Add(time.Second))
	s.Tick(context.Background(), t0.Add(2*time.Second))
	src.samples, src.late = []events.GPUSample{at(3, 1900)}, []events.GPUSample{at(1, 1300)}
	s.Tick(context.Background(), t0.Add(3*time.Second))
	if len(pub.msgs) != 3 {
		t.Fatalf("%d published, want 3", len(pub.msgs))
	}
	for i, want := range []struct {
		ts     time.Time
		energy float64
	}{{t0.Add(time.Second), 300}, {t0.Add(3 * time.Second), 600}} {
		msg := pub.msgs[i+1]
		var got events.GPUSample
		if err := events.UnmarshalGPUSample([]byte(msg.data), &got); err != nil {
			t.Fatal(err)
		}
		if !got.TS.Equal(want.ts) || got.EnergyUsedJ == nil || *got.EnergyUsedJ != want.energy {
			t.Errorf("sample %d: ts %s energy_used_j %v, want %s and %v", i+1, got.TS, jsonOf(got.EnergyUsedJ), want.ts, want.energy)
		}
		if id := "gpu-node-3/" + got.GPUUUID + "/" + string(events.AppendTime(nil, want.ts)); msg.id != id {
			t.Errorf("sample %d: Nats-Msg-Id %q, want %q", i+1, msg.id, id)
		}
	}
	if len(exp.got) != 1 || !exp.got[0].TS.Equal(t0.Add(3*time.Second)) {
		t.Errorf("/metrics shows %d samples (%+v), want tick 3's alone", len(exp.got), exp.got)
	}
	if v := testutil.ToFloat64(s.m.gpus); v != 1 {
		t.Errorf("gpuwatch_gpus = %v, want 1", v)
	}
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }
