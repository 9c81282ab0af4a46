package scrape

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestRedirectToOtherHost: an engine's endpoint that redirects to another host (a
// compromised or misconfigured proxy in front of it, or a login page elsewhere) is not
// followed: gpuwatch would read, and publish as this engine's, whatever that host serves,
// and would send requests wherever the engine points it. The scrape fails as http_status.
// A redirect on the same host (Starlette's /metrics → /metrics/) is followed.
func TestRedirectToOtherHost(t *testing.T) {
	elsewhere := newEngine(t, fixture(t, "vllm.prom"))
	cross := httptest.NewServer(http.RedirectHandler(elsewhere.URL+"/metrics", http.StatusFound))
	t.Cleanup(cross.Close)
	mux := http.NewServeMux()
	mux.Handle("/metrics", http.RedirectHandler("/metrics/", http.StatusTemporaryRedirect))
	mux.HandleFunc("/metrics/", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(fixture(t, "vllm.prom"))) })
	same := httptest.NewServer(mux)
	t.Cleanup(same.Close)

	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{
		{Engine: "vllm", Name: "cross", URL: cross.URL + "/metrics"},
		{Engine: "vllm", Name: "same", URL: same.URL + "/metrics"},
	}, pub, 16)
	s.Tick(context.Background(), t0)
	for _, smp := range pub.take(t) {
		switch smp.Name {
		case "cross":
			if smp.Up || smp.Error != "http_status" {
				t.Errorf("a redirect to another host gave %s, want up=false error http_status", jsonOf(smp))
			}
		case "same":
			if !smp.Up {
				t.Errorf("a redirect on the same host gave %s, want it followed", jsonOf(smp))
			}
		}
	}
	if v := testutil.ToFloat64(s.m.failed.WithLabelValues("cross", "http_status")); v != 1 {
		t.Errorf("engine_scrape_errors_total{cross,http_status} = %v, want 1", v)
	}
}

// TestCorruptGzip: a gzip answer that does not inflate (corrupt, or cut short) is an
// exposition that cannot be read, not a connection that failed: its reason is malformed.
func TestCorruptGzip(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte(fixture(t, "vllm.prom")))
	_ = zw.Close()
	bad := bytes.Clone(zipped.Bytes())
	bad[len(bad)-6] ^= 0xff // the CRC-32 at the end no longer matches
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(bad)
	}))
	t.Cleanup(eng.Close)
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	if smp := one(t, pub.take(t)); smp.Up || smp.Error != "malformed" {
		t.Errorf("a corrupt gzip answer gave %s, want up=false error malformed", jsonOf(smp))
	}
}

// TestCounterFallsWithSameCreationTime: a counter series that falls while its creation time
// stays what it was at the scrapes before was not reset (a reset makes a new creation time):
// the value is refused (bad_value) and its last good one kept, so a series that reads 1000,
// 990, 1000 (two processes' figures behind one address, a glitch of the exporter) adds
// nothing, where reading the fall as a restart would add 990 and then 10.
func TestCounterFallsWithSameCreationTime(t *testing.T) {
	made := t0.Add(-time.Hour)
	eng := newEngine(t, vllmCreated(core{engine: "0", prompt: 1000, created: made}))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	total := 0.0
	for i, v := range []float64{1000, 1000, 990, 1000, 1010} {
		eng.set(vllmCreated(core{engine: "0", prompt: v, created: made}))
		s.Tick(context.Background(), t0.Add(time.Duration(i)*time.Second))
		if smp := one(t, pub.take(t)); smp.PromptTokens != nil {
			total += *smp.PromptTokens
		}
	}
	if total != 10 {
		t.Errorf("prompt_tokens deltas over 1000, 1000, 990, 1000, 1010 with one creation time add up to %v, want 10", total)
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "bad_value")); v != 1 {
		t.Errorf("engine_series_dropped_total{bad_value} = %v, want 1", v)
	}
}

