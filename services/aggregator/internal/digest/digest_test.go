package digest_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/tokenscope/tokenscope/services/aggregator/internal/digest"
)

// lognormal latencies in ms, shaped like TTFT: median ~400 ms with a long tail.
func lognormal(r *rand.Rand, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Exp(math.Log(400) + 0.8*r.NormFloat64())
	}
	return out
}

func exactQuantile(sorted []float64, q float64) float64 {
	idx := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(idx, 0)]
}

func relErr(got, want float64) float64 { return math.Abs(got-want) / want }

func TestAccuracyOneWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1_000, 10_000, 100_000} {
		xs := lognormal(r, n)
		d := digest.New(digest.DefaultCompression)
		for _, x := range xs {
			d.Add(x)
		}
		slices.Sort(xs)
		for _, tc := range []struct{ q, tol float64 }{{0.5, 0.01}, {0.95, 0.01}, {0.99, 0.01}, {0.999, 0.02}} {
			if e := relErr(d.Quantile(tc.q), exactQuantile(xs, tc.q)); e > tc.tol {
				t.Errorf("n=%d p%g: error %.3f%% > %.1f%%", n, tc.q*100, e*100, tc.tol*100)
			}
		}
		if d.Count() != uint64(n) || d.Min() != xs[0] || d.Max() != xs[n-1] {
			t.Fatalf("n=%d: count %d min %v max %v", n, d.Count(), d.Min(), d.Max())
		}
	}
}

// TestMergeExact merges 60 digests of 10k samples — where influxdata/tdigest v0.0.1 kept 68k of
// 600k — and 240 windows, and checks counts stay exact and percentiles stay within the goals.
func TestMergeExact(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct{ windows, per int }{{60, 10_000}, {240, 1_000}} {
		total := digest.New(digest.DefaultCompression)
		var all []float64
		for range tc.windows {
			xs := lognormal(r, tc.per)
			d := digest.New(digest.DefaultCompression)
			for _, x := range xs {
				d.Add(x)
			}
			all = append(all, xs...)
			total.Merge(d)
			if d.Count() != uint64(tc.per) {
				t.Fatalf("Merge changed its argument's count to %d", d.Count())
			}
		}
		if want := uint64(tc.windows * tc.per); total.Count() != want {
			t.Fatalf("merged count %d, want exactly %d", total.Count(), want)
		}
		var sum uint64
		for _, c := range total.Centroids() {
			sum += c.Weight
		}
		if sum != total.Count() {
			t.Fatalf("centroid weights sum to %d, count is %d", sum, total.Count())
		}
		slices.Sort(all)
		for _, q := range []struct{ q, tol float64 }{{0.99, 0.01}, {0.999, 0.02}} {
			if e := relErr(total.Quantile(q.q), exactQuantile(all, q.q)); e > q.tol {
				t.Errorf("%d windows merged, p%g: error %.3f%%", tc.windows, q.q*100, e*100)
			}
		}
	}
}

func TestSmallCountsExact(t *testing.T) {
	d := digest.New(0)
	for _, x := range []float64{5, 1, 3, 2, 4} {
		d.Add(x)
	}
	f := func(q, want float64) {
		t.Helper()
		if got := d.Quantile(q); got != want {
			t.Fatalf("Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	f(0, 1)
	f(1, 5)
	f(0.5, 3)
	if got := d.Quantile(0.99); got < 4 || got > 5 {
		t.Fatalf("p99 of 1..5 = %v", got)
	}
}

func TestEmptyAndBadInput(t *testing.T) {
	d := digest.New(100)
	if !math.IsNaN(d.Quantile(0.5)) || !math.IsNaN(d.Min()) || d.Count() != 0 {
		t.Fatal("empty digest must answer NaN and count 0")
	}
	d.Add(math.NaN())
	d.Add(math.Inf(1))
	d.AddCentroids([]digest.Centroid{{Mean: 1, Weight: 0}, {Mean: math.NaN(), Weight: 3}})
	if d.Count() != 0 {
		t.Fatalf("bad samples were counted: %d", d.Count())
	}
	d.Add(7)
	if d.Quantile(0.99) != 7 {
		t.Fatal("single sample")
	}
	d.Reset()
	if d.Count() != 0 || !math.IsNaN(d.Max()) {
		t.Fatal("Reset")
	}
}

func TestQuantileMonotonic(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	d := digest.New(0)
	for _, x := range lognormal(r, 50_000) {
		d.Add(x)
	}
	prev := math.Inf(-1)
	for q := 0.0; q <= 1; q += 0.0005 {
		v := d.Quantile(q)
		if v < prev {
			t.Fatalf("Quantile(%v) = %v < %v", q, v, prev)
		}
		prev = v
	}
}

func TestMemoryBounded(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	d := digest.New(digest.DefaultCompression)
	for _, x := range lognormal(r, 1_000_000) {
		d.Add(x)
	}
	if n := len(d.Centroids()); n > 2*digest.DefaultCompression {
		t.Fatalf("%d centroids at compression %d", n, digest.DefaultCompression)
	}
	if s := d.Size(); s > 20<<10 {
		t.Fatalf("digest holds %d bytes", s)
	}
}

func BenchmarkAdd(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	xs := lognormal(r, 1<<16)
	d := digest.New(digest.DefaultCompression)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		d.Add(xs[i&(1<<16-1)])
	}
}

// BenchmarkAccuracy reports the p99 and p99.9 errors per compression, the measurement behind
// DefaultCompression: go test -run '^$' -bench Accuracy ./internal/digest
func BenchmarkAccuracy(b *testing.B) {
	for _, c := range []float64{100, 200, 400} {
		b.Run("compression="+fmtF(c), func(b *testing.B) {
			r := rand.New(rand.NewPCG(11, 12))
			xs := lognormal(r, 200_000)
			var d *digest.Digest
			for b.Loop() {
				d = digest.New(c)
				for _, x := range xs {
					d.Add(x)
				}
			}
			slices.Sort(xs)
			b.ReportMetric(100*relErr(d.Quantile(0.99), exactQuantile(xs, 0.99)), "p99_err_%")
			b.ReportMetric(100*relErr(d.Quantile(0.999), exactQuantile(xs, 0.999)), "p99.9_err_%")
			b.ReportMetric(float64(d.Size()), "bytes")
		})
	}
}

func fmtF(f float64) string { return strconv.Itoa(int(f)) }
