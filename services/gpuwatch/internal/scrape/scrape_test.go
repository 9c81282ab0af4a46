package scrape

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

const llama = "meta-llama/Llama-3.1-8B-Instruct"

func ptr[T any](v T) *T { return &v }

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fakeEngine serves whatever exposition it was last given.
type fakeEngine struct {
	*httptest.Server
	body  atomic.Pointer[string]
	delay atomic.Int64
	code  atomic.Int32
}

func newEngine(t testing.TB, body string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{}
	e.set(body)
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := time.Duration(e.delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		if c := e.code.Load(); c != 0 {
			w.WriteHeader(int(c))
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = io.WriteString(w, *e.body.Load())
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *fakeEngine) set(body string) { e.body.Store(&body) }

func fixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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

// take returns the samples published since the last call, decoded, checked against the
// Go contract and the JSON Schema.
func (p *fakePublisher) take(t *testing.T) []events.EngineSample {
	t.Helper()
	p.mu.Lock()
	msgs := p.msgs
	p.msgs = nil
	p.mu.Unlock()
	sch := engineSchema(t)
	var out []events.EngineSample
	for _, m := range msgs {
		if m.subject != "engine.sample.gpu-node-3" {
			t.Errorf("subject %q", m.subject)
		}
		var s events.EngineSample
		if err := events.UnmarshalEngineSample([]byte(m.data), &s); err != nil {
			t.Fatal(err)
		}
		if err := s.ValidateAt(time.Now()); err != nil {
			t.Fatalf("published sample breaks the contract: %v: %s", err, m.data)
		}
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(m.data))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(inst); err != nil {
			t.Fatalf("schema rejects %s: %v", m.data, err)
		}
		if want := msgID(&s); m.id != want {
			t.Errorf("msg id %q, want %q", m.id, want)
		}
		out = append(out, s)
	}
	return out
}

var schemaOnce = sync.OnceValues(func() (*jsonschema.Schema, error) {
	raw, err := fs.ReadFile(schemas.JSON, "engine_sample.schema.json")
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("engine_sample.schema.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("engine_sample.schema.json")
})

func engineSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	s, err := schemaOnce()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newScraper(t testing.TB, targets []Target, pub publisher, maxModels int) (*Scraper, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s := New(targets, pub, Options{Host: "gpu-node-3", Interval: time.Second, Timeout: 300 * time.Millisecond,
		MaxBytes: 1 << 20, MaxModels: maxModels}, reg, discard())
	return s, reg
}

func one(t *testing.T, got []events.EngineSample) events.EngineSample {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("%d samples, want 1: %+v", len(got), got)
	}
	return got[0]
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestVLLM reads the vLLM fixture twice: gauges on the first scrape (summed over the two
// engine cores, KV usage the higher), counter and histogram deltas on the second.
func TestVLLM(t *testing.T) {
	body := fixture(t, "vllm.prom")
	eng := newEngine(t, body)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)

	s.Tick(context.Background(), t0)
	first := one(t, pub.take(t))
	want := events.EngineSample{V: 1, TS: t0, Host: "gpu-node-3", Engine: "vllm", Name: "vllm", Model: llama, Up: true,
		Running: ptr(12.0), Waiting: ptr(4.0), KVCacheUsage: ptr(0.62)}
	if !reflect.DeepEqual(first, want) {
		t.Fatalf("first scrape\n%s\nwant\n%s", jsonOf(first), jsonOf(want))
	}

	// One request more: 500 prompt and 40 generated tokens, 2 s in the queue (above 1 s).
	r := strings.NewReplacer(
		`vllm:prompt_tokens_total{engine="0",model_name="`+llama+`"} 20000.0`, `vllm:prompt_tokens_total{engine="0",model_name="`+llama+`"} 20500.0`,
		`vllm:generation_tokens_total{engine="1",model_name="`+llama+`"} 3000.0`, `vllm:generation_tokens_total{engine="1",model_name="`+llama+`"} 3040.0`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="`+llama+`"} 4000.0`, `vllm:prefix_cache_hits_total{engine="0",model_name="`+llama+`"} 4256.0`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="`+llama+`"} 10000.0`, `vllm:prefix_cache_queries_total{engine="0",model_name="`+llama+`"} 10500.0`,
		`vllm:request_queue_time_seconds_bucket{engine="0",le="5.0",model_name="`+llama+`"} 15.0`, `vllm:request_queue_time_seconds_bucket{engine="0",le="5.0",model_name="`+llama+`"} 16.0`,
		`vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="`+llama+`"} 16.0`, `vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="`+llama+`"} 17.0`,
		`vllm:request_queue_time_seconds_count{engine="0",model_name="`+llama+`"} 16.0`, `vllm:request_queue_time_seconds_count{engine="0",model_name="`+llama+`"} 17.0`,
		`vllm:request_queue_time_seconds_sum{engine="0",model_name="`+llama+`"} 12.5`, `vllm:request_queue_time_seconds_sum{engine="0",model_name="`+llama+`"} 14.5`,
	)
	next := r.Replace(body)
	if strings.Count(next, "\n") != strings.Count(body, "\n") || next == body {
		t.Fatal("replacements did not apply")
	}
	eng.set(next)
	s.Tick(context.Background(), t0.Add(time.Second))
	second := one(t, pub.take(t))
	f := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || *got != want {
			t.Errorf("%s = %v, want %v", name, jsonOf(got), want)
		}
	}
	f("delta_seconds", second.DeltaSeconds, 1)
	f("prompt_tokens", second.PromptTokens, 500)
	f("generation_tokens", second.GenerationTokens, 40)
	f("prefix_cache_queries", second.PrefixCacheQueries, 500)
	f("prefix_cache_hits", second.PrefixCacheHits, 256)
	f("preemptions", second.Preemptions, 0)
	f("running", second.Running, 12)
	wantQ := &events.HistogramDelta{Le: []float64{0.3, 1, 5}, Counts: []float64{0, 0, 1, 0}, Sum: 2, Count: 1}
	if !reflect.DeepEqual(second.QueueTime, wantQ) {
		t.Errorf("queue_time_seconds %s, want %s", jsonOf(second.QueueTime), jsonOf(wantQ))
	}
	for name, h := range map[string]*events.HistogramDelta{"ttft": second.TTFT, "prefill": second.PrefillTime,
		"decode": second.DecodeTime, "iteration_tokens": second.IterationTokens} {
		if h == nil || h.Count != 0 || len(h.Counts) != len(h.Le)+1 {
			t.Errorf("%s = %s, want a histogram with no new observations", name, jsonOf(h))
		}
	}
	if second.GeneratedTokens != nil || second.BatchSize != nil || second.CacheHitRate != nil {
		t.Errorf("readings vLLM does not export are present: %s", jsonOf(second))
	}
}

