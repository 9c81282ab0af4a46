package window

import (
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// EngineKey identifies one model of one engine endpoint. A scrape that failed has no
// model: its sample counts in the endpoint's row of model "".
type EngineKey struct {
	Host, Engine, Name, Model string
}

// EngineStats are one engine model's aggregates in one window.
type EngineStats struct {
	Samples, Up, Down uint64

	queue, running, kv, hitRate gauge

	PrefixQueries, PrefixHits, Preemptions, PromptTokens, GenerationTokens float64

	QueueTime, TTFT, Prefill, Decode hist
}

func (s *EngineStats) reset() {
	q, t, p, d := s.QueueTime.reuse(), s.TTFT.reuse(), s.Prefill.reuse(), s.Decode.reuse()
	*s = EngineStats{QueueTime: q, TTFT: t, Prefill: p, Decode: d}
}

// gauge is the mean and maximum of the readings a window got.
type gauge struct {
	sum, max float64
	n        uint64
}

func (g *gauge) add(v *float64) {
	if v == nil {
		return
	}
	g.sum += *v
	g.max = max(g.max, *v)
	g.n++
}

func (g *gauge) mean() float64 {
	if g.n == 0 {
		return 0
	}
	return g.sum / float64(g.n)
}

// hist is a histogram summed over a window. Deltas with other bounds (an engine that
// changed its buckets) are merged onto the bounds both have: a bucket of either lies
// within one bucket of the common bounds, so the merge is exact and only coarser.
type hist struct {
	le, counts []float64
	sum, count float64
	has        bool
}

// reuse empties h, keeping its storage.
func (h hist) reuse() hist { return hist{le: h.le[:0], counts: h.counts[:0]} }

func (h *hist) add(d *events.HistogramDelta) {
	if d == nil {
		return
	}
	if !h.has {
		h.le = append(h.le[:0], d.Le...)
		h.counts = append(h.counts[:0], d.Counts...)
		h.sum, h.count, h.has = d.Sum, d.Count, true
		return
	}
	h.sum += d.Sum
	h.count += d.Count
	if equalBounds(h.le, d.Le) {
		for i, c := range d.Counts {
			h.counts[i] += c
		}
		return
	}
	h.coarsen(d.Le)
	// Each of d's buckets goes to the first common bound at or above its own.
	j := 0
	for i, c := range d.Counts {
		if i < len(d.Le) {
			for j < len(h.le) && h.le[j] < d.Le[i] {
				j++
			}
			h.counts[j] += c
		} else {
			h.counts[len(h.le)] += c
		}
	}
}

// coarsen keeps only the bounds of h that le also has, merging h's buckets accordingly.
func (h *hist) coarsen(le []float64) {
	kept, counts := h.le[:0], make([]float64, 0, len(h.counts))
	acc := 0.0
	j := 0
	for i, b := range h.le {
		acc += h.counts[i]
		for j < len(le) && le[j] < b {
			j++
		}
		if j < len(le) && le[j] == b {
			kept = append(kept, b)
			counts = append(counts, acc)
			acc = 0
		}
	}
	counts = append(counts, acc+h.counts[len(h.counts)-1])
	h.le, h.counts = kept, counts
}

func equalBounds(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (h *hist) rollup() events.EngineHistogram {
	if !h.has {
		return events.EngineHistogram{}
	}
	r := events.EngineHistogram{Le: append([]float64(nil), h.le...), Counts: append([]float64(nil), h.counts...), Sum: h.sum, Count: h.count}
	r.SetQuantiles()
	return r
}

// EngineUnit is a unit of engine-sample windows.
type EngineUnit = Unit[EngineKey, EngineStats]

// EngineAggregator keeps engine-sample windows. A sample's counter and histogram deltas
// (since the engine's previous scrape) go whole to the window of its ts, as GPU energy
// deltas do, so none falls between windows. It is not safe for concurrent use.
type EngineAggregator struct {
	windows[EngineKey, EngineStats]
	cfg Config
}

// NewEngine returns an EngineAggregator; done is as for New.
func NewEngine(cfg Config, done map[time.Time]uint64) *EngineAggregator {
	return &EngineAggregator{
		windows: newWindows[EngineKey, EngineStats](cfg.Window, cfg.Lateness, done,
			func() *EngineStats { return &EngineStats{} }, (*EngineStats).reset),
		cfg: cfg,
	}
}

// Add routes one valid sample at stream position seq; see Aggregator.Add.
func (a *EngineAggregator) Add(s *events.EngineSample, seq uint64, now time.Time) Result {
	ts := s.TS.UnixNano()
	u, res := a.route(ts, ts, seq, now.UnixNano())
	if res == Skipped {
		return res
	}
	k := EngineKey{Host: s.Host, Engine: s.Engine, Name: s.Name, Model: s.Model}
	if !s.Up {
		k.Model = ""
	}
	st := a.stats(u, k, func(k EngineKey) EngineKey {
		return EngineKey{Host: strings.Clone(k.Host), Engine: strings.Clone(k.Engine), Name: strings.Clone(k.Name), Model: strings.Clone(k.Model)}
	})
	st.Samples++
	if !s.Up {
		st.Down++
		return res
	}
	st.Up++
	st.queue.add(s.Waiting)
	if s.Running != nil {
		st.running.add(s.Running)
	} else {
		st.running.add(s.BatchSize) // TGI: its current batch is what runs
	}
	st.kv.add(s.KVCacheUsage)
	st.hitRate.add(s.CacheHitRate)
	for _, c := range [...]struct {
		dst *float64
		v   *float64
	}{
		{&st.PrefixQueries, s.PrefixCacheQueries}, {&st.PrefixHits, s.PrefixCacheHits},
		{&st.Preemptions, s.Preemptions}, {&st.PromptTokens, s.PromptTokens}, {&st.GenerationTokens, s.GenerationTokens},
	} {
		if c.v != nil {
			*c.dst += *c.v
		}
	}
	st.QueueTime.add(s.QueueTime)
	st.TTFT.add(s.TTFT)
	st.Prefill.add(s.PrefillTime)
	st.Decode.add(s.DecodeTime)
	return res
}

// Rollups turns a unit into one rollup per engine model.
func (a *EngineAggregator) Rollups(u *EngineUnit, dst []events.EngineRollup) []events.EngineRollup {
	kind := events.KindWindow
	if u.Correction {
		kind = events.KindCorrection
	}
	secs := int(a.cfg.Window / time.Second)
	for k, s := range u.Keys {
		dst = append(dst, events.EngineRollup{
			V: events.Version, WindowStart: u.Start, WindowSeconds: secs, Kind: kind,
			Host: k.Host, Engine: k.Engine, Name: k.Name, Model: k.Model,
			Samples: s.Samples, UpSamples: s.Up, DownSamples: s.Down,
			QueueDepthAvg: s.queue.mean(), QueueDepthMax: s.queue.max,
			RunningAvg: s.running.mean(), RunningMax: s.running.max,
			KVCacheUsageAvg: s.kv.mean(), KVCacheUsageMax: s.kv.max,
			CacheHitRateAvg:    s.hitRate.mean(),
			PrefixCacheQueries: s.PrefixQueries, PrefixCacheHits: s.PrefixHits, Preemptions: s.Preemptions,
			PromptTokens: s.PromptTokens, GenerationTokens: s.GenerationTokens,
			PromptTokensPerS:     s.PromptTokens / float64(secs),
			GenerationTokensPerS: s.GenerationTokens / float64(secs),
			QueueTime:            s.QueueTime.rollup(), TTFT: s.TTFT.rollup(),
			PrefillTime: s.Prefill.rollup(), DecodeTime: s.Decode.rollup(),
		})
	}
	return dst
}
