package window_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// BenchmarkMemoryPerSeries fills 2,000 series (model × scene × bucket keys) with enough
// samples that every digest reaches its full size, and reports the heap each one holds:
// the goal is at most 64 KB per active series.
func BenchmarkMemoryPerSeries(b *testing.B) {
	const series, perSeries = 2000, 2000
	r := rand.New(rand.NewPCG(1, 2))
	var perKey float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		c := cfg(b)
		c.MaxSeries = series
		a := window.New(c, nil)
		now := t0.Add(time.Second)
		e := events.RequestEvent{V: 1, EventID: "x", TS: t0, Scene: "chat", Env: "prod", OutputTokens: 50, Status: events.StatusOK}
		models := make([]string, series)
		for i := range models {
			models[i] = fmt.Sprint("model-", i)
		}
		seq := uint64(0)
		for i := range series * perSeries {
			e.Model = models[i%series]
			e.TTFTMs = math.Exp(5 + 0.8*r.NormFloat64())
			e.TotalMs = e.TTFTMs + 49*math.Exp(3+0.3*r.NormFloat64())
			seq++
			a.Add(&e, seq, now)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if _, keys := a.OpenWindows(); keys != series {
			b.Fatalf("%d keys", keys)
		}
		perKey = float64(after.HeapAlloc-before.HeapAlloc) / series
		runtime.KeepAlive(a)
	}
	b.ReportMetric(perKey, "bytes/series")
	if perKey > 64<<10 {
		b.Fatalf("%.0f bytes per series, over the 64 KB goal", perKey)
	}
}
