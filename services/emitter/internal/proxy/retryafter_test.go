package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := func(hdr map[string]string, want float64, wantOK bool) {
		t.Helper()
		h := http.Header{}
		for k, v := range hdr {
			h.Set(k, v)
		}
		got, ok := retryAfter(h, now)
		if got != want || ok != wantOK {
			t.Fatalf("retryAfter(%v) = %v %v, want %v %v", hdr, got, ok, want, wantOK)
		}
	}
	f(map[string]string{"Retry-After": "7"}, 7, true)
	f(map[string]string{"Retry-After": "0"}, 0, true)
	f(map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, 90, true)
	f(map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, 0, true)
	f(map[string]string{"Retry-After": "7", "Retry-After-Ms": "1500"}, 1.5, true)
	f(map[string]string{"Retry-After": "7", "Retry-After-Ms": "soon"}, 7, true)
	f(map[string]string{"Retry-After": "-3"}, 0, false)
	f(map[string]string{"Retry-After": "1.5"}, 0, false)
	f(map[string]string{"Retry-After": "soon"}, 0, false)
	f(nil, 0, false)

	// retry-after-ms is a decimal number: hex, signs, exponents and words are not.
	for _, v := range []string{"0x1p4", "0x10", "+5", "-5", "1e3", "Inf", "NaN", "1_000", " 5", "5.", ".5", "1.2.3", ""} {
		f(map[string]string{"Retry-After": "7", "Retry-After-Ms": v}, 7, true)
	}
	f(map[string]string{"Retry-After-Ms": "0.5"}, 0.0005, true)

	// One cap for the three forms: a wait past it counts as the cap, so that one value
	// cannot outweigh all the others in the histogram's sum.
	f(map[string]string{"Retry-After-Ms": "86400000"}, maxRetryAfter, true)
	f(map[string]string{"Retry-After-Ms": "99999999999999999999999999999"}, maxRetryAfter, true)
	f(map[string]string{"Retry-After": "86400"}, maxRetryAfter, true)
	f(map[string]string{"Retry-After": "99999999999999999999"}, maxRetryAfter, true)
	f(map[string]string{"Retry-After": now.Add(24 * time.Hour).Format(http.TimeFormat)}, maxRetryAfter, true)
	f(map[string]string{"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, maxRetryAfter, true)
	f(map[string]string{"Retry-After": "3600"}, 3600, true)
}

// TestRetryAfterObserved: the wait an upstream 429 asks for is in
// emitter_proxy_rate_limit_retry_after_seconds, by provider.
func TestRetryAfterObserved(t *testing.T) {
	r := newRig(t, fakellm.Options{}, nil)
	anth := `{"model":"claude-haiku","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct{ path, body string }{{chatPath, chatBody(true, "")}, {messagesPath, anth}, {chatPath, chatBody(false, "")}} {
		via := call(t, r.proxy.URL, c.path, c.body, map[string]string{"X-Fakellm-Mode": fakellm.ModeRateLimit})
		if via.status != http.StatusTooManyRequests || via.header.Get("Retry-After") != "1" {
			t.Fatalf("client got %d, Retry-After %q", via.status, via.header.Get("Retry-After"))
		}
		r.cap.next(t)
	}
	call(t, r.proxy.URL, chatPath, chatBody(false, ""), nil) // a 200 is no rate limit
	r.cap.next(t)
	if n := testutil.CollectAndCount(r.p.m.retryAfter); n != 2 {
		t.Fatalf("%d series, want openai and anthropic", n)
	}
	got := testutil.ToFloat64(r.p.m.rateLimited.WithLabelValues("openai"))
	if got != 2 {
		t.Fatalf("rate_limited_total{openai} = %v", got)
	}
	for _, pc := range []struct {
		provider string
		count    uint64
	}{{"openai", 2}, {"anthropic", 1}} {
		m := &dto.Metric{}
		if err := r.p.m.retryAfter.WithLabelValues(pc.provider).(prometheus.Metric).Write(m); err != nil {
			t.Fatal(err)
		}
		if m.GetHistogram().GetSampleCount() != pc.count || m.GetHistogram().GetSampleSum() != float64(pc.count) {
			t.Fatalf("%s: %d observed, sum %v, want %d of 1 s", pc.provider, m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum(), pc.count)
		}
	}
}

// TestRetryAfterCommonForms: the forms upstreams send, Retry-After in seconds or as an
// HTTP date and OpenAI's retry-after-ms (sent in lower case, read first), through both
// upstream clients, are observed as the wait they ask for.
func TestRetryAfterCommonForms(t *testing.T) {
	bothClients(t, func(t *testing.T, transport bool) {
		forms := map[string]map[string]string{
			"seconds": {"Retry-After": "20"},
			"date":    {"Retry-After": time.Now().Add(time.Hour + 30*time.Second).UTC().Format(http.TimeFormat)},
			"ms":      {"retry-after-ms": "1500", "Retry-After": "2"},
		}
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			for k, v := range forms[r.Header.Get("X-Test-Form")] {
				w.Header()[k] = []string{v} // as the upstream spells it
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`)
		}))
		t.Cleanup(up.Close)
		p, cap, _ := newTestProxy(t, up.URL+"/v1", nil)
		srv := serveProxy(t, p, nil, nil)
		rig := &rig{p: p}
		if transport {
			rig.viaTransport()
		}
		for _, form := range []string{"seconds", "date", "ms"} {
			via := call(t, srv.URL, chatPath, chatBody(false, ""), map[string]string{"X-Test-Form": form})
			if via.status != http.StatusTooManyRequests {
				t.Fatalf("%s: client got %d", form, via.status)
			}
			cap.next(t)
		}
		m := &dto.Metric{}
		if err := p.m.retryAfter.WithLabelValues("openai").(prometheus.Metric).Write(m); err != nil {
			t.Fatal(err)
		}
		// 20 + about 3630, capped at 3600 + 1.5.
		if h := m.GetHistogram(); h.GetSampleCount() != 3 || h.GetSampleSum() != 20+maxRetryAfter+1.5 {
			t.Fatalf("%d observed, sum %v, want 3, %v", h.GetSampleCount(), h.GetSampleSum(), 20+maxRetryAfter+1.5)
		}
	})
}
