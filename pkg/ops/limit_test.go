package ops_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

var t0 = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

func TestLimiter(t *testing.T) {
	l := ops.NewLimiter(2, time.Minute, nil)
	got := []string{l.Value("a", t0), l.Value("b", t0), l.Value("c", t0), l.Value("a", t0), l.Value("d", t0)}
	if strings.Join(got, ",") != "a,b,other,a,other" || l.Folded() != 2 {
		t.Fatalf("got %v, folded %d", got, l.Folded())
	}
	// b goes quiet, a does not: after the idle time c takes b's place, not a's.
	got = []string{l.Value("a", t0.Add(30*time.Second)), l.Value("c", t0.Add(time.Minute)), l.Value("a", t0.Add(time.Minute)), l.Value("b", t0.Add(time.Minute))}
	if strings.Join(got, ",") != "a,c,a,other" {
		t.Fatalf("after b went quiet: %v", got)
	}
}

// TestLimiterAfterBurst: 100,000 distinct values in a burst fill the limiter; once they stop
// being seen, a new real value gets its own label again, and the burst's series are deleted
// as they give their places up, so /metrics holds at most the limit.
func TestLimiterAfterBurst(t *testing.T) {
	const limit = 200
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total", Help: "h"}, []string{"model"})
	reg.MustRegister(vec)
	l := ops.NewLimiter(limit, 5*time.Minute, func(v string) { vec.DeleteLabelValues(v) })
	inc := func(v string, now time.Time) string {
		got := l.Value(v, now)
		vec.WithLabelValues(got).Inc()
		return got
	}
	inc("gpt-4o", t0)
	for i := range 100_000 {
		inc(fmt.Sprint("burst-", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	burstEnd := t0.Add(100 * time.Second)
	if got := inc("gpt-5", burstEnd.Add(time.Minute)); got != ops.Other {
		t.Fatalf("a new value while the burst is recent: %q, want it folded", got)
	}
	if n := count(t, reg); n != limit+1 {
		t.Fatalf("%d series during the burst, want %d and other", n, limit)
	}
	if got := inc("gpt-5", burstEnd.Add(8*time.Minute)); got != "gpt-5" {
		t.Fatalf("a new value 8 minutes after the burst: %q", got)
	}
	if n := count(t, reg); n > limit+1 {
		t.Fatalf("%d series after the burst, over the limit", n)
	}
}

func TestLabelValue(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got := ops.LabelValue(in)
		if got != want || !utf8.ValidString(got) || len(got) > ops.MaxValueLen {
			t.Fatalf("LabelValue(%q) = %q, want %q", in, got, want)
		}
	}
	f("gpt-4o", "gpt-4o")
	f("", "")
	f("a\rb\x00c\nd\x7fe\u0085f", "a_b_c_d_e_f")
	f("bad\xff\xfeutf8", "bad__utf8")
	f("café ☕", "café ☕")
	f(strings.Repeat("x", 300), strings.Repeat("x", ops.MaxValueLen))
	f(strings.Repeat("x", ops.MaxValueLen-1)+"é", strings.Repeat("x", ops.MaxValueLen-1)) // not cut inside the rune
}

// TestLimitedLabelsInExposition: a model name with CR and NUL never reaches /metrics raw,
// and one with invalid UTF-8 (on which client_golang panics) is mended.
func TestLimitedLabelsInExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total", Help: "h"}, []string{"model"})
	reg.MustRegister(vec)
	l := ops.NewLimiter(10, time.Minute, nil)
	vec.WithLabelValues(l.Value("evil\r\nmodel\x00", t0)).Inc()
	vec.WithLabelValues(l.Value("bad\xffutf8", t0)).Inc()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	out := rec.Body.Bytes()
	if strings.ContainsAny(string(out), "\r\x00") || !strings.Contains(string(out), `requests_total{model="evil__model_"} 1`) ||
		!strings.Contains(string(out), `requests_total{model="bad_utf8"} 1`) {
		t.Fatalf("exposition:\n%q", out)
	}
}

func TestRecent(t *testing.T) {
	var evicted []string
	r := ops.NewRecent[string](3, time.Minute, func(k string) { evicted = append(evicted, k) })
	clock := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	for i, k := range []string{"a", "b", "c"} {
		if !r.Add(k, clock(time.Duration(i)*time.Second)) {
			t.Fatalf("%s refused with room", k)
		}
	}
	if r.HasRoom(clock(30*time.Second)) || r.Add("d", clock(30*time.Second)) {
		t.Fatal("a full set took d before any key was idle")
	}
	if _, ok := r.Touch("a", clock(40*time.Second)); !ok { // b is now the oldest
		t.Fatal("a missing")
	}
	if !r.Add("d", clock(61*time.Second)) || len(evicted) != 1 || evicted[0] != "b" {
		t.Fatalf("d took the place of %v, want b", evicted)
	}
	if _, ok := r.Touch("b", clock(61*time.Second)); ok {
		t.Fatal("b still held")
	}
	r.Expire(clock(101*time.Second), time.Minute) // c (2s) and a (40s) are older than a minute
	if r.Len() != 1 || strings.Join(evicted, ",") != "b,c,a" {
		t.Fatalf("after expiry: %d held, evicted %v", r.Len(), evicted)
	}
}

// count returns how many series reg holds.
func count(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	return n
}

// BenchmarkLimiterValue is the cost per request of a model label already admitted.
func BenchmarkLimiterValue(b *testing.B) {
	l := ops.NewLimiter(200, 5*time.Minute, nil)
	models := make([]string, 50)
	for i := range models {
		models[i] = fmt.Sprint("gpt-4o-", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Value(models[i%len(models)], t0)
		i++
	}
}