func TestSGLang(t *testing.T) {
	eng := newEngine(t, fixture(t, "sglang.prom"))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	s.Tick(context.Background(), t0.Add(2*time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	want := events.EngineSample{V: 1, TS: t0.Add(2 * time.Second), Host: "gpu-node-3", Engine: "sglang", Name: "sglang",
		Model: "Qwen/Qwen2.5-7B-Instruct", Up: true, DeltaSeconds: ptr(2.0),
		Running: ptr(9.0), Waiting: ptr(4.0), KVCacheUsage: ptr(0.27), CacheHitRate: ptr(0.41), GenThroughput: ptr(812.5),
		PromptTokens: ptr(0.0), GenerationTokens: ptr(0.0),
		TTFT: &events.HistogramDelta{Le: []float64{0.1, 0.5}, Counts: []float64{0, 0, 0}, Sum: 0, Count: 0}}
	if !reflect.DeepEqual(got[1], want) {
		t.Fatalf("got\n%s\nwant\n%s", jsonOf(got[1]), jsonOf(want))
	}
}

func TestTGI(t *testing.T) {
	body := fixture(t, "tgi.prom")
	eng := newEngine(t, body)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "tgi", Name: "tgi", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	eng.set(strings.NewReplacer("tgi_request_queue_duration_bucket{le=\"+Inf\"} 100", "tgi_request_queue_duration_bucket{le=\"+Inf\"} 103",
		"tgi_request_queue_duration_count 100", "tgi_request_queue_duration_count 103",
		"tgi_request_queue_duration_sum 21.5", "tgi_request_queue_duration_sum 24.5").Replace(body))
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	want := events.EngineSample{V: 1, TS: t0.Add(time.Second), Host: "gpu-node-3", Engine: "tgi", Name: "tgi", Up: true,
		DeltaSeconds: ptr(1.0), Waiting: ptr(6.0), BatchSize: ptr(16.0),
		QueueTime:       &events.HistogramDelta{Le: []float64{0.005, 0.05, 0.5}, Counts: []float64{0, 0, 0, 3}, Sum: 3, Count: 3},
		GeneratedTokens: &events.HistogramDelta{Le: []float64{64, 512}, Counts: []float64{0, 0, 0}, Sum: 0, Count: 0}}
	if !reflect.DeepEqual(got[1], want) {
		t.Fatalf("got\n%s\nwant\n%s", jsonOf(got[1]), jsonOf(want))
	}
}

func small(prompt, b1, inf, sum float64) string {
	return fmt.Sprintf(`# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} %g
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} %g
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} %g
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} %g
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} %g
`, prompt, b1, inf, inf, sum)
}

// TestCounterReset restarts the engine between two scrapes: the counters start again from
// zero, so the delta is the new value, never negative and never the old total.
func TestCounterReset(t *testing.T) {
	eng := newEngine(t, small(100000, 900, 1000, 400))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	eng.set(small(100300, 901, 1002, 401.5))
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(small(250, 3, 4, 2.5)) // restarted
	s.Tick(context.Background(), t0.Add(2*time.Second))
	got := pub.take(t)
	if len(got) != 3 {
		t.Fatalf("%d samples", len(got))
	}
	if got[1].PromptTokens == nil || *got[1].PromptTokens != 300 {
		t.Errorf("before the restart prompt_tokens = %s, want 300", jsonOf(got[1].PromptTokens))
	}
	if w := (&events.HistogramDelta{Le: []float64{0.5}, Counts: []float64{1, 1}, Sum: 1.5, Count: 2}); !reflect.DeepEqual(got[1].TTFT, w) {
		t.Errorf("before the restart ttft %s, want %s", jsonOf(got[1].TTFT), jsonOf(w))
	}
	if got[2].PromptTokens == nil || *got[2].PromptTokens != 250 {
		t.Errorf("after the restart prompt_tokens = %s, want 250", jsonOf(got[2].PromptTokens))
	}
	if w := (&events.HistogramDelta{Le: []float64{0.5}, Counts: []float64{3, 1}, Sum: 2.5, Count: 4}); !reflect.DeepEqual(got[2].TTFT, w) {
		t.Errorf("after the restart ttft %s, want %s", jsonOf(got[2].TTFT), jsonOf(w))
	}
}

// TestSeriesGoneNoOvercount: a reading's delta is the sum of its series' deltas. When one
// of the series a reading adds up has its value refused (an engine core's counter turned
// NaN, a histogram of one core malformed), that series adds nothing and keeps its last good
// value, so that when it is read again its delta covers the ticks it was out: the other
// core's delta is published meanwhile, and no tick counts a core's whole total, as taking
// the fall of the sum for a restart did.
func TestSeriesGoneNoOvercount(t *testing.T) {
	body := func(core0, core1 string, h0, h1 int) string {
		hist := func(core string, n int) string {
			if n < 0 { // malformed: a bucket above the count
				return fmt.Sprintf("vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"0.5\",model_name=\"m\"} 9\n"+
					"vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"+Inf\",model_name=\"m\"} 1\n"+
					"vllm:time_to_first_token_seconds_count{engine=%q,model_name=\"m\"} 1\n"+
					"vllm:time_to_first_token_seconds_sum{engine=%q,model_name=\"m\"} 1\n", core, core, core, core)
			}
			return fmt.Sprintf("vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"0.5\",model_name=\"m\"} %d\n"+
				"vllm:time_to_first_token_seconds_bucket{engine=%q,le=\"+Inf\",model_name=\"m\"} %d\n"+
				"vllm:time_to_first_token_seconds_count{engine=%q,model_name=\"m\"} %d\n"+
				"vllm:time_to_first_token_seconds_sum{engine=%q,model_name=\"m\"} %d\n", core, n, core, n, core, n, core, n)
		}
		return "# TYPE vllm:prompt_tokens_total counter\n" +
			"vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} " + core0 + "\n" +
			"vllm:prompt_tokens_total{engine=\"1\",model_name=\"m\"} " + core1 + "\n" +
			"# TYPE vllm:time_to_first_token_seconds histogram\n" + hist("0", h0) + hist("1", h1)
	}
	eng := newEngine(t, body("1000000", "2000000", 500000, 600000))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(body("1000100", "NaN", 500010, -1)) // core 1's counter NaN, its histogram malformed
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(body("1000200", "2000200", 500020, 600020))
	s.Tick(context.Background(), t0.Add(2*time.Second))
	eng.set(body("1000300", "2000300", 500030, 600030))
	s.Tick(context.Background(), t0.Add(3*time.Second))
	got := pub.take(t)
	if len(got) != 4 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []struct{ prompt, ttft float64 }{
		{100, 10}, // core 0 alone
		{300, 30}, // core 0's 100, core 1's 200 over two ticks
		{200, 20},
	} {
		smp := got[i+1]
		if smp.PromptTokens == nil || *smp.PromptTokens != want.prompt || smp.TTFT == nil || smp.TTFT.Count != want.ttft {
			t.Errorf("tick %d: prompt_tokens %s ttft %s, want %v and a count of %v", i+1, jsonOf(smp.PromptTokens), jsonOf(smp.TTFT), want.prompt, want.ttft)
		}
	}
}

// TestNewSeriesCountsFromZero: prometheus_client exposes a labelled series only once it
// was first used, so SGLang's queue_time histogram of a data-parallel rank appears when
// that rank takes its first request. The new series counts from zero: its whole value is
// its delta, added to those of the series read before.
func TestNewSeriesCountsFromZero(t *testing.T) {
	hist := func(dp, n int) string {
		return fmt.Sprintf("sglang:queue_time_seconds_bucket{dp_rank=\"%[1]d\",le=\"1\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"%[1]d\"} %[2]d\n"+
			"sglang:queue_time_seconds_bucket{dp_rank=\"%[1]d\",le=\"+Inf\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"%[1]d\"} %[2]d\n"+
			"sglang:queue_time_seconds_count{dp_rank=\"%[1]d\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"%[1]d\"} %[2]d\n"+
			"sglang:queue_time_seconds_sum{dp_rank=\"%[1]d\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"%[1]d\"} %[2]d\n", dp, n)
	}
	head := "# TYPE sglang:queue_time_seconds histogram\n"
	eng := newEngine(t, head+hist(0, 10))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + hist(0, 20) + hist(1, 3)) // rank 1's first 3 requests; rank 0 took 10 more
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	if w := (&events.HistogramDelta{Le: []float64{1}, Counts: []float64{13, 0}, Sum: 13, Count: 13}); !reflect.DeepEqual(got[1].QueueTime, w) {
		t.Errorf("queue_time %s, want %s (10 on rank 0, 3 on the new rank 1)", jsonOf(got[1].QueueTime), jsonOf(w))
	}
}

// TestNewLabelValueCountsFromZero: SGLang's --tokenizer-metrics-allowed-custom-labels
// labels the tokenizer's counters with a value each request carries (a tenant); a new
// tenant's first request makes its series. Its tokens count from zero, beside those of the
// tenants before, tick after tick.
func TestNewLabelValueCountsFromZero(t *testing.T) {
	head := "# TYPE sglang:prompt_tokens_total counter\n"
	series := func(tenant string, v int) string {
		return fmt.Sprintf("sglang:prompt_tokens_total{model_name=\"m\",tenant=%q} %d\n", tenant, v)
	}
	eng := newEngine(t, head+series("a", 100))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + series("a", 150) + series("b", 20)) // tenant b's first request
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + series("a", 160) + series("b", 30) + series("c", 5)) // tenant c's
	s.Tick(context.Background(), t0.Add(2*time.Second))
	got := pub.take(t)
	if len(got) != 3 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []float64{70, 25} {
		if smp := got[i+1]; smp.PromptTokens == nil || *smp.PromptTokens != want {
			t.Errorf("tick %d: prompt_tokens %s, want %v", i+1, jsonOf(smp.PromptTokens), want)
		}
	}
}

