package scrape

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSeriesCacheBoundedWhenMalformed: an engine whose exposition is malformed scrape after
// scrape (series first, then a line that breaks it), each time with other label values, is
// reported down; what the parser remembers of its series must stay bounded by one
// exposition, not grow by one exposition every scrape until the engine sends a good one.
func TestSeriesCacheBoundedWhenMalformed(t *testing.T) {
	body := func(tick int) string {
		var b strings.Builder
		b.WriteString("# TYPE sglang:prompt_tokens_total counter\n")
		for i := range 50 {
			fmt.Fprintf(&b, "sglang:prompt_tokens_total{model_name=\"m\",tenant=\"%d-%d\"} 1\n", tick, i)
		}
		b.WriteString("sglang:prompt_tokens_total{model_name=\"m\" 1\n") // malformed
		return b.String()
	}
	eng := newEngine(t, body(0))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "sglang", Name: "sglang", URL: eng.URL}}, pub, 4)
	for tick := range 20 {
		eng.set(body(tick))
		s.Tick(context.Background(), t0.Add(time.Duration(tick)*time.Second))
	}
	c := s.targets[0].cache
	t.Logf("after 20 malformed scrapes of 50 series: %d entries, %d by labels", len(c.entries), len(c.byLabels))
	if len(c.entries) > 100 || len(c.byLabels) > 100 {
		t.Errorf("the series cache holds %d texts and %d label sets after 20 malformed expositions of 50 series: it grows by one exposition a scrape", len(c.entries), len(c.byLabels))
	}
}

// TestBucketWithoutLeUnwinds: an exposition that fails at a histogram bucket without a
// numeric le is malformed like one the parser refuses: the series it added before the
// bucket are forgotten and those held kept, so a flood sent with such a bucket does not
// keep the places it took until the next good scrape.
func TestBucketWithoutLeUnwinds(t *testing.T) {
	good := "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n"
	c := newSeriesCache(1000)
	if _, err := families([]byte(good), names["vllm"], c); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString(good + "# TYPE vllm:prompt_tokens_total counter\n")
	for i := range 500 {
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} 1\n", i)
	}
	b.WriteString("# TYPE vllm:time_to_first_token_seconds histogram\n")
	b.WriteString("vllm:time_to_first_token_seconds_bucket{le=\"x\",model_name=\"m\"} 1\n")
	if _, err := families([]byte(b.String()), names["vllm"], c); err == nil {
		t.Fatal("a bucket without a numeric le: no error")
	}
	checkHeld(t, c)
	if len(c.entries) != 1 || len(c.byLabels) != 1 {
		t.Errorf("after a scrape that failed at a bucket without le: %d entries, %d label sets held; want the 1 of the good scrape before", len(c.entries), len(c.byLabels))
	}
}

// TestMalformedUnwindsOnlyItsOwn: a malformed scrape that read series held again, a new
// text of a held series (its labels in another order) and new series forgets only what it
// added: the counts per family stay those of the series held, and the next good scrape
// still reads the held series once, its other text a copy of it.
func TestMalformedUnwindsOnlyItsOwn(t *testing.T) {
	const held = "# TYPE vllm:prompt_tokens_total counter\n" +
		"vllm:prompt_tokens_total{model_name=\"m\",engine=\"0\"} 1\n" +
		"# TYPE vllm:time_to_first_token_seconds histogram\n" +
		"vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 1\n"
	c := newSeriesCache(1000)
	if _, err := families([]byte(held), names["vllm"], c); err != nil {
		t.Fatal(err)
	}
	before := len(c.entries)
	bad := held + "vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 1\n" +
		"vllm:prompt_tokens_total{model_name=\"m\",engine=\"1\"} 1\n" +
		"vllm:time_to_first_token_seconds_bucket{le=\"1\",model_name=\"m\"} 1\n" +
		"vllm:prompt_tokens_total{model_name=\"m\" 1\n"
	if _, err := families([]byte(bad), names["vllm"], c); err == nil {
		t.Fatal("malformed exposition: no error")
	}
	checkHeld(t, c)
	if len(c.entries) != before || len(c.byLabels) != before {
		t.Errorf("after the malformed scrape: %d texts, %d series held; want the %d of the good scrape", len(c.entries), len(c.byLabels), before)
	}
	fams, err := families([]byte(held+"vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 1\n"), names["vllm"], c)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(fams["vllm:prompt_tokens_total"].GetMetric()); n != 1 || c.dups != 1 {
		t.Errorf("next good scrape: %d prompt token series read, %d copies left out; want 1 and 1", n, c.dups)
	}
	checkHeld(t, c)
}
