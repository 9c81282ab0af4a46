package engine

import (
	"fmt"
	"math"
	"slices"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/lifecycle"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// EngineKey identifies an inference engine's series: a host, the endpoint's name on it
// (from GPUWATCH_ENGINES) and a model.
type EngineKey struct {
	Host, Name, Model string
}

// The engine baselines keep the rules' engine metrics and, for the TTFT hint, the prefill
// time's p95.
const (
	engPrefill  = rules.NumEngineMetrics // index of the prefill p95 in an engine's history
	engMetrics  = rules.NumEngineMetrics + 1
	recentLen   = 30 // windows of an engine kept as the hint's reference when it has no baseline
	hintMinMs   = 50 // a queue or prefill p95 must grow by at least this much …
	hintMinFrac = 0.2
	// … and by this fraction of its reference to count as grown.
)

// engineAgg sums one engine key's rows of a window (one, unless partitions or
// corrections add more), and keeps the key's history and recent windows across windows.
type engineAgg struct {
	hist   *baseline.History
	recent *recentRing

	rows              int
	seconds           int
	samples, up, down uint64
	queueW, kvW       float64 // gauges weighted by up samples
	preemptions       float64
	queue, prefill    histAgg

	// Computed by finish.
	queueDepth, kvAvg, preemptionsPerS float64
	queueP95, prefillP95               float64 // ms
	queueOK, prefillOK, gaugesOK       bool
	finishedRequests                   uint64 // requests that left the queue: the queue-time histogram's count
}

// histAgg merges one engine histogram over rows: a single row's p95 is used as written;
// rows with the same bounds add bucket by bucket; rows whose bounds differ cannot be
// merged and the highest of their p95s stands in (an upper bound).
type histAgg struct {
	rows     int
	le       []float64
	counts   []float64
	count    float64
	p95      float64
	mismatch bool
}

func (h *histAgg) add(x *events.EngineHistogram) {
	if x.Count <= 0 {
		return
	}
	h.rows++
	h.count += x.Count
	h.p95 = max(h.p95, x.P95)
	switch {
	case h.rows == 1:
		h.le = append(h.le[:0], x.Le...)
		h.counts = append(h.counts[:0], x.Counts...)
	case !slices.Equal(h.le, x.Le) || len(x.Counts) != len(h.counts):
		h.mismatch = true
	default:
		for i, c := range x.Counts {
			h.counts[i] += c
		}
	}
}

// quantile95 returns the merged p95 in ms and whether there was any observation.
func (h *histAgg) quantile95() (float64, bool) {
	switch {
	case h.rows == 0:
		return 0, false
	case h.rows == 1 || h.mismatch:
		return h.p95 * 1000, true
	}
	v := events.HistogramQuantile(0.95, h.le, h.counts)
	if math.IsNaN(v) {
		return h.p95 * 1000, true
	}
	return v * 1000, true
}

func (h *histAgg) reset() {
	*h = histAgg{le: h.le[:0], counts: h.counts[:0]}
}

func (a *engineAgg) add(r *events.EngineRollup) {
	a.rows++
	a.seconds = max(a.seconds, r.WindowSeconds)
	a.samples += r.Samples
	a.up += r.UpSamples
	a.down += r.DownSamples
	a.queueW += r.QueueDepthAvg * float64(r.UpSamples)
	a.kvW += r.KVCacheUsageAvg * float64(r.UpSamples)
	a.preemptions += r.Preemptions
	a.queue.add(&r.QueueTime)
	a.prefill.add(&r.PrefillTime)
}

// finish computes the window's figures once its rows are in.
func (a *engineAgg) finish() {
	if a.up > 0 {
		n := float64(a.up)
		a.queueDepth, a.kvAvg, a.gaugesOK = a.queueW/n, a.kvW/n, true
	}
	if a.seconds > 0 {
		a.preemptionsPerS = a.preemptions / float64(a.seconds)
	}
	a.queueP95, a.queueOK = a.queue.quantile95()
	a.prefillP95, a.prefillOK = a.prefill.quantile95()
	a.finishedRequests = uint64(max(a.queue.count, 0))
}

func (a *engineAgg) reset() {
	q, p := a.queue, a.prefill
	q.reset()
	p.reset()
	*a = engineAgg{hist: a.hist, recent: a.recent, queue: q, prefill: p}
}

// recentRing is an engine's latest windows' queue and prefill p95 (ms), the hint's
// reference while its seasonal baseline is too thin. Windows in which a TTFT rule of a
// series the host serves breached are left out, so an incident that lasts does not become
// its own reference.
type recentRing struct {
	queue, prefill [recentLen]float64
	n, next        int
	lastWindow     int64 // Engine.counts.Windows when it was last written
}

func (r *recentRing) push(q, p float64) {
	r.queue[r.next], r.prefill[r.next] = q, p
	r.next = (r.next + 1) % recentLen
	r.n = min(r.n+1, recentLen)
}

// medians returns the medians of the kept windows.
func (r *recentRing) medians(scratch []float64) (q, p float64) {
	med := func(v []float64) float64 {
		scratch = append(scratch[:0], v[:r.n]...)
		slices.Sort(scratch)
		k := len(scratch) / 2
		if len(scratch)%2 == 1 {
			return scratch[k]
		}
		return (scratch[k-1] + scratch[k]) / 2
	}
	return med(r.queue[:]), med(r.prefill[:])
}

// downKey is an engine endpoint of a host, all its models together.
type downKey struct{ host, name string }

type downAgg struct {
	samples, up, down uint64
	seconds           int
}

// groupEngines sums the window's engine rollups per engine key and per endpoint.
func (e *Engine) groupEngines(w Window) {
	for i := range w.Engines {
		r := &w.Engines[i]
		if r.Kind != events.KindWindow {
			e.counts.SkippedRows++
			continue
		}
		key := EngineKey{r.Host, r.Name, r.Model}
		a := e.engAgg[key]
		if a == nil {
			a = &engineAgg{}
			e.engAgg[key] = a
		}
		a.add(r)
		dk := downKey{r.Host, r.Name}
		d := e.downAgg[dk]
		if d == nil {
			d = &downAgg{}
			e.downAgg[dk] = d
		}
		d.samples += r.Samples
		d.up += r.UpSamples
		d.down += r.DownSamples
		d.seconds = max(d.seconds, r.WindowSeconds)
	}
	for key, a := range e.engAgg {
		if a.rows == 0 {
			continue
		}
		a.finish()
		if a.up == 0 {
			continue // down all window: nothing to judge but its availability
		}
		if a.hist == nil {
			a.hist = e.engines.Series(key)
		}
		if a.recent == nil {
			// Bounded as the engines' baselines are: past ALERTER_MAX_SERIES a new engine
			// has no recent reference (its hint waits for a baseline).
			a.recent = e.recent[key]
			if limit := e.engines.Options().MaxSeries; a.recent == nil && (limit == 0 || len(e.recent) < limit) {
				a.recent = &recentRing{}
				e.recent[key] = a.recent
			}
		}
		e.hostEngines[key.Host] = append(e.hostEngines[key.Host], key)
	}
}

// values returns the engine's metrics in its history's order.
func (a *engineAgg) values() (v [engMetrics]float64, ok [engMetrics]bool) {
	v[rules.QueueDepth-rules.QueueDepth], ok[rules.QueueDepth-rules.QueueDepth] = a.queueDepth, a.gaugesOK
	v[rules.QueueTimeP95-rules.QueueDepth], ok[rules.QueueTimeP95-rules.QueueDepth] = a.queueP95, a.queueOK
	v[engPrefill], ok[engPrefill] = a.prefillP95, a.prefillOK
	return v, ok
}

// processEngines checks and learns each engine key of the window, then each endpoint's
// availability.
func (e *Engine) processEngines(plan baseline.Plan, evaluate, learn bool) {
	r := &e.rules.Default
	for key, a := range e.engAgg {
		if a.rows == 0 {
			delete(e.engAgg, key)
			continue
		}
		if a.hist == nil {
			a.hist = e.engines.Series(key)
		}
		vals, ok := a.values()
		if evaluate && a.up > 0 {
			e.counts.Engines++
			lk := lifecycle.Key{Model: key.Model, Instance: key.Host, Engine: key.Name}
			for _, m := range []rules.Metric{rules.QueueDepth, rules.QueueTimeP95} {
				if i := int(m - rules.QueueDepth); ok[i] {
					e.checkDynamic(r, m, lk, a.hist, plan, vals[i], a.finishedRequests, nil)
				}
			}
			e.checkEngineLevel(r, r.Engine.KVCache, rules.KVCacheName, lk, a.gaugesOK, a.kvAvg, a.seconds, breachesAtThreshold(rules.KVCacheName))
			e.checkEngineLevel(r, r.Engine.Preemptions, rules.PreemptionsName, lk, true, a.preemptionsPerS, a.seconds, breachesAtThreshold(rules.PreemptionsName))
		}
		if learn && a.up > 0 {
			e.engines.AddAll(a.hist, plan.Step, vals[:], ok[:])
		}
		if evaluate && a.recent != nil && a.queueOK && a.prefillOK && !e.breachedHosts[key.Host] {
			a.recent.push(a.queueP95, a.prefillP95)
			a.recent.lastWindow = int64(e.counts.Windows)
		}
		a.reset()
	}
	for dk, d := range e.downAgg {
		if evaluate && d.samples > 0 {
			lk := lifecycle.Key{Instance: dk.host, Engine: dk.name}
			failed := float64(d.down) / float64(d.samples)
			e.checkEngineLevel(r, r.Engine.Down, rules.DownName, lk, true, failed, d.seconds, breachesAtThreshold(rules.DownName))
		}
		delete(e.downAgg, dk)
	}
	clear(e.hostEngines)
	clear(e.breachedHosts)
}

// breachesAtThreshold reports whether a value at an engine rule's threshold breaches it:
// KV-cache usage at its level, an engine down in every scrape (a fraction of 1).
func breachesAtThreshold(rule string) bool {
	return rule == rules.KVCacheName || rule == rules.DownName
}

// checkEngineLevel observes one static engine rule: value against the level's threshold
// (at it too when inclusive), firing after the level's For in windows.
func (e *Engine) checkEngineLevel(r *rules.Rules, l rules.EngineLevel, name string, lk lifecycle.Key, ok bool, value float64, seconds int, inclusive bool) {
	if !l.Enabled {
		return
	}
	lk.Rule, lk.Severity = name, l.Severity
	if !ok {
		e.life.Hold(lk)
		return
	}
	thr := l.Threshold
	if name == rules.DownName {
		thr = 1 // every scrape of the window failed
	}
	e.life.Observe(lk, lifecycle.Observation{
		Value: value, Threshold: thr, ResolveAt: thr * (1 - r.Hysteresis), HighIsBad: true, Inclusive: inclusive,
		Method: rules.Static, For: l.Windows(seconds), KeepFiringFor: r.KeepFiringFor,
	})
}

// ttftCause compares the queue and prefill p95 of the engines serving a series (its
// instances that are engine hosts, the series' model first) with their reference, and names
// the one that grew most; nil when no instance of the series has engine data in the window.
func (e *Engine) ttftCause(model string, instances []string, plan baseline.Plan) *events.EngineCause {
	var best *events.EngineCause
	bestGrowth := math.Inf(-1)
	for _, host := range instances {
		keys := e.hostEngines[host]
		sameModel := slices.ContainsFunc(keys, func(k EngineKey) bool { return k.Model == model })
		for _, key := range keys {
			if sameModel && key.Model != model {
				continue
			}
			c, growth := e.engineCause(key, plan)
			if c != nil && growth > bestGrowth {
				best, bestGrowth = c, growth
			}
		}
	}
	return best
}

// engineCause is one engine's side of a TTFT breach, and its larger growth (ms).
func (e *Engine) engineCause(key EngineKey, plan baseline.Plan) (*events.EngineCause, float64) {
	a := e.engAgg[key]
	if a == nil || !a.queueOK || !a.prefillOK {
		return nil, 0
	}
	c := &events.EngineCause{Host: key.Host, Engine: key.Name, Model: key.Model, QueueP95Ms: a.queueP95, PrefillP95Ms: a.prefillP95}
	d := &e.rules.Default.Dynamic[rules.QueueTimeP95]
	// The baseline's center as queue_time_p95_dynamic reads it: the median by default, so
	// yesterday's queue incident at this hour does not raise the reference.
	robust := d.Method == rules.MedianMAD
	q := e.engines.Stats(a.hist, plan, int(rules.QueueTimeP95-rules.QueueDepth), robust)
	p := e.engines.Stats(a.hist, plan, engPrefill, robust)
	switch {
	case q.N >= d.MinPoints && p.N >= d.MinPoints:
		c.Reference, c.QueueRefMs, c.PrefillRefMs = "baseline", q.Mean, p.Mean
		if robust {
			c.QueueRefMs, c.PrefillRefMs = q.Median, p.Median
		}
	case a.recent != nil && a.recent.n > 0:
		c.Reference = "recent"
		c.QueueRefMs, c.PrefillRefMs = a.recent.medians(e.scratch)
	default:
		return nil, 0
	}
	dq, dp := c.QueueP95Ms-c.QueueRefMs, c.PrefillP95Ms-c.PrefillRefMs
	grew := func(d, ref float64) bool { return d >= hintMinMs && d >= hintMinFrac*ref }
	switch {
	case grew(dq, c.QueueRefMs) && (dq >= dp || !grew(dp, c.PrefillRefMs)):
		c.Cause = events.CauseQueueTime
	case grew(dp, c.PrefillRefMs):
		c.Cause = events.CausePrefillTime
	default:
		c.Cause = events.CauseNeither
	}
	return c, max(dq, dp)
}

// causeNote is the hint in words, for the alert's summary.
func causeNote(c *events.EngineCause) string {
	what := map[string]string{
		events.CauseQueueTime:   "queue time grew: requests wait in the engine's queue",
		events.CausePrefillTime: "prefill time grew: the engine computes the prompts slower",
		events.CauseNeither:     "neither the engine's queue time nor its prefill time grew",
	}[c.Cause]
	ref := "recent median"
	if c.Reference == "baseline" {
		ref = "baseline"
	}
	return fmt.Sprintf("%s (engine %s/%s: queue p95 %s vs %s %s, prefill p95 %s vs %s, bucket-interpolated)",
		what, c.Host, c.Engine, seconds(c.QueueP95Ms), ref, seconds(c.QueueRefMs), seconds(c.PrefillP95Ms), seconds(c.PrefillRefMs))
}

func seconds(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.2f s", ms/1000)
}