// TestSeriesBackCountsFromLastValue: a series missing from one exposition (a core's
// figures left out of it) and back within 5 minutes counts from its last value, not from
// zero: its whole total is not one tick's. One back later than that is new, and counts
// from zero.
func TestSeriesBackCountsFromLastValue(t *testing.T) {
	head := "# TYPE vllm:prompt_tokens_total counter\n"
	series := func(core string, v int) string {
		return fmt.Sprintf("vllm:prompt_tokens_total{engine=%q,model_name=\"m\"} %d\n", core, v)
	}
	eng := newEngine(t, head+series("0", 1000)+series("1", 5000000))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + series("0", 1100)) // core 1 left out
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + series("0", 1200) + series("1", 5000300))
	s.Tick(context.Background(), t0.Add(2*time.Second))
	eng.set(head + series("0", 1300))
	s.Tick(context.Background(), t0.Add(3*time.Second))
	eng.set(head + series("0", 1400) + series("1", 40)) // back after 6 minutes: restarted, new
	s.Tick(context.Background(), t0.Add(3*time.Second+6*time.Minute))
	got := pub.take(t)
	if len(got) != 5 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []float64{100, 400, 100, 140} {
		if smp := got[i+1]; smp.PromptTokens == nil || *smp.PromptTokens != want {
			t.Errorf("tick %d: prompt_tokens %s, want %v", i+1, jsonOf(smp.PromptTokens), want)
		}
	}
}

