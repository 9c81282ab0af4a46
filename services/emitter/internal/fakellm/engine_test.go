package fakellm

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// clock is a test clock the scheduler reads; only the test moves it.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("cannot parse /metrics: %v", err)
	}
	return mfs
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	if !ok || len(mf.Metric) != 1 {
		t.Fatalf("/metrics lacks %s as one series", name)
	}
	m := mf.Metric[0]
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	t.Fatalf("%s is neither a gauge nor a counter", name)
	return 0
}

// TestEngineQueue: under a load above the batch, requests queue; their queue time is the
// time they waited for a slot, and the histograms say what the scheduler recorded.
func TestEngineQueue(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	fake := New(Options{Tokens: 4, TPOT: time.Millisecond, MaxBatch: 2, Now: c.now})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	const body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"a b c"}]}`
	do := func(ctx context.Context, mode string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		if mode != "" {
			req.Header.Set("X-Fakellm-Mode", mode)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	waitFor := func(what string, ok func(map[string]*dto.MetricFamily) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if ok(scrape(t, srv.URL)) {
				return
			}
		}
		t.Fatalf("never saw %s", what)
	}
	// Two streams that stall hold both slots until their clients leave.
	stallCtx, release := context.WithCancel(context.Background())
	defer release() // before srv.Close, which waits for the stalled streams
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _ = do(stallCtx, ModeStall) })
	}
	waitFor("2 running", func(m map[string]*dto.MetricFamily) bool {
		return value(t, m, "vllm:num_requests_running") == 2
	})
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- do(context.Background(), "") })
	}
	waitFor("4 waiting", func(m map[string]*dto.MetricFamily) bool {
		return value(t, m, "vllm:num_requests_waiting") == 4
	})
	c.advance(10 * time.Second)
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a queued request failed: %v", err)
		}
	}

	recs := fake.Finished()
	if len(recs) != 4 {
		t.Fatalf("%d requests finished, want the 4 queued ones (the stalled ones were aborted)", len(recs))
	}
	var queueSum float64
	for _, r := range recs {
		// Each waited at least until the stalled streams left: 10 s on the scheduler's clock.
		if r.Queue < 10*time.Second || r.TTFT < r.Queue || r.Output != 4 || r.Input != 3 {
			t.Fatalf("record %+v: want queue ≥ 10s, TTFT ≥ queue, 3 in, 4 out", r)
		}
		queueSum += r.Queue.Seconds()
	}
	mfs := scrape(t, srv.URL)
	h := mfs["vllm:request_queue_time_seconds"].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 4 || math.Abs(h.GetSampleSum()-queueSum) > 1e-9 {
		t.Fatalf("queue histogram count %d sum %g, want 4 and %g", h.GetSampleCount(), h.GetSampleSum(), queueSum)
	}
	if n := mfs["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 6 {
		t.Fatalf("TTFT histogram count %d, want 6: the stalled streams had their first tokens too", n)
	}
	if v := value(t, mfs, "vllm:num_requests_waiting"); v != 0 {
		t.Fatalf("%g still waiting", v)
	}
	if v := value(t, mfs, "vllm:generation_tokens_total"); v < 16 {
		t.Fatalf("generation tokens %g, want at least the 16 of the finished requests", v)
	}
	if v := value(t, mfs, "vllm:prompt_tokens_total"); v != 6*3 {
		t.Fatalf("prompt tokens %g, want 18", v)
	}
}

// TestEnginePreemption: when the KV cache is full, the newest running request is
// preempted, goes back to the front of the queue, and recomputes when readmitted.
func TestEnginePreemption(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	e := newEngine(Options{MaxBatch: 4, KVTokens: 100, Now: c.now}, prometheus.NewRegistry())
	a, b, d := &seq{input: 40}, &seq{input: 40}, &seq{input: 30}
	for _, s := range []*seq{a, b, d} {
		if err := e.submit(s, 30); err != nil {
			t.Fatal(err)
		}
	}
	if r, w, u := e.state(); r != 2 || w != 1 || u != 0.8 {
		t.Fatalf("running %d waiting %d usage %g: the third does not fit beside 80 KV tokens, want 2, 1, 0.8", r, w, u)
	}
	for range 20 {
		if !e.grow(a) {
			t.Fatal("a was preempted while the cache had room")
		}
	}
	c.advance(time.Second)
	if !e.grow(a) {
		t.Fatal("the oldest request was preempted")
	}
	if b.state != waiting || b.rec.Preemptions != 1 || e.waiting[0] != b || testutil.ToFloat64(e.m.preemptions) != 1 {
		t.Fatalf("b state %d, preemptions %d, queue head is b: %v; want b preempted to the queue's front", b.state, b.rec.Preemptions, e.waiting[0] == b)
	}
	if r, w, _ := e.state(); r != 1 || w != 2 || e.kvUsed != 61 {
		t.Fatalf("running %d waiting %d KV %d, want 1, 2, 61", r, w, e.kvUsed)
	}
	if e.grow(b) {
		t.Fatal("a preempted request grew")
	}
	c.advance(2 * time.Second)
	e.finish(a)
	if b.state != running || b.kv != 40 || d.state != running {
		t.Fatalf("after a finished: b state %d kv %d, d state %d; want both running, b recomputing its 40", b.state, b.kv, d.state)
	}
	if b.rec.Queue != 2*time.Second || d.rec.Queue != 3*time.Second {
		t.Fatalf("queue times b %v d %v, want 2s (since its preemption) and 3s", b.rec.Queue, d.rec.Queue)
	}
	// The newest request, growing into a full cache, preempts itself.
	e = newEngine(Options{MaxBatch: 2, KVTokens: 10, Now: c.now}, prometheus.NewRegistry())
	x, y := &seq{input: 5}, &seq{input: 4}
	_, _ = e.submit(x, 5), e.submit(y, 4)
	if !e.grow(x) || e.grow(y) || y.state != waiting || x.state != running || e.kvUsed != 6 {
		t.Fatalf("x state %d y state %d KV %d: want y preempted by its own growth, x running with 6", x.state, y.state, e.kvUsed)
	}
	if err := e.submit(&seq{input: 200}, 1); err == nil {
		t.Fatal("a request longer than the KV cache was queued")
	}
}

// TestPrefixCache: a prompt whose leading blocks were computed before hits the cache, in
// whole 16-token blocks, and its prefill is shorter.
func TestPrefixCache(t *testing.T) {
	fake := New(Options{Tokens: 2, PrefixCache: true, PrefillPer1K: time.Second})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	system := strings.Repeat("you are a helpful assistant ", 8) // 40 words: 2 full blocks, 8 over
	post := func(system, user string) string {
		resp, err := http.Post(srv.URL+"/v1/messages", "application/json",
			strings.NewReader(`{"model":"claude","max_tokens":8,"system":"`+system+`","messages":[{"role":"user","content":"`+user+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first := post(system, "what is a token")
	post(system, "and what is a stream")
	post("be brief "+system, "what is a token")
	recs := fake.Finished()
	if len(recs) != 3 || recs[0].PrefixHit != 0 || recs[1].PrefixHit != 32 || recs[2].PrefixHit != 0 {
		t.Fatalf("prefix hits %+v, want 0, 32 (the system prompt's full blocks), 0 (a different start)", recs)
	}
	if recs[1].Prefill >= recs[0].Prefill {
		t.Fatalf("a hit's prefill %v is not shorter than a miss's %v", recs[1].Prefill, recs[0].Prefill)
	}
	mfs := scrape(t, srv.URL)
	if q, h := value(t, mfs, "vllm:prefix_cache_queries_total"), value(t, mfs, "vllm:prefix_cache_hits_total"); q != 44+45+46 || h != 32 {
		t.Fatalf("prefix cache queries %g hits %g, want 135 and 32", q, h)
	}
	// The scheduler changes timing only: the answer is the one the fake gives without it.
	plain := httptest.NewServer(New(Options{Tokens: 2}))
	defer plain.Close()
	resp, err := http.Post(plain.URL+"/v1/messages", "application/json",
		strings.NewReader(`{"model":"claude","max_tokens":8,"system":"`+system+`","messages":[{"role":"user","content":"what is a token"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != first {
		t.Fatalf("the scheduler changed the answer:\n%s\nwant:\n%s", first, b)
	}
}

// TestEngineMetricsExposition: /metrics carries vLLM's names, types and labels, and is
// absent while the scheduler is off.
func TestEngineMetricsExposition(t *testing.T) {
	srv := httptest.NewServer(New(Options{Tokens: 2, MaxBatch: 8, KVTokens: 4096, ModelName: "llama"}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"a b"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mfs := scrape(t, srv.URL)
	want := map[string]dto.MetricType{
		"vllm:num_requests_running":         dto.MetricType_GAUGE,
		"vllm:num_requests_waiting":         dto.MetricType_GAUGE,
		"vllm:kv_cache_usage_perc":          dto.MetricType_GAUGE,
		"vllm:prefix_cache_queries_total":   dto.MetricType_COUNTER,
		"vllm:prefix_cache_hits_total":      dto.MetricType_COUNTER,
		"vllm:num_preemptions_total":        dto.MetricType_COUNTER,
		"vllm:prompt_tokens_total":          dto.MetricType_COUNTER,
		"vllm:generation_tokens_total":      dto.MetricType_COUNTER,
		"vllm:request_queue_time_seconds":   dto.MetricType_HISTOGRAM,
		"vllm:time_to_first_token_seconds":  dto.MetricType_HISTOGRAM,
		"vllm:request_prefill_time_seconds": dto.MetricType_HISTOGRAM,
		"vllm:request_decode_time_seconds":  dto.MetricType_HISTOGRAM,
	}
	for name, typ := range want {
		mf, ok := mfs[name]
		if !ok {
			t.Errorf("/metrics lacks %s", name)
			continue
		}
		if mf.GetType() != typ {
			t.Errorf("%s is a %v, want a %v", name, mf.GetType(), typ)
		}
		labels := map[string]string{}
		for _, l := range mf.Metric[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if len(labels) != 2 || labels["model_name"] != "llama" || labels["engine"] != "0" {
			t.Errorf("%s labels %v, want model_name=llama engine=0", name, labels)
		}
	}
	if n := len(mfs["vllm:request_queue_time_seconds"].Metric[0].GetHistogram().GetBucket()); n != len(requestLatencyBuckets)+1 {
		t.Errorf("queue histogram has %d buckets, want vLLM's %d and +Inf", n, len(requestLatencyBuckets))
	}
	if v := value(t, mfs, "vllm:prompt_tokens_total"); v != 2 {
		t.Errorf("prompt tokens %g, want 2", v)
	}
	off := httptest.NewServer(New(Options{}))
	defer off.Close()
	resp, err = http.Get(off.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/metrics with the scheduler off: status %d, want 404", resp.StatusCode)
	}
}

// TestEngineUnderLoad: requests that together outgrow the KV cache are preempted and
// readmitted, and every one still ends with all its tokens; the counters agree with the
// scheduler's records, and an idle engine holds nothing.
func TestEngineUnderLoad(t *testing.T) {
	fake := New(Options{Tokens: 10, TPOT: 20 * time.Millisecond, MaxBatch: 4, KVTokens: 40})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	var wg sync.WaitGroup
	errs := make(chan string, 12)
	for i := range 12 {
		wg.Go(func() {
			body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"one two three four ` + strings.Repeat("x", i+1) + `"}]}`
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil || !strings.Contains(string(b), `"completion_tokens":10`) || !strings.Contains(string(b), "[DONE]") {
				errs <- string(b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("a request did not end whole: %s", e)
	}
	recs := fake.Finished()
	preempted := 0
	for _, r := range recs {
		preempted += r.Preemptions
	}
	mfs := scrape(t, srv.URL)
	if len(recs) != 12 || preempted == 0 || value(t, mfs, "vllm:num_preemptions_total") != float64(preempted) {
		t.Fatalf("%d finished, %d preemptions recorded, %g counted; want 12 finished, some preempted, the counter equal", len(recs), preempted, value(t, mfs, "vllm:num_preemptions_total"))
	}
	if g := value(t, mfs, "vllm:generation_tokens_total"); g != 120 {
		t.Fatalf("generation tokens %g, want 120: a recomputed token is not generated twice", g)
	}
	if r, w, u := value(t, mfs, "vllm:num_requests_running"), value(t, mfs, "vllm:num_requests_waiting"), value(t, mfs, "vllm:kv_cache_usage_perc"); r != 0 || w != 0 || u != 0 {
		t.Fatalf("idle engine: running %g waiting %g KV usage %g, want 0", r, w, u)
	}
}
