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