// TestFirstGoodValueIsNoDelta: a series exposed from the first scrape with its value
// refused is not new when its value is first good: its total was made before, and it has
// no delta that tick.
func TestFirstGoodValueIsNoDelta(t *testing.T) {
	head := "# TYPE vllm:prompt_tokens_total counter\n"
	series := func(core, v string) string {
		return fmt.Sprintf("vllm:prompt_tokens_total{engine=%q,model_name=\"m\"} %s\n", core, v)
	}
	eng := newEngine(t, head+series("0", "1000")+series("1", "NaN"))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + series("0", "1100") + series("1", "5000000"))
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + series("0", "1200") + series("1", "5000050"))
	s.Tick(context.Background(), t0.Add(2*time.Second))
	got := pub.take(t)
	if len(got) != 3 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []float64{100, 150} {
		if smp := got[i+1]; smp.PromptTokens == nil || *smp.PromptTokens != want {
			t.Errorf("tick %d: prompt_tokens %s, want %v", i+1, jsonOf(smp.PromptTokens), want)
		}
	}
}

// TestLowestRankChanges: when the series of an SGLang scheduler's lowest TP rank go, those
// of the next rank, exposed all along, are read: their delta is against their own last
// value, not their whole total.
func TestLowestRankChanges(t *testing.T) {
	head := "# TYPE sglang:generation_tokens_total counter\n"
	series := func(tp string, v int) string {
		return fmt.Sprintf("sglang:generation_tokens_total{model_name=\"m\",pp_rank=\"0\",tp_rank=%q} %d\n", tp, v)
	}
	eng := newEngine(t, head+series("0", 7000)+series("1", 7000))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + series("0", 7010) + series("1", 7010))
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + series("1", 7030)) // rank 0's series gone
	s.Tick(context.Background(), t0.Add(2*time.Second))
	got := pub.take(t)
	if len(got) != 3 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []float64{10, 20} {
		if smp := got[i+1]; smp.GenerationTokens == nil || *smp.GenerationTokens != want {
			t.Errorf("tick %d: generation_tokens %s, want %v", i+1, jsonOf(smp.GenerationTokens), want)
		}
	}
}

// TestSeriesStateBounded: an exposition whose series are all new at each scrape (a label
// flooded with made-up values) leaves the state of at most twice one scrape's series.
func TestSeriesStateBounded(t *testing.T) {
	head := "# TYPE sglang:prompt_tokens_total counter\n"
	body := func(tick int) string {
		var b strings.Builder
		b.WriteString(head)
		for i := range 50 {
			fmt.Fprintf(&b, "sglang:prompt_tokens_total{model_name=\"m\",tenant=\"%d-%d\"} 1\n", tick, i)
		}
		return b.String()
	}
	eng := newEngine(t, body(0))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	for tick := range 20 {
		eng.set(body(tick))
		s.Tick(context.Background(), t0.Add(time.Duration(tick)*time.Second))
		if n := len(s.targets[0].series); n > 100 {
			t.Fatalf("tick %d: state of %d series, want at most 100", tick, n)
		}
	}
	if n := len(s.targets[0].cache.byLabels); n != 50 {
		t.Errorf("%d series by labels cached, want the last scrape's 50", n)
	}
}

// TestEngineFails: an engine that disappears, hangs, errors, sends too much or sends a
// malformed exposition is reported down with its reason and counted, and the engine beside
// it is still read.
func TestEngineFails(t *testing.T) {
	good := newEngine(t, fixture(t, "tgi.prom"))
	gone := newEngine(t, fixture(t, "vllm.prom"))
	slow := newEngine(t, fixture(t, "vllm.prom"))
	slow.delay.Store(int64(10 * time.Second))
	status := newEngine(t, "")
	status.code.Store(503)
	bad := newEngine(t, fixture(t, "malformed.prom"))
	huge := newEngine(t, strings.Repeat("# padding\n", 7_000)) // just over the 64 KiB below
	targets := []Target{
		{Engine: "tgi", Name: "good", URL: good.URL},
		{Engine: "vllm", Name: "gone", URL: gone.URL},
		{Engine: "vllm", Name: "slow", URL: slow.URL},
		{Engine: "vllm", Name: "status", URL: status.URL},
		{Engine: "vllm", Name: "bad", URL: bad.URL},
		{Engine: "vllm", Name: "huge", URL: huge.URL},
	}
	pub := &fakePublisher{}
	// A timeout a loaded machine's scrapes stay well within, far under the slow engine's delay.
	s := New(targets, pub, Options{Host: "gpu-node-3", Interval: time.Second, Timeout: 2 * time.Second,
		MaxBytes: 64 << 10, MaxModels: 16}, prometheus.NewRegistry(), discard())
	s.Tick(context.Background(), t0)
	gone.Close() // the engine stops between two ticks
	began := time.Now()
	s.Tick(context.Background(), t0.Add(time.Second))
	if d := time.Since(began); d > 6*time.Second {
		t.Errorf("a tick with a hanging engine took %s; the timeout is 2s", d)
	}
	got := pub.take(t)[len(targets):]
	wantErr := map[string]string{"good": "", "gone": "connect", "slow": "timeout", "status": "http_status", "bad": "malformed", "huge": "too_large"}
	if len(got) != len(targets) {
		t.Fatalf("%d samples on the second tick, want %d", len(got), len(targets))
	}
	for _, smp := range got {
		want := wantErr[smp.Name]
		if smp.Up != (want == "") || smp.Error != want {
			t.Errorf("%s: up=%v error=%q, want error %q", smp.Name, smp.Up, smp.Error, want)
		}
		if want != "" {
			if smp.Model != "" || smp.Running != nil || smp.DeltaSeconds != nil {
				t.Errorf("%s: a down sample carries readings: %s", smp.Name, jsonOf(smp))
			}
			n := 1.0
			if smp.Name != "gone" {
				n = 2
			}
			if v := testutil.ToFloat64(s.m.failed.WithLabelValues(smp.Name, want)); v != n {
				t.Errorf("engine_scrape_errors_total{%s,%s} = %v, want %v", smp.Name, want, v, n)
			}
			if v := testutil.ToFloat64(s.m.up.WithLabelValues(smp.Name)); v != 0 {
				t.Errorf("engine_up{%s} = %v", smp.Name, v)
			}
		}
	}
	if v := testutil.ToFloat64(s.m.up.WithLabelValues("good")); v != 1 {
		t.Errorf("engine_up{good} = %v", v)
	}
}

