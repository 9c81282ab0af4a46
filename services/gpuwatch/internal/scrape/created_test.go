package scrape

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// core is one vLLM engine core's series in an exposition: its prompt_tokens counter, its
// TTFT histogram (count n, all in the first bucket) and the creation time of both.
type core struct {
	engine  string
	prompt  float64
	ttft    int
	created time.Time
}

// vllmCreated writes cores as vLLM's prometheus_client writes its /metrics in the text
// format: each counter's _total series under its own TYPE line, then its _created series
// as a gauge family of their own, each with its HELP line; the histogram's the same way.
// The layout and the creation times' notation are those of a captured vLLM v1 /metrics.
func vllmCreated(cores ...core) string {
	const model = "llama-vllm-single"
	created := func(c core) string {
		return strconv.FormatFloat(float64(c.created.UnixNano())/1e9, 'e', -1, 64)
	}
	var b strings.Builder
	b.WriteString("# HELP vllm:num_requests_running Number of requests in model execution batches.\n" +
		"# TYPE vllm:num_requests_running gauge\n")
	for _, c := range cores {
		fmt.Fprintf(&b, "vllm:num_requests_running{engine=%q,model_name=%q} 0.0\n", c.engine, model)
	}
	b.WriteString("# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n" +
		"# TYPE vllm:prompt_tokens_total counter\n")
	for _, c := range cores {
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{engine=%q,model_name=%q} %.1f\n", c.engine, model, c.prompt)
	}
	b.WriteString("# HELP vllm:prompt_tokens_created Number of prefill tokens processed.\n" +
		"# TYPE vllm:prompt_tokens_created gauge\n")
	for _, c := range cores {
		fmt.Fprintf(&b, "vllm:prompt_tokens_created{engine=%q,model_name=%q} %s\n", c.engine, model, created(c))
	}
	b.WriteString("# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n" +
		"# TYPE vllm:time_to_first_token_seconds histogram\n")
	for _, c := range cores {
		for _, le := range []string{"0.001", "0.005", "+Inf"} {
			n := c.ttft
			if le == "0.001" {
				n = 0
			}
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{engine=%q,le=%q,model_name=%q} %d.0\n", c.engine, le, model, n)
		}
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_count{engine=%q,model_name=%q} %d.0\n", c.engine, model, c.ttft)
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_sum{engine=%q,model_name=%q} %.3f\n", c.engine, model, float64(c.ttft)*0.004)
	}
	b.WriteString("# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.\n" +
		"# TYPE vllm:time_to_first_token_seconds_created gauge\n")
	for _, c := range cores {
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_created{engine=%q,model_name=%q} %s\n", c.engine, model, created(c))
	}
	return b.String()
}

// TestCreatedTellsBackFromNew: an engine core's series that leaves the exposition for longer
// than gpuwatch remembers it and comes back with its old total does not count that total
// as one tick's: its creation time is before the previous scrape, so it was made before.
// A series made after the previous scrape is new and counts from zero; one whose creation
// time changed was reset and counts from zero, even when its new total is above the old.
func TestCreatedTellsBackFromNew(t *testing.T) {
	start := t0.Add(-time.Hour) // when the engine made its series
	eng := newEngine(t, vllmCreated(core{"0", 1000, 10, start}, core{"1", 5_000_000, 50_000, start}))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	tick := func(at time.Time, cores ...core) {
		t.Helper()
		eng.set(vllmCreated(cores...))
		s.Tick(context.Background(), at)
	}
	s.Tick(context.Background(), t0)
	tick(t0.Add(time.Second), core{"0", 1100, 11, start}) // core 1 gone, for longer than a day
	gone := t0.Add(time.Second + seriesForget + time.Hour)
	tick(gone, core{"0", 1200, 12, start})
	// back with its total of before and 300 more: no delta; core 0's 100 only
	tick(gone.Add(time.Second), core{"0", 1300, 13, start}, core{"1", 5_000_300, 50_003, start})
	tick(gone.Add(2*time.Second), core{"0", 1400, 14, start}, core{"1", 5_000_400, 50_004, start})
	// core 0 restarted and, a tick later, above its old total; core 2 made since the last scrape
	restart := gone.Add(2*time.Second + 500*time.Millisecond)
	tick(gone.Add(3*time.Second), core{"0", 1500, 20, restart}, core{"1", 5_000_500, 50_005, start},
		core{"2", 7, 1, gone.Add(2*time.Second + 100*time.Millisecond)})
	got := pub.take(t)
	if len(got) != 6 {
		t.Fatalf("%d samples, want 6", len(got))
	}
	for i, want := range []struct {
		prompt float64
		ttft   float64
	}{
		{100, 1},                     // core 0
		{100, 1},                     // core 0, the day after
		{100, 1},                     // core 0; core 1 back: nothing
		{200, 2},                     // both
		{1500 + 100 + 7, 20 + 1 + 1}, // core 0 from zero, core 1, core 2 from zero
	} {
		smp := got[i+1]
		if smp.PromptTokens == nil || *smp.PromptTokens != want.prompt || smp.TTFT == nil || smp.TTFT.Count != want.ttft {
			t.Errorf("tick %d: prompt_tokens %s, ttft %s; want %v and a count of %v",
				i+1, jsonOf(smp.PromptTokens), jsonOf(smp.TTFT), want.prompt, want.ttft)
		}
	}
}

