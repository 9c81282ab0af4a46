package scrape

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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