// TestFailureLoggedOnce: an engine that keeps failing the same way is logged once, not at
// every tick, though the error's text changes from one attempt to the next: the local port
// of each connection it resets, the line of each malformed exposition.
func TestFailureLoggedOnce(t *testing.T) {
	var resets atomic.Bool
	resets.Store(true)
	var n atomic.Int64
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if resets.Load() {
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
			_ = c.Close()
			return
		}
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d oops\n", n.Add(1)) // a broken line, each time another
	}))
	t.Cleanup(eng.Close)
	var log bytes.Buffer
	s := New([]Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, &fakePublisher{}, Options{Host: "gpu-node-3",
		Interval: time.Second, Timeout: 2 * time.Second, MaxBytes: 1 << 20, MaxModels: 16}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(&log, nil)))
	tick := 0
	for range 3 {
		s.Tick(context.Background(), t0.Add(time.Duration(tick)*time.Second))
		tick++
	}
	resets.Store(false)
	for range 3 {
		s.Tick(context.Background(), t0.Add(time.Duration(tick)*time.Second))
		tick++
	}
	if got := strings.Count(log.String(), "cannot scrape engine"); got != 2 {
		t.Errorf("%d failures logged over 3 resets and 3 malformed expositions, want 2 (one per change):\n%s", got, log.String())
	}
	if v := testutil.ToFloat64(s.m.failed.WithLabelValues("vllm", "connect")); v != 3 {
		t.Errorf("engine_scrape_errors_total{connect} = %v, want 3", v)
	}
	if v := testutil.ToFloat64(s.m.failed.WithLabelValues("vllm", "malformed")); v != 3 {
		t.Errorf("engine_scrape_errors_total{malformed} = %v, want 3", v)
	}
}

// TestShutdownIsNoOutage: a scrape that gpuwatch's own shutdown cuts short says nothing of
// the engine: no up=false sample is published for it, no failure counted or logged, so a
// restart of gpuwatch does not read as an outage of the engines it was scraping.
func TestShutdownIsNoOutage(t *testing.T) {
	slow := newEngine(t, fixture(t, "vllm.prom"))
	slow.delay.Store(int64(10 * time.Second))
	pub := &fakePublisher{}
	var log bytes.Buffer
	s := New([]Target{{Engine: "vllm", Name: "vllm", URL: slow.URL}}, pub, Options{Host: "gpu-node-3",
		Interval: 5 * time.Second, Timeout: 4 * time.Second, MaxBytes: 1 << 20, MaxModels: 16}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(&log, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel) // SIGTERM while the engine is being read
	s.Tick(ctx, t0)
	if got := pub.take(t); len(got) != 0 {
		t.Errorf("a scrape cut short by shutdown published %s", jsonOf(got))
	}
	for _, r := range scrapeReasons {
		if v := testutil.ToFloat64(s.m.failed.WithLabelValues("vllm", r)); v != 0 {
			t.Errorf("engine_scrape_errors_total{%s} = %v, want 0", r, v)
		}
	}
	if strings.Contains(log.String(), "cannot scrape") {
		t.Errorf("logged: %s", log.String())
	}
}

// TestGzipBomb: an engine that answers a few KiB of gzip that inflate past
// GPUWATCH_ENGINE_MAX_BYTES fails the scrape as too_large: the limit is on what is read
// after decompression, which stops there.
func TestGzipBomb(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	line := []byte("# padding padding padding padding padding padding padding padding\n")
	for range (16 << 20) / len(line) { // 16 MiB inflated, the limit is 1 MiB
		_, _ = zw.Write(line)
	}
	_ = zw.Close()
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(zipped.Bytes())
	}))
	t.Cleanup(eng.Close)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	if smp := one(t, pub.take(t)); smp.Up || smp.Error != "too_large" {
		t.Errorf("sample %s, want up=false error too_large (%d bytes of gzip)", jsonOf(smp), zipped.Len())
	}
}

// TestModelLimit: an exposition with more models than the limit gives samples for the
// limit only and counts what it left out.
func TestModelLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for i := range 50 {
		fmt.Fprintf(&b, "vllm:num_requests_running{model_name=\"m%d\"} %d\n", i, i)
	}
	eng := newEngine(t, b.String())
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	if got := pub.take(t); len(got) != 4 {
		t.Fatalf("%d samples, want 4", len(got))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "models_over_limit")); v != 1 {
		t.Errorf("models_over_limit = %v", v)
	}
}

// TestModelFlood: a label flood in the model label of one family (50 made-up models beside
// the engine's own, in one family of three) does not push the engine's model out: the
// models kept are those the most families name, and the same at every scrape, whatever
// order the families come in.
func TestModelFlood(t *testing.T) {
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for i := range 50 {
		fmt.Fprintf(&b, "vllm:num_requests_running{model_name=\"junk%02d\"} 1\n", i)
	}
	b.WriteString(`vllm:num_requests_running{model_name="llama"} 7
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 2
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="llama"} 100
`)
	eng := newEngine(t, b.String())
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	var first []string
	for i := range 20 {
		s.Tick(context.Background(), t0.Add(time.Duration(i)*time.Second))
		var models []string
		var llama *events.EngineSample
		for _, smp := range pub.take(t) {
			models = append(models, smp.Model)
			if smp.Model == "llama" {
				llama = &smp
			}
		}
		if llama == nil || llama.Running == nil || *llama.Running != 7 || llama.Waiting == nil || *llama.Waiting != 2 {
			t.Fatalf("scrape %d: the engine's model pushed out or incomplete: models %q", i, models)
		}
		if i > 0 && (llama.PromptTokens == nil || *llama.PromptTokens != 0) {
			t.Fatalf("scrape %d: prompt_tokens delta %s, want 0", i, jsonOf(llama.PromptTokens))
		}
		if first == nil {
			first = models
		} else if !reflect.DeepEqual(models, first) {
			t.Fatalf("scrape %d kept %q, the first %q", i, models, first)
		}
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "models_over_limit")); v != 20 {
		t.Errorf("models_over_limit = %v, want 20", v)
	}
}