// TestSeriesBackAfterMinutes: without creation times (TGI, prometheus_client with them
// turned off) a series gone for minutes and back with its old total counts from its last
// value, not its whole total: gone series are remembered for a day.
func TestSeriesBackAfterMinutes(t *testing.T) {
	head := "# TYPE vllm:prompt_tokens_total counter\n"
	series := func(core string, v int) string {
		return fmt.Sprintf("vllm:prompt_tokens_total{engine=%q,model_name=\"m\"} %d\n", core, v)
	}
	eng := newEngine(t, head+series("0", 1000)+series("1", 5_000_000))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(head + series("0", 1100))
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + series("0", 1200))
	s.Tick(context.Background(), t0.Add(20*time.Minute))
	eng.set(head + series("0", 1300) + series("1", 5_000_300)) // back after 20 minutes
	s.Tick(context.Background(), t0.Add(20*time.Minute+time.Second))
	got := pub.take(t)
	if len(got) != 4 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []float64{100, 100, 400} {
		if smp := got[i+1]; smp.PromptTokens == nil || *smp.PromptTokens != want {
			t.Errorf("tick %d: prompt_tokens %s, want %v", i+1, jsonOf(smp.PromptTokens), want)
		}
	}
}

// TestGoneSeriesForgottenOldestFirst: once the series gone outnumber those of the last
// scrape, the longest gone are forgotten first.
func TestGoneSeriesForgottenOldestFirst(t *testing.T) {
	head := "# TYPE sglang:prompt_tokens_total counter\n"
	series := func(tenant string) string {
		return fmt.Sprintf("sglang:prompt_tokens_total{model_name=\"m\",tenant=%q} 1\n", tenant)
	}
	eng := newEngine(t, head+series("a")+series("b"))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)          // a, b
	eng.set(head + series("c") + series("d")) // a, b gone
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(head + series("c")) // d gone: 3 gone, 1 live
	s.Tick(context.Background(), t0.Add(2*time.Second))
	tg := s.targets[0]
	if len(tg.series) != 2 {
		t.Fatalf("%d series kept, want 2", len(tg.series))
	}
	for _, sv := range tg.series {
		if sv.seen.Before(t0.Add(time.Second)) {
			t.Errorf("a series gone since the first scrape kept, one gone since later forgotten")
		}
	}
}

// TestCreatedBesideTheCounter: an exposition that writes the _created series under the
// counter's own TYPE line (the OpenMetrics layout in the text format) is read alike: a
// reset above the old total counts from zero.
func TestCreatedBesideTheCounter(t *testing.T) {
	body := func(v int, created string) string {
		return "# TYPE vllm:prompt_tokens counter\n" +
			fmt.Sprintf("vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} %d.0\n", v) +
			"vllm:prompt_tokens_created{engine=\"0\",model_name=\"m\"} " + created + "\n"
	}
	eng := newEngine(t, body(1000, "1.7645e+09"))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(body(1100, "1.7645e+09"))
	s.Tick(context.Background(), t0.Add(time.Second))
	eng.set(body(1250, "1.7645e+09"))
	s.Tick(context.Background(), t0.Add(2*time.Second))
	eng.set(body(1400, strconv.FormatFloat(float64(t0.Add(2500*time.Millisecond).Unix()), 'e', -1, 64))) // reset, above
	s.Tick(context.Background(), t0.Add(3*time.Second))
	got := pub.take(t)
	if len(got) != 4 {
		t.Fatalf("%d samples", len(got))
	}
	for i, want := range []float64{100, 150, 1400} {
		if smp := got[i+1]; smp.PromptTokens == nil || *smp.PromptTokens != want {
			t.Errorf("tick %d: prompt_tokens %s, want %v", i+1, jsonOf(smp.PromptTokens), want)
		}
	}
}

// TestCreatedThatMoves: an exposition whose _created series follow the clock (written anew
// at each scrape) has no creation times: the counter's deltas are its value's, never its
// whole total at each tick.
func TestCreatedThatMoves(t *testing.T) {
	body := func(v int, at time.Time) string {
		return "# TYPE vllm:prompt_tokens_total counter\n" +
			fmt.Sprintf("vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} %d.0\n", v) +
			"# TYPE vllm:prompt_tokens_created gauge\n" +
			"vllm:prompt_tokens_created{engine=\"0\",model_name=\"m\"} " + strconv.FormatFloat(float64(at.UnixNano())/1e9, 'e', -1, 64) + "\n"
	}
	eng := newEngine(t, body(1000, t0))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	for i := 1; i <= 3; i++ {
		at := t0.Add(time.Duration(i) * time.Second)
		eng.set(body(1000+100*i, at.Add(10*time.Millisecond)))
		s.Tick(context.Background(), at)
	}
	got := pub.take(t)
	if len(got) != 4 {
		t.Fatalf("%d samples", len(got))
	}
	for i, smp := range got[1:] {
		if smp.PromptTokens == nil || *smp.PromptTokens != 100 {
			t.Errorf("tick %d: prompt_tokens %s, want 100", i+1, jsonOf(smp.PromptTokens))
		}
	}
}