// TestHistogramFallsWithSameCreationTime: TestCounterFallsWithSameCreationTime for a
// histogram series: its counts falling under an unchanged creation time are refused, not
// read as a restart that counts every observation again.
func TestHistogramFallsWithSameCreationTime(t *testing.T) {
	made := t0.Add(-time.Hour)
	eng := newEngine(t, vllmCreated(core{engine: "0", ttft: 100, created: made}))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	total := 0.0
	for i, n := range []int{100, 100, 99, 100, 101} {
		eng.set(vllmCreated(core{engine: "0", ttft: n, created: made}))
		s.Tick(context.Background(), t0.Add(time.Duration(i)*time.Second))
		if smp := one(t, pub.take(t)); smp.TTFT != nil {
			total += smp.TTFT.Count
		}
	}
	if total != 1 {
		t.Errorf("ttft count deltas over 100, 100, 99, 100, 101 with one creation time add up to %v, want 1", total)
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "bad_value")); v != 1 {
		t.Errorf("engine_series_dropped_total{bad_value} = %v, want 1", v)
	}
}

// TestSeriesFlood: an exposition of one model whose other label takes a new value on every
// series (a tenant label flooded, an exporter bug) is bounded by a count of series, not only
// by GPUWATCH_ENGINE_MAX_BYTES: each series read costs some twenty times its bytes, so a
// limit of 256 MiB would otherwise let one engine hold gigabytes. The series past the limit
// are left out and counted; the model's sample still goes out with the readings beside them.
func TestSeriesFlood(t *testing.T) {
	body := func(tick int) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n")
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		for i := range 3 * DefaultMaxSeries {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"%d-%d\"} 1\n", tick, i)
		}
		return b.String()
	}
	sc := newVLLMScrape(t, body(0), 0)
	for tick := range 3 {
		if smp := sc.at(t, tick, body(tick)); !smp.Up || smp.Running == nil || *smp.Running != 3 {
			t.Fatalf("tick %d: sample %s, want up with running 3", tick, jsonOf(smp))
		}
	}
	tg := sc.s.targets[0]
	if len(tg.cache.entries) > DefaultMaxSeries || len(tg.series) > 2*DefaultMaxSeries {
		t.Errorf("after 3 scrapes of %d series: %d cached, %d tracked; want at most %d and %d", 3*DefaultMaxSeries,
			len(tg.cache.entries), len(tg.series), DefaultMaxSeries, 2*DefaultMaxSeries)
	}
	// each tick's tenants are new: the first scrape reads as many as one family may hold
	// (its quota and the pool); at the second those it held fill that until it ends (all
	// but the gauge gone); the third is as the first
	held := tg.cache.quota + tg.cache.pool
	if held < DefaultMaxSeries/2 {
		t.Errorf("one family may hold %d series of %d", held, DefaultMaxSeries)
	}
	if v, want := testutil.ToFloat64(sc.s.m.dropped.WithLabelValues("vllm", "series_over_limit")), float64((3*DefaultMaxSeries-held)+3*DefaultMaxSeries+(3*DefaultMaxSeries-held)); v != want {
		t.Errorf("engine_series_dropped_total{series_over_limit} = %v, want %v", v, want)
	}
}

// TestSeriesFloodAfterModel: a flood that begins while the model is read (a tenant label
// whose new values prometheus_client appends to the end of each family it floods) does not
// push the model's series of the families after it out of the scrape: the series read
// before keep their place, and the flood's new ones take what the limit leaves. The
// model's generation tokens, exposed after the flooded family, go on being counted.
func TestSeriesFloodAfterModel(t *testing.T) {
	body := func(tick, flood int) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\"} %d\n", 100*tick)
		for i := range flood {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} 1\n", i)
		}
		b.WriteString("# TYPE vllm:generation_tokens_total counter\n")
		fmt.Fprintf(&b, "vllm:generation_tokens_total{model_name=\"m\"} %d\n", 10*tick)
		return b.String()
	}
	sc := newVLLMScrape(t, body(0, 0), 0)
	for tick := range 4 {
		flood := 0
		if tick >= 2 {
			flood = 2 * DefaultMaxSeries
		}
		smp := sc.at(t, tick, body(tick, flood))
		if tick == 0 {
			continue
		}
		if smp.GenerationTokens == nil || *smp.GenerationTokens != 10 {
			t.Errorf("tick %d (flood of %d series before it): sample %s, want generation_tokens 10", tick, flood, jsonOf(smp))
		}
	}
	if n := len(sc.s.targets[0].cache.entries); n > DefaultMaxSeries {
		t.Errorf("%d series cached, want at most %d", n, DefaultMaxSeries)
	}
}