// TestModelLimitKeepsKnown: over the limit, a model already read keeps its place before
// a new one as often named, so its deltas go on.
func TestModelLimitKeepsKnown(t *testing.T) {
	running := func(models ...string) string {
		b := "# TYPE vllm:prompt_tokens_total counter\n"
		for i, m := range models {
			b += fmt.Sprintf("vllm:prompt_tokens_total{model_name=%q} %d\n", m, 10*(i+1))
		}
		return b
	}
	eng := newEngine(t, running("b"))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 1)
	s.Tick(context.Background(), t0)
	eng.set(running("a", "b"))
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 || got[1].Model != "b" || got[1].PromptTokens == nil {
		t.Fatalf("second scrape %s, want model b with its delta", jsonOf(got))
	}
}

// TestHostileValues: values no engine can mean are left out and counted; the rest of the
// sample is kept.
func TestHostileValues(t *testing.T) {
	eng := newEngine(t, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} NaN
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} -3
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 7
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 10
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 9
vllm:time_to_first_token_seconds_bucket{le="1",model_name="m"} 3
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 9
vllm:time_to_first_token_seconds_count{model_name="m"} 9
vllm:time_to_first_token_seconds_sum{model_name="m"} 1
`)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	smp := got[1]
	if smp.Running != nil || smp.Waiting != nil || smp.KVCacheUsage != nil || smp.TTFT != nil {
		t.Errorf("hostile values reached the sample: %s", jsonOf(smp))
	}
	if smp.PromptTokens == nil || *smp.PromptTokens != 0 {
		t.Errorf("prompt_tokens beside them lost: %s", jsonOf(smp))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "bad_value")); v != 6 {
		t.Errorf("bad_value = %v, want 6 (3 per scrape)", v)
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "histogram_malformed")); v != 2 {
		t.Errorf("histogram_malformed = %v, want 2", v)
	}
}

// TestDuplicateSeries: an exposition that repeats a series (two collectors registered for
// one name, a sidecar that concatenates expositions) is read as its first copy, as
// Prometheus stores it, and the copies are counted: a gauge is not doubled, a counter's
// delta is not doubled, and a histogram with a bucket line twice is still read.
func TestDuplicateSeries(t *testing.T) {
	body := func(tokens, ttft int) string {
		return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} %[1]d
vllm:prompt_tokens_total{model_name="m"} %[1]d
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} %[2]d
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} %[2]d
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} %[2]d
vllm:time_to_first_token_seconds_count{model_name="m"} %[2]d
vllm:time_to_first_token_seconds_count{model_name="m"} %[2]d
vllm:time_to_first_token_seconds_sum{model_name="m"} 1
`, tokens, ttft)
	}
	eng := newEngine(t, body(100, 2))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(body(150, 5))
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	smp := got[1]
	if smp.Running == nil || *smp.Running != 3 {
		t.Errorf("running %s, want 3", jsonOf(smp.Running))
	}
	if smp.PromptTokens == nil || *smp.PromptTokens != 50 {
		t.Errorf("prompt_tokens %s, want 50", jsonOf(smp.PromptTokens))
	}
	if w := (&events.HistogramDelta{Le: []float64{0.5}, Counts: []float64{3, 0}, Sum: 0, Count: 3}); !reflect.DeepEqual(smp.TTFT, w) {
		t.Errorf("ttft %s, want %s", jsonOf(smp.TTFT), jsonOf(w))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "duplicate_series")); v != 8 {
		t.Errorf("duplicate_series = %v, want 8 (4 per scrape)", v)
	}
}

