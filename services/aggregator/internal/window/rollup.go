package window

import (
	"math"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/digest"
)

// Rollups turns a unit into one rollup per key.
func (a *Aggregator) Rollups(u *TokenUnit, dst []events.TokenRollup) []events.TokenRollup {
	kind := events.KindWindow
	if u.Correction {
		kind = events.KindCorrection
	}
	for k, s := range u.Keys {
		dst = append(dst, events.TokenRollup{
			V:                 events.Version,
			WindowStart:       u.Start,
			WindowSeconds:     int(a.cfg.Window / time.Second),
			Kind:              kind,
			Env:               k.Env,
			Scene:             k.Scene,
			Model:             k.Model,
			Instance:          k.Instance,
			Layer:             k.Layer,
			Bucket:            a.cfg.Buckets.Label(k.Bucket),
			Requests:          s.Requests,
			OK:                s.OK,
			Errors:            s.Errors,
			Timeouts:          s.Timeouts,
			Canceled:          s.Canceled,
			RateLimited:       s.RateLimited,
			Completed:         s.Completed,
			Abandoned:         s.Abandoned,
			Late:              s.Late,
			Estimated:         s.Estimated,
			Unpriced:          s.Unpriced,
			InputTokens:       s.InputTokens,
			OutputTokens:      s.OutputTokens,
			CachedInputTokens: s.CachedInputTokens,
			CostUSD:           s.CostUSD,
			MaxITLMs:          s.MaxITLMs,
			TTFT:              latency(s.TTFT),
			TPOT:              latency(s.TPOT),
			Total:             latency(s.Total),
		})
	}
	return dst
}

// BucketLower returns the lower bound of the bucket a rollup's label names.
func (a *Aggregator) BucketLower(label string) int64 {
	for i := range a.cfg.Buckets.Len() {
		if a.cfg.Buckets.Label(i) == label {
			return a.cfg.Buckets.Lower(i)
		}
	}
	return 0
}

func latency(d *digest.Digest) events.Latency {
	if d.Count() == 0 {
		return events.Latency{Means: []float64{}, Weights: []uint64{}}
	}
	cs := d.Centroids()
	l := events.Latency{
		Count:   d.Count(),
		Min:     d.Min(),
		Max:     d.Max(),
		P50:     d.Quantile(0.50),
		P90:     d.Quantile(0.90),
		P95:     d.Quantile(0.95),
		P99:     d.Quantile(0.99),
		Means:   make([]float64, len(cs)),
		Weights: make([]uint64, len(cs)),
	}
	for i, c := range cs {
		l.Means[i], l.Weights[i] = c.Mean, c.Weight
	}
	for _, p := range []*float64{&l.P50, &l.P90, &l.P95, &l.P99} {
		if math.IsNaN(*p) {
			*p = 0
		}
	}
	return l
}