// TestSeriesLeftOutNotCountedWhole: a series the limit left out, read once the limit has
// room (the flood before it gone), has a total gpuwatch never saw grow: with no creation
// time to tell (SGLang, TGI, vLLM under PROMETHEUS_MULTIPROC_DIR) it is taken as where
// its deltas start, not counted whole as a series new to the exposition would be.
func TestSeriesLeftOutNotCountedWhole(t *testing.T) {
	body := func(v, flood int) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n")
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		for i := range flood {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"f%d\"} 1\n", i)
		}
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"real\"} %d\n", v)
		b.WriteString("# TYPE vllm:time_to_first_token_seconds histogram\n")
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=\"1\",model_name=\"m\"} %d\n", v/10)
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} %d\n", v/10)
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_count{model_name=\"m\"} %d\nvllm:time_to_first_token_seconds_sum{model_name=\"m\"} %d\n", v/10, v/10)
		return b.String()
	}
	sc := newVLLMScrape(t, body(1000, DefaultMaxSeries), 0)
	for tick, want := range []float64{-1, -1, 0, 10, 10} { // -1: no reading wanted
		flood := 0
		if tick == 0 {
			flood = DefaultMaxSeries
		}
		smp := sc.at(t, tick, body(1000+10*tick, flood))
		got := -1.0
		if smp.PromptTokens != nil {
			got = *smp.PromptTokens
		}
		if want >= 0 && got != want && !(want == 0 && got == -1) {
			t.Errorf("tick %d: prompt_tokens %v, want %v (sample %s)", tick, got, want, jsonOf(smp))
		}
		// the histogram, of another family than the flood, keeps its family's share of the
		// limit: it is read from the first scrape
		if tick >= 1 && (smp.TTFT == nil || smp.TTFT.Count != 1) {
			t.Errorf("tick %d: ttft %+v, want count 1", tick, smp.TTFT)
		}
	}
}

// TestHTMLAnswer: a 200 that is a web page (a proxy's error or login page in front of the
// engine) is no exposition, even when its body happens to parse (empty, or comments only):
// the scrape fails as malformed rather than reporting the engine up with nothing to read.
func TestHTMLAnswer(t *testing.T) {
	for _, tc := range []struct{ ctype, body string }{
		{"text/html; charset=utf-8", ""},
		{"text/html", "# not an exposition\n"},
		{"text/html", "<!DOCTYPE html>\n<html><body>Sign in</body></html>\n"},
		{"application/json", "{}"},
		{"text/html; charset", ""}, // a parameter Go cannot parse: the type is still HTML
		{"Text/HTML; charset=\"utf-8", "# a comment\n"},
	} {
		eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", tc.ctype)
			_, _ = w.Write([]byte(tc.body))
		}))
		pub := &fakePublisher{}
		s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
		s.Tick(context.Background(), t0)
		if smp := one(t, pub.take(t)); smp.Up || smp.Error != "malformed" {
			t.Errorf("a 200 of %s %q gave %s, want up=false error malformed", tc.ctype, tc.body, jsonOf(smp))
		}
		eng.Close()
	}
}