// TestDuplicateSeriesAnyLabelOrder: one series exposed twice with its labels in another
// order is still one series (Prometheus sorts the labels): it is read once, not doubled.
func TestDuplicateSeriesAnyLabelOrder(t *testing.T) {
	body := func(tokens int) string {
		return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{model_name="m",engine="0"} 3
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} %[1]d
vllm:prompt_tokens_total{model_name="m", engine="0"} %[1]d
`, tokens)
	}
	eng := newEngine(t, body(100))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(body(150))
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	if smp := got[1]; smp.Running == nil || *smp.Running != 3 || smp.PromptTokens == nil || *smp.PromptTokens != 50 {
		t.Errorf("running %s prompt_tokens %s, want 3 and 50 (one series exposed twice)", jsonOf(smp.Running), jsonOf(smp.PromptTokens))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "duplicate_series")); v != 4 {
		t.Errorf("duplicate_series = %v, want 4 (2 per scrape)", v)
	}
}

// TestLegacyKVName: vLLM before kv_cache_usage_perc exported gpu_cache_usage_perc; the
// current name wins when both are there.
func TestLegacyKVName(t *testing.T) {
	f := func(body string, want float64) {
		t.Helper()
		eng := newEngine(t, body)
		pub := &fakePublisher{}
		s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
		s.Tick(context.Background(), t0)
		smp := one(t, pub.take(t))
		if smp.KVCacheUsage == nil || *smp.KVCacheUsage != want {
			t.Errorf("kv_cache_usage = %s, want %v", jsonOf(smp.KVCacheUsage), want)
		}
	}
	legacy := "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.3\n"
	current := "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.7\n"
	f(legacy, 0.3)
	f(legacy+current, 0.7)
	f(current+legacy, 0.7)
}

// TestOtherVersionsNames: vLLM 0.8 named its prefix-cache counters gpu_prefix_cache_*
// (0.9 exports both names, the new one read); SGLang exports its queueing delay as
// sglang:queue_time_seconds.
func TestOtherVersionsNames(t *testing.T) {
	prefix := func(name string, q, h int) string {
		return fmt.Sprintf("# TYPE %[1]s_queries_total counter\n%[1]s_queries_total{engine=\"0\",model_name=\"m\"} %[2]d\n"+
			"# TYPE %[1]s_hits_total counter\n%[1]s_hits_total{engine=\"0\",model_name=\"m\"} %[3]d\n", name, q, h)
	}
	two := func(t *testing.T, engine, a, b string) events.EngineSample {
		t.Helper()
		eng := newEngine(t, a)
		pub := &fakePublisher{}
		s, _ := newScraper(t, []Target{{Engine: engine, Name: engine, URL: eng.URL}}, pub, 4)
		s.Tick(context.Background(), t0)
		eng.set(b)
		s.Tick(context.Background(), t0.Add(time.Second))
		got := pub.take(t)
		if len(got) != 2 {
			t.Fatalf("%d samples", len(got))
		}
		return got[1]
	}
	t.Run("vllm 0.8", func(t *testing.T) {
		smp := two(t, "vllm", prefix("vllm:gpu_prefix_cache", 100, 10), prefix("vllm:gpu_prefix_cache", 300, 60))
		if smp.PrefixCacheQueries == nil || *smp.PrefixCacheQueries != 200 || smp.PrefixCacheHits == nil || *smp.PrefixCacheHits != 50 {
			t.Errorf("prefix cache queries %s hits %s, want 200 and 50", jsonOf(smp.PrefixCacheQueries), jsonOf(smp.PrefixCacheHits))
		}
	})
	t.Run("vllm 0.9", func(t *testing.T) {
		smp := two(t, "vllm", prefix("vllm:gpu_prefix_cache", 1, 1)+prefix("vllm:prefix_cache", 100, 10),
			prefix("vllm:gpu_prefix_cache", 1000, 1000)+prefix("vllm:prefix_cache", 300, 60))
		if smp.PrefixCacheQueries == nil || *smp.PrefixCacheQueries != 200 || smp.PrefixCacheHits == nil || *smp.PrefixCacheHits != 50 {
			t.Errorf("prefix cache queries %s hits %s, want 200 and 50 (the current names)", jsonOf(smp.PrefixCacheQueries), jsonOf(smp.PrefixCacheHits))
		}
	})
	t.Run("sglang queue time", func(t *testing.T) {
		hist := func(n int) string {
			return fmt.Sprintf(`# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_bucket{le="0.0",model_name="m",tp_rank="0"} 0
sglang:queue_time_seconds_bucket{le="0.1",model_name="m",tp_rank="0"} %[1]d
sglang:queue_time_seconds_bucket{le="+Inf",model_name="m",tp_rank="0"} %[1]d
sglang:queue_time_seconds_count{model_name="m",tp_rank="0"} %[1]d
sglang:queue_time_seconds_sum{model_name="m",tp_rank="0"} 0.05
`, n)
		}
		smp := two(t, "sglang", hist(1), hist(4))
		if w := (&events.HistogramDelta{Le: []float64{0, 0.1}, Counts: []float64{0, 3, 0}, Sum: 0, Count: 3}); !reflect.DeepEqual(smp.QueueTime, w) {
			t.Errorf("queue_time_seconds %s, want %s", jsonOf(smp.QueueTime), jsonOf(w))
		}
	})
}

func TestParseTargets(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Target
		wantErr  string
	}{
		{name: "empty", in: ""},
		{name: "three", in: "vllm=http://127.0.0.1:8000/metrics, sglang=http://127.0.0.1:30000/metrics,tgi=http://127.0.0.1:8080/metrics",
			want: []Target{{"vllm", "vllm", "http://127.0.0.1:8000/metrics"}, {"sglang", "sglang", "http://127.0.0.1:30000/metrics"}, {"tgi", "tgi", "http://127.0.0.1:8080/metrics"}}},
		{name: "named", in: "vllm:gpu0=http://h:1/metrics,vllm:gpu1=http://h:2/metrics",
			want: []Target{{"vllm", "gpu0", "http://h:1/metrics"}, {"vllm", "gpu1", "http://h:2/metrics"}}},
		{name: "twice", in: "vllm=http://h:1/metrics,vllm=http://h:2/metrics", wantErr: "twice"},
		{name: "unknown kind", in: "ollama=http://h:1/metrics", wantErr: "must be vllm, sglang or tgi"},
		{name: "no url", in: "vllm", wantErr: "kind=URL"},
		{name: "bad url", in: "vllm=127.0.0.1:8000", wantErr: "http:// or https://"},
		{name: "bad name", in: "vllm:a.b=http://h/", wantErr: "ASCII letters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTargets(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "GPUWATCH_ENGINES") {
					t.Fatalf("err %v, want one naming GPUWATCH_ENGINES and saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v", got, err)
			}
		})
	}
}

// TestParallelRanks: SGLang under tensor parallelism labels each rank's copy of the same
// scheduler's figures; only rank 0 is read, so tokens are not counted once per rank.
func TestParallelRanks(t *testing.T) {
	eng := newEngine(t, `# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 4
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 4
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="1",tp_rank="0"} 4
`)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	if smp := one(t, pub.take(t)); smp.Waiting == nil || *smp.Waiting != 4 {
		t.Errorf("waiting = %s, want 4 (rank 0 only)", jsonOf(smp.Waiting))
	}
}

// TestDataParallelRanks: under DP attention every data-parallel rank is a scheduler of its
// own, exported by its first TP rank (tp_rank 0, 1, 2, 3 for dp_rank 0 to 3 at one GPU
// each; moe_ep_rank follows tp_rank under expert parallelism): the queues of all add up.
// With every scheduler exporting (--enable-metrics-for-all-schedulers), the further TP
// ranks of one DP rank repeat its figures and are skipped.
func TestDataParallelRanks(t *testing.T) {
	series := func(dp, tp, v int) string {
		return fmt.Sprintf("sglang:num_queue_reqs{dp_rank=\"%d\",engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"%d\",pp_rank=\"0\",tp_rank=\"%d\"} %d\n"+
			"sglang:num_running_reqs{dp_rank=\"%d\",engine_type=\"unified\",model_name=\"m\",moe_ep_rank=\"%d\",pp_rank=\"0\",tp_rank=\"%d\"} %d\n",
			dp, tp, tp, v, dp, tp, tp, 10*v)
	}
	head := "# TYPE sglang:num_queue_reqs gauge\n# TYPE sglang:num_running_reqs gauge\n"
	for _, tc := range []struct {
		name                     string
		body                     string
		wantWaiting, wantRunning float64
	}{
		{"dp attention, 4 ranks", head + series(0, 0, 1) + series(1, 1, 2) + series(2, 2, 3) + series(3, 3, 4), 10, 100},
		{"every scheduler exports, attention TP 2", head + series(0, 0, 1) + series(0, 1, 1) + series(1, 2, 2) + series(1, 3, 2), 3, 30},
		{"dp rank 10 beside 9", head + series(9, 9, 1) + series(10, 10, 2), 3, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := newEngine(t, tc.body)
			pub := &fakePublisher{}
			s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
			s.Tick(context.Background(), t0)
			smp := one(t, pub.take(t))
			if smp.Waiting == nil || *smp.Waiting != tc.wantWaiting || smp.Running == nil || *smp.Running != tc.wantRunning {
				t.Errorf("waiting %s running %s, want %v and %v", jsonOf(smp.Waiting), jsonOf(smp.Running), tc.wantWaiting, tc.wantRunning)
			}
		})
	}
}

// TestHistogramBounds: two cores of one model with different bounds cannot be added, and a
// histogram whose bounds changed between two scrapes has no delta that tick. The first is
// counted; the second is an engine upgrade, not an error.
func TestHistogramBounds(t *testing.T) {
	hist := func(core, le string, n int) string {
		return fmt.Sprintf(`vllm:time_to_first_token_seconds_bucket{engine="%s",le="%s",model_name="m"} %d
