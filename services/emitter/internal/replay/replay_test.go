package replay

import (
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"net/http/httptest"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

func openTrace(t testing.TB, name string) []Record {
	t.Helper()
	f, err := os.Open(testbed.Trace(t, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestReadRealTraces(t *testing.T) {
	for _, tt := range []struct {
		file      string
		n         int
		medianIn  int64
		medianOut int64
	}{
		{"AzureLLMInferenceTrace_conv.csv", 19_366, 1020, 129},
		{"AzureLLMInferenceTrace_code.csv", 8_819, 1469, 13},
	} {
		recs := openTrace(t, tt.file)
		if len(recs) != tt.n || recs[0].At != 0 {
			t.Fatalf("%s: %d records, first at %v", tt.file, len(recs), recs[0].At)
		}
		if span := recs[len(recs)-1].At; span < 55*time.Minute || span > 60*time.Minute {
			t.Fatalf("%s spans %v", tt.file, span)
		}
		in, out := medians(recs)
		if in != tt.medianIn || out != tt.medianOut {
			t.Fatalf("%s: medians %d/%d, want %d/%d", tt.file, in, out, tt.medianIn, tt.medianOut)
		}
	}
}

func medians(recs []Record) (in, out int64) {
	a, b := make([]int64, len(recs)), make([]int64, len(recs))
	for i, r := range recs {
		a[i], b[i] = r.Input, r.Output
	}
	slices.Sort(a)
	slices.Sort(b)
	return a[len(a)/2], b[len(b)/2]
}

func TestReadTraceErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"header", "a,b,c\n", "header"},
		{"empty", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"},
		{"timestamp", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "line 2"},
		{"negative", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-1,2\n", "line 2"},
		{"huge", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1000000000000,2\n", "from 0 to 100000000"},
		{"columns", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1\n", "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tt.in))
			if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want ErrBadTrace mentioning %q", err, tt.want)
			}
		})
	}
}

// The generated workload must look like the trace it was fitted to.
func TestGenerateShapedLikeTheTrace(t *testing.T) {
	for _, tt := range []struct {
		shape Shape
		file  string
	}{{Conversation, "AzureLLMInferenceTrace_conv.csv"}, {Code, "AzureLLMInferenceTrace_code.csv"}} {
		real := openTrace(t, tt.file)
		span := real[len(real)-1].At
		gen := Generate(tt.shape, span, 42)
		if ratio := float64(len(gen)) / float64(len(real)); ratio < 0.8 || ratio > 1.25 {
			t.Errorf("%s: %d generated requests for %d real ones", tt.shape.Name, len(gen), len(real))
		}
		ri, ro := medians(real)
		gi, gout := medians(gen)
		if near(gi, ri, 0.15) || near(gout, ro, 0.2) {
			t.Errorf("%s: generated medians %d/%d, trace %d/%d", tt.shape.Name, gi, gout, ri, ro)
		}
		if !slices.IsSortedFunc(gen, func(a, b Record) int { return int(a.At - b.At) }) {
			t.Errorf("%s: arrivals out of order", tt.shape.Name)
		}
		again := Generate(tt.shape, span, 42)
		if !slices.Equal(gen, again) {
			t.Errorf("%s: not deterministic for a seed", tt.shape.Name)
		}
	}
}

// near reports whether a is NOT within frac of b.
func near(a, b int64, frac float64) bool { return math.Abs(float64(a-b)) > frac*float64(b) }

func TestModel(t *testing.T) {
	m := DefaultModel
	m.Jitter, m.ErrorRate = 0, 0
	sim := NewSimulator(m, nil, 1)
	short := sim.Next(Record{At: 0, Input: 100, Output: 10})
	long := NewSimulator(m, nil, 1).Next(Record{At: 0, Input: 8000, Output: 10})
	if short.TTFT >= long.TTFT {
		t.Fatalf("TTFT %v for 100 tokens, %v for 8000: must grow with input", short.TTFT, long.TTFT)
	}
	if want := m.BaseTTFT + 100*m.PrefillPerToken; short.TTFT != want {
		t.Fatalf("TTFT %v, want %v", short.TTFT, want)
	}
	// Load: 50 requests arriving at once, each slower than the one before.
	loaded := NewSimulator(m, nil, 1)
	var last Sample
	for i := range 50 {
		last = loaded.Next(Record{At: time.Duration(i), Input: 100, Output: 100})
	}
	tpot0 := (short.Total - short.TTFT) / 9
	tpot := (last.Total - last.TTFT) / 99
	if last.Load != 49 || tpot <= tpot0 {
		t.Fatalf("load %d TPOT %v vs %v unloaded", last.Load, tpot, tpot0)
	}
	// An incident multiplies TTFT and raises errors inside its window only.
	in, err := ParseIncident("start=1m,for=1m,ttft=4,errors=1")
	if err != nil {
		t.Fatal(err)
	}
	withIn := NewSimulator(m, []Incident{in}, 1)
	before := withIn.Next(Record{At: 0, Input: 100, Output: 1})
	during := withIn.Next(Record{At: 90 * time.Second, Input: 100, Output: 1})
	after := withIn.Next(Record{At: 3 * time.Minute, Input: 100, Output: 1})
	if before.Status != events.StatusOK || during.Status != events.StatusError || after.Status != events.StatusOK {
		t.Fatalf("statuses %s %s %s", before.Status, during.Status, after.Status)
	}
	slow, _ := ParseIncident("start=0s,for=1m,ttft=4")
	if s := NewSimulator(m, []Incident{slow}, 1).Next(Record{Input: 100, Output: 1}); s.TTFT != 4*short.TTFT {
		t.Fatalf("incident TTFT %v, want %v", s.TTFT, 4*short.TTFT)
	}
	for _, bad := range []string{"start=1m", "for=1m", "start=1m,for=1m,ttft=0", "start=1m,for=1m,errors=2", "start=x,for=1m", "when=1m",
		"start=1m,for=1m,ttft=NaN", "start=1m,for=1m,tpot=+Inf", "start=1m,for=1m,errors=NaN"} {
		if _, err := ParseIncident(bad); err == nil {
			t.Errorf("ParseIncident(%q) accepted", bad)
		}
	}
}