// TestExpositionContentTypes: what engines and the proxies before them label an exposition
// (prometheus_client's text/plain; version=0.0.4, OpenMetrics, none at all, a parameter
// that does not parse) is read.
func TestExpositionContentTypes(t *testing.T) {
	for _, ctype := range []string{
		"text/plain; version=0.0.4; charset=utf-8", "text/plain", "",
		"application/openmetrics-text; version=1.0.0; charset=utf-8", "text/plain; charset",
		"application/octet-stream",
	} {
		eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = []string{ctype} // "" too: net/http would sniff an unset one
			_, _ = w.Write([]byte(fixture(t, "vllm.prom")))
		}))
		pub := &fakePublisher{}
		s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
		s.Tick(context.Background(), t0)
		if smp := one(t, pub.take(t)); !smp.Up {
			t.Errorf("an exposition of type %q gave %s, want it read", ctype, jsonOf(smp))
		}
		eng.Close()
	}
}

// TestMislabelledExposition: an exposition under the type of a web page or an API's answer
// (Flask's default text/html for a route that returns generate_latest(), the
// application/json some Rust exporters sent) is still an exposition: its series are read.
// Only a document of those types with no series of the families read is refused.
func TestMislabelledExposition(t *testing.T) {
	for _, ctype := range []string{"text/html; charset=utf-8", "application/json"} {
		eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ctype)
			_, _ = w.Write([]byte(fixture(t, "vllm.prom")))
		}))
		pub := &fakePublisher{}
		s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
		s.Tick(context.Background(), t0)
		if smp := one(t, pub.take(t)); !smp.Up || smp.Model == "" {
			t.Errorf("an exposition labelled %s gave %s, want its model read", ctype, jsonOf(smp))
		}
		eng.Close()
	}
}

// TestRedirectRule: which redirects an engine's endpoint may give. On its own host and port
// (the host in any case, a default port written or not), and from http to https of the same
// host on the default ports (a proxy that upgrades every request): followed. Another host
// or port, or https to http (the URL's query and credentials would go in clear): not.
func TestRedirectRule(t *testing.T) {
	f := func(from, to string, hops int, want bool) {
		t.Helper()
		var via []*http.Request
		for range hops {
			r, err := http.NewRequest(http.MethodGet, from, nil)
			if err != nil {
				t.Fatal(err)
			}
			via = append(via, r)
		}
		req, err := http.NewRequest(http.MethodGet, to, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameHost(req, via); (err == nil) != want {
			t.Errorf("redirect %s → %s after %d requests: err %v, want followed %v", from, to, hops, err, want)
		}
	}
	f("http://gpu-node:8000/metrics", "http://gpu-node:8000/metrics/", 1, true)
	f("http://gpu-node:8000/vllm/metrics", "http://gpu-node:8000/vllm/metrics/", 3, true)
	f("http://[::1]:8000/metrics", "http://[::1]:8000/metrics/", 1, true)
	f("http://gpu-node/metrics", "https://gpu-node/metrics", 1, true)
	f("http://gpu-node:80/metrics", "https://gpu-node/metrics", 1, true)
	f("http://gpu-node/metrics", "https://gpu-node:443/metrics", 1, true)
	f("http://gpu-node/metrics", "http://gpu-node:80/metrics/", 1, true)
	f("https://gpu-node/metrics", "https://gpu-node:443/metrics/", 1, true)
	f("http://GPU-Node.example.com:8000/metrics", "http://gpu-node.example.com:8000/metrics/", 1, true)

	f("http://gpu-node:8000/metrics", "http://gpu-node:8000/metrics/", 4, false)
	f("https://gpu-node/metrics", "http://gpu-node/metrics", 1, false)
	f("http://gpu-node:8000/metrics", "https://gpu-node:8000/metrics", 1, false)
	f("http://gpu-node/metrics", "https://gpu-node:8443/metrics", 1, false)
	f("http://gpu-node:8000/metrics", "http://gpu-node:9000/metrics", 1, false)
	f("http://gpu-node/metrics", "https://login.example.com/metrics", 1, false)
	f("http://[::1]:8000/metrics", "http://127.0.0.1:8000/metrics", 1, false)
}

// TestBodyBufferReleased: the buffer an exposition is read into is kept from one scrape to
// the next, but not at the size of an answer far larger than the engine's usual (an endless
// one cut at the limit): one flood would otherwise hold GPUWATCH_ENGINE_MAX_BYTES per
// engine for the life of gpuwatch.
func TestBodyBufferReleased(t *testing.T) {
	eng := newEngine(t, strings.Repeat("# padding padding padding\n", (2<<20)/26)) // over the 1 MiB limit
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 16)
	s.Tick(context.Background(), t0)
	if smp := one(t, pub.take(t)); smp.Error != "too_large" {
		t.Fatalf("sample %s, want too_large", jsonOf(smp))
	}
	eng.set(fixture(t, "vllm.prom"))
	s.Tick(context.Background(), t0.Add(time.Second))
	if smp := one(t, pub.take(t)); !smp.Up {
		t.Fatalf("sample %s, want up", jsonOf(smp))
	}
	if c := s.targets[0].body.Cap(); c > 256<<10 {
		t.Errorf("after a %d-byte exposition the body buffer holds %d bytes, the size of the flood before it", len(fixture(t, "vllm.prom")), c)
	}
}