vllm:time_to_first_token_seconds_bucket{engine="%s",le="+Inf",model_name="m"} %d
vllm:time_to_first_token_seconds_count{engine="%s",model_name="m"} %d
vllm:time_to_first_token_seconds_sum{engine="%s",model_name="m"} 1
`, core, le, n, core, n, core, n, core)
	}
	head := "# TYPE vllm:time_to_first_token_seconds histogram\n"
	eng := newEngine(t, head+hist("0", "0.5", 1))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + hist("0", "0.25", 2)) // bounds changed
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + hist("0", "0.25", 3) + hist("1", "0.5", 3)) // cores disagree
	s.Tick(context.Background(), t0.Add(2*time.Second))
	got := pub.take(t)
	if len(got) != 3 {
		t.Fatalf("%d samples", len(got))
	}
	for i, smp := range got {
		if smp.TTFT != nil {
			t.Errorf("tick %d: ttft %s, want none", i, jsonOf(smp.TTFT))
		}
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "histogram_bounds_mismatch")); v != 1 {
		t.Errorf("histogram_bounds_mismatch = %v, want 1", v)
	}
}

// TestPasswordNotShown: an engine behind basic auth has its password in GPUWATCH_ENGINES'
// URL, one behind a gateway a token in its query or as its user name; neither a
// configuration error nor the log of a failed scrape shows them.
func TestPasswordNotShown(t *testing.T) {
	for _, in := range []string{
		"vllm:a.b=http://h/metrics?token=s3cret",         // bad name, a token in the query
		"ollama=http://s3cret@h/metrics",                 // bad kind, a token as the user
		"vllm=ftp://h/metrics?api_key=s3cret",            // bad scheme
		"vllm=http://h:port/metrics?access_token=s3cret", // not a URL
		"vllm=http://scraper:s3cret/metrics",             // not a URL: the @host left out
		"vllm:a.b=http://scraper:s3cret@h/metrics",       // bad name
		"ollama=http://scraper:s3cret@h/metrics",         // bad kind
		"vllm=ftp://scraper:s3cret@h/metrics",            // bad scheme
		"http://scraper:s3cret@h/metrics",                // no kind
		"vllm=scraper:s3cret@h/metrics",                  // no scheme
		"vllm=http://scraper:s3cret@h:port/metrics",      // not a URL
	} {
		_, err := ParseTargets(in)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseTargets(%q): %v", in, err)
		}
	}
	var log bytes.Buffer
	targets, err := ParseTargets("vllm=http://scraper:s3cret@127.0.0.1:1/metrics?token=s3cret,vllm:b=http://s3cret@127.0.0.1:1/metrics")
	if err != nil {
		t.Fatal(err)
	}
	s := New(targets, &fakePublisher{}, Options{Host: "gpu-node-3", Interval: time.Second, Timeout: 300 * time.Millisecond,
		MaxBytes: 1 << 20, MaxModels: 16}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil)))
	s.Tick(context.Background(), t0)
	if strings.Count(log.String(), "cannot scrape") != 2 || strings.Contains(log.String(), "s3cret") {
		t.Errorf("log %s", log.String())
	}
}

// TestBadReadingLeftOut: an engine that exports a reading the contract refuses (two billion
// requests waiting) has that reading left out and counted; its sample goes out with the rest.
func TestBadReadingLeftOut(t *testing.T) {
	eng := newEngine(t, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2e9
`)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	got := one(t, pub.take(t))
	if got.Waiting != nil || got.Running == nil || *got.Running != 3 || !got.Up {
		t.Fatalf("sample %s, want running 3 without waiting", jsonOf(got))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "invalid_reading")); v != 1 {
		t.Errorf("engine_series_dropped_total{invalid_reading} = %v, want 1", v)
	}
}
