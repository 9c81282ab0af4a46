package scrape

import (
	"context"
	"testing"
	"time"
)

// TestCreatedThatFlips: creation times that cannot be a series made anew since the last
// scrape (one back to an older value, one before the previous scrape, one far in the
// future) are no reset, even held two scrapes each: the counter's and the histogram's
// deltas are their values', never their whole totals. An exposition alternating between
// two processes' creation times, or writing garbage there, must not count a counter's
// whole total at every change.
func TestCreatedThatFlips(t *testing.T) {
	future := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		name    string
		created []time.Time // per tick, from the first
	}{
		{"two old times in turn", []time.Time{
			t0.Add(-2 * time.Hour), t0.Add(-2 * time.Hour), t0.Add(-time.Hour), t0.Add(-time.Hour),
			t0.Add(-2 * time.Hour), t0.Add(-2 * time.Hour), t0.Add(-time.Hour), t0.Add(-time.Hour)}},
		{"far in the future", []time.Time{
			future(time.Hour), future(time.Hour), future(2 * time.Hour), future(2 * time.Hour),
			future(3 * time.Hour), future(3 * time.Hour), future(4 * time.Hour), future(4 * time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
			c := func(i int) core { return core{"0", float64(1_000_000 + 100*i), 10_000 + i, tc.created[i]} }
			eng := newEngine(t, vllmCreated(c(0)))
			pub := &fakePublisher{}
			s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
			s.Tick(context.Background(), at(0))
			for i := 1; i < len(tc.created); i++ {
				eng.set(vllmCreated(c(i)))
				s.Tick(context.Background(), at(i))
			}
			got := pub.take(t)
			if len(got) != len(tc.created) {
				t.Fatalf("%d samples, want %d", len(got), len(tc.created))
			}
			for i, smp := range got[1:] {
				if smp.PromptTokens == nil || *smp.PromptTokens != 100 || smp.TTFT == nil || smp.TTFT.Count != 1 {
					t.Errorf("tick %d: prompt_tokens %s, ttft %s; want 100 and a count of 1",
						i+1, jsonOf(smp.PromptTokens), jsonOf(smp.TTFT))
				}
			}
		})
	}
}