// TestSeriesFloodAtStart: gpuwatch started on an engine already past its limit on series,
// the flood in the first family it exposes, still reads the model's series of the
// families after it: each family read keeps its share of the limit, so the flood does not
// take the places of the TTFT histogram and the token counters for good.
func TestSeriesFloodAtStart(t *testing.T) {
	const limit = 2000
	body := func(tick int) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		for i := range 3 * limit {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} %d\n", i, tick)
		}
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\"} %d\n", 100*tick)
		b.WriteString("# TYPE vllm:time_to_first_token_seconds histogram\n")
		for _, le := range []string{"0.1", "1", "+Inf"} {
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=%q,model_name=\"m\"} %d\n", le, 2*tick)
		}
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_count{model_name=\"m\"} %d\nvllm:time_to_first_token_seconds_sum{model_name=\"m\"} %d\n", 2*tick, tick)
		b.WriteString("# TYPE vllm:generation_tokens_total counter\n")
		fmt.Fprintf(&b, "vllm:generation_tokens_total{model_name=\"m\"} %d\n", 10*tick)
		b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n")
		return b.String()
	}
	sc := newVLLMScrape(t, body(0), limit)
	for tick := range 3 {
		smp := sc.at(t, tick, body(tick))
		if smp.Running == nil || *smp.Running != 3 {
			t.Errorf("tick %d: sample %s, want running 3", tick, jsonOf(smp))
		}
		if tick == 0 {
			continue
		}
		if smp.TTFT == nil || smp.TTFT.Count != 2 {
			t.Errorf("tick %d: ttft %+v, want count 2", tick, smp.TTFT)
		}
		if smp.GenerationTokens == nil || *smp.GenerationTokens != 10 {
			t.Errorf("tick %d: sample %s, want generation_tokens 10", tick, jsonOf(smp))
		}
	}
	if n := len(sc.s.targets[0].cache.entries); n > limit {
		t.Errorf("%d series cached, want at most %d", n, limit)
	}
	checkHeld(t, sc.s.targets[0].cache)
}

// TestMalformedKeepsHeldSeries: a malformed exposition, broken after a flood of new series
// and before the model's own, neither forgets the series held nor lets the flood keep the
// places it took: at the next good scrape the model's series is still read, its delta
// against its value before the failure.
func TestMalformedKeepsHeldSeries(t *testing.T) {
	const limit = 1000
	body := func(v int, flood, broken bool) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		if flood {
			for i := range 2 * limit {
				fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} 0\n", i)
			}
		}
		if broken {
			b.WriteString("vllm:prompt_tokens_total{model_name=\"m\" 1\n")
		}
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\"} %d\n", v)
		return b.String()
	}
	sc := newVLLMScrape(t, body(100, false, false), limit)
	sc.s.Tick(context.Background(), t0)
	sc.pub.take(t)
	sc.eng.set(body(200, true, true))
	sc.s.Tick(context.Background(), t0.Add(time.Second))
	if smp := one(t, sc.pub.take(t)); smp.Up || smp.Error != "malformed" {
		t.Fatalf("malformed scrape: sample %s, want up false, malformed", jsonOf(smp))
	}
	sc.eng.set(body(300, true, false))
	sc.s.Tick(context.Background(), t0.Add(2*time.Second))
	if smp := one(t, sc.pub.take(t)); smp.PromptTokens == nil || *smp.PromptTokens != 200 {
		t.Errorf("after the malformed scrape: sample %s, want prompt_tokens 200", jsonOf(smp))
	}
	checkHeld(t, sc.s.targets[0].cache)
}