type memEmitter struct {
	mu  sync.Mutex
	evs []events.RequestEvent
}

func (m *memEmitter) Emit(ev *events.RequestEvent, now time.Time) error {
	if err := ev.ValidateAt(now); err != nil {
		return err
	}
	m.mu.Lock()
	m.evs = append(m.evs, *ev)
	m.mu.Unlock()
	return nil
}

func TestRunSimulatedTrace(t *testing.T) {
	recs := openTrace(t, "AzureLLMInferenceTrace_conv.csv")[:2000]
	var em memEmitter
	var st Stats
	// 2,000 requests of the first ~6 minutes, played at 10,000x.
	Run(context.Background(), recs, Options{Speed: 10_000, Model: "llama", Scene: "conversation", Env: "test", Instance: "sim-1",
		Simulator: NewSimulator(DefaultModel, nil, 7)}, &em, &st)
	if st.Sent.Load() != 2000 || len(em.evs) != 2000 || st.Unpublished.Load() != 0 {
		t.Fatalf("sent %d emitted %d unpublished %d", st.Sent.Load(), len(em.evs), st.Unpublished.Load())
	}
	if st.OK.Load() < 1900 {
		t.Fatalf("only %d ok", st.OK.Load())
	}
	ev := em.evs[0]
	if ev.InputTokens != recs[0].Input || ev.Model != "llama" || ev.Scene != "conversation" || ev.TTFTMs <= 0 {
		t.Fatalf("first event %+v", ev)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	recs := Generate(Conversation, time.Hour, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var em memEmitter
	var st Stats
	start := time.Now()
	Run(ctx, recs, Options{Speed: 1, Loop: true, Model: "m", Scene: "s", Env: "e", Simulator: NewSimulator(DefaultModel, nil, 1)}, &em, &st)
	if time.Since(start) > 2*time.Second || st.Sent.Load() >= int64(len(recs)) {
		t.Fatalf("ran %v and sent %d", time.Since(start), st.Sent.Load())
	}
}

func BenchmarkSimulate(b *testing.B) {
	recs := Generate(Conversation, time.Hour, 1)
	b.ReportAllocs()
	for b.Loop() {
		sim := NewSimulator(DefaultModel, nil, 1)
		for _, r := range recs {
			sim.Next(r)
		}
	}
	b.ReportMetric(float64(len(recs)*b.N)/b.Elapsed().Seconds(), "requests/s")
}

func TestRunAgainstAnEndpoint(t *testing.T) {
	fake := httptest.NewServer(fakellm.New(fakellm.Options{TTFT: 2 * time.Millisecond}))
	defer fake.Close()
	recs := Generate(Code, time.Minute, 3)[:30]
	for i := range recs {
		recs[i].Output = min(recs[i].Output, 20)
	}
	for _, proto := range []meter.Protocol{meter.OpenAIChat, meter.Anthropic} {
		var em memEmitter
		var st Stats
		client := &llmclient.Client{BaseURL: fake.URL, Protocol: proto, HTTP: fake.Client()}
		Run(context.Background(), recs, Options{Speed: 1000, Model: "m", Scene: "code", Env: "test",
			Target: &Target{Client: client, Stream: true, Concurrency: 64}}, &em, &st)
		if len(em.evs) != len(recs) || st.OK.Load() != int64(len(recs)) {
			t.Fatalf("%v: %d events, %d ok", proto, len(em.evs), st.OK.Load())
		}
		var want, got []Record
		for _, r := range recs {
			want = append(want, Record{Input: r.Input, Output: r.Output})
		}
		for _, ev := range em.evs {
			if ev.TokensEstimated || !ev.Stream || ev.Status != events.StatusOK {
				t.Fatalf("%v: event %+v", proto, ev)
			}
			got = append(got, Record{Input: ev.InputTokens, Output: ev.OutputTokens})
		}
		cmp := func(a, b Record) int { return int(a.Input-b.Input)*10_000 + int(a.Output-b.Output) }
		slices.SortFunc(want, cmp)
		slices.SortFunc(got, cmp)
		if !slices.Equal(want, got) {
			t.Fatalf("%v: the events' tokens are not the workload's", proto)
		}
	}
}