// TestSeriesLimitCutsNoHistogramShort: where a family's share of the series limit runs out
// inside a histogram (its buckets and count held, its sum left out), the histogram is left
// out with the series past the limit, not read with a sum of 0.
func TestSeriesLimitCutsNoHistogramShort(t *testing.T) {
	const limit = 1000
	c := newSeriesCache(limit)
	c.share(names["vllm"])
	bounds := c.quota - 2 // with +Inf and the count, the family's quota: the sum is past it
	body := func(tick int) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		for i := range 2 * limit { // takes the pool
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} %d\n", i, tick)
		}
		b.WriteString("# TYPE vllm:time_to_first_token_seconds histogram\n")
		for i := range bounds {
			fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=\"%d\",model_name=\"m\"} %d\n", i+1, 2*tick)
		}
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} %d\n", 2*tick)
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_count{model_name=\"m\"} %d\nvllm:time_to_first_token_seconds_sum{model_name=\"m\"} %d\n", 2*tick, 3*tick)
		b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n")
		return b.String()
	}
	sc := newVLLMScrape(t, body(0), limit)
	for tick := range 3 {
		smp := sc.at(t, tick, body(tick))
		if smp.TTFT != nil && smp.TTFT.Count != 0 && smp.TTFT.Sum != 3 {
			t.Errorf("tick %d: ttft %+v, want none (its sum left out by the limit) or sum 3", tick, smp.TTFT)
		}
	}
	checkHeld(t, sc.s.targets[0].cache)
}

// TestNewSeriesBesideFloodCountsFromZero: while the limit leaves out series of one family
// (a flood of tenants in the prompt tokens), a series new in a family that had none left
// out (another engine core's generation tokens) cannot be one the limit left out before:
// it counts from zero, like any new series, not from its first value.
func TestNewSeriesBesideFloodCountsFromZero(t *testing.T) {
	const limit = 1000
	body := func(tick int) string {
		var b strings.Builder
		b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
		for i := range 2 * limit {
			fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} %d\n", i, tick)
		}
		b.WriteString("# TYPE vllm:generation_tokens_total counter\n")
		fmt.Fprintf(&b, "vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} %d\n", 10*tick)
		if tick >= 2 {
			fmt.Fprintf(&b, "vllm:generation_tokens_total{engine=\"1\",model_name=\"m\"} %d\n", 5*(tick-1))
		}
		b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n")
		return b.String()
	}
	sc := newVLLMScrape(t, body(0), limit)
	for tick, want := range []float64{-1, 10, 15, 15} { // -1: the model's first scrape
		smp := sc.at(t, tick, body(tick))
		if want >= 0 && (smp.GenerationTokens == nil || *smp.GenerationTokens != want) {
			t.Errorf("tick %d: sample %s, want generation_tokens %v", tick, jsonOf(smp), want)
		}
	}
}

// vllmScrape is a scraper of one vLLM engine on gpu-node-3, the fake engine it scrapes and
// what it publishes.
type vllmScrape struct {
	eng *fakeEngine
	pub *fakePublisher
	s   *Scraper
}

// newVLLMScrape serves body on a fake vLLM engine and scrapes it with a series limit of
// maxSeries (0: the default).
func newVLLMScrape(t *testing.T, body string, maxSeries int) vllmScrape {
	t.Helper()
	eng := newEngine(t, body)
	pub := &fakePublisher{}
	s := New([]Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, Options{Host: "gpu-node-3", Interval: time.Second,
		Timeout: 20 * time.Second, MaxBytes: 64 << 20, MaxModels: 16, MaxSeries: maxSeries}, prometheus.NewRegistry(), discard())
	return vllmScrape{eng, pub, s}
}

// at serves body, scrapes at tick seconds past t0 and returns the one sample published.
func (v vllmScrape) at(t *testing.T, tick int, body string) events.EngineSample {
	t.Helper()
	v.eng.set(body)
	v.s.Tick(context.Background(), t0.Add(time.Duration(tick)*time.Second))
	return one(t, v.pub.take(t))
}

// TestHistogramBadBucketCount: a bucket count that is no count (NaN, or below zero) makes
// the histogram series malformed, counted, its last good value kept: it poisons neither the
// delta of the other engine core's series beside it at that scrape, nor its own delta at
// the next.
func TestHistogramBadBucketCount(t *testing.T) {
	hist := func(core, b1 string, n int) string {
		return fmt.Sprintf(`vllm:time_to_first_token_seconds_bucket{engine="%s",le="0.5",model_name="m"} %s
vllm:time_to_first_token_seconds_bucket{engine="%s",le="+Inf",model_name="m"} %d
vllm:time_to_first_token_seconds_count{engine="%s",model_name="m"} %d
vllm:time_to_first_token_seconds_sum{engine="%s",model_name="m"} %d
`, core, b1, core, n, core, n, core, n)
	}
	head := "# TYPE vllm:time_to_first_token_seconds histogram\n"
	for _, bad := range []string{"NaN", "-1"} {
		t.Run(bad, func(t *testing.T) {
			eng := newEngine(t, head+hist("0", "10", 10)+hist("1", "10", 10))
			pub := &fakePublisher{}
			s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
			s.Tick(context.Background(), t0)
			eng.set(head + hist("0", bad, 12) + hist("1", "11", 11))
			s.Tick(context.Background(), t0.Add(time.Second))
			eng.set(head + hist("0", "14", 14) + hist("1", "12", 12))
			s.Tick(context.Background(), t0.Add(2*time.Second))
			got := pub.take(t)
			if len(got) != 3 {
				t.Fatalf("%d samples", len(got))
			}
			want := []*events.HistogramDelta{
				{Le: []float64{0.5}, Counts: []float64{1, 0}, Sum: 1, Count: 1}, // core 1 alone
				{Le: []float64{0.5}, Counts: []float64{5, 0}, Sum: 5, Count: 5}, // core 0 from 10, core 1 from 11
			}
			for i, w := range want {
				if g := got[i+1].TTFT; !reflect.DeepEqual(g, w) {
					t.Errorf("tick %d: ttft %s, want %s", i+1, jsonOf(g), jsonOf(w))
				}
			}
			if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "histogram_malformed")); v != 1 {
				t.Errorf("histogram_malformed = %v, want 1", v)
			}
		})
	}
}

// TestHistogramWithoutSum: a histogram series exposed without its _sum is malformed and
// counted, not read with a sum of 0, which would publish a mean of 0 where none was
// measured.
func TestHistogramWithoutSum(t *testing.T) {
	hist := func(n int) string {
		return fmt.Sprintf(`# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} %d
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} %d
vllm:time_to_first_token_seconds_count{model_name="m"} %d
`, n, n, n)
	}
	eng := newEngine(t, hist(10))
	pub := &fakePublisher{}
	s, _ := newScraper(t, []Target{{Engine: "vllm", Name: "vllm", URL: eng.URL}}, pub, 4)
	s.Tick(context.Background(), t0)
	eng.set(hist(12))
	s.Tick(context.Background(), t0.Add(time.Second))
	got := pub.take(t)
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	if got[1].TTFT != nil {
		t.Errorf("ttft %s from a histogram without a sum; want none", jsonOf(got[1].TTFT))
	}
	if v := testutil.ToFloat64(s.m.dropped.WithLabelValues("vllm", "histogram_malformed")); v != 2 {
		t.Errorf("histogram_malformed = %v, want 2 (one per scrape)", v)
	}
}
