package engine

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/influxdata/tdigest"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/lifecycle"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// SeriesKey identifies a token series. Layer is empty for the gateway, the default layer,
// so a gateway series keeps the key (and its alerts the labels) it had before layers;
// rollups of other layers are other series, never summed with the gateway's.
type SeriesKey struct {
	Env, Scene, Model, Bucket string
	Layer                     string
}

// SeriesLayer returns the Layer of a SeriesKey for a rollup's layer: empty for the gateway.
func SeriesLayer(l events.Layer) string {
	switch l {
	case events.LayerEngine:
		return string(events.LayerEngine)
	case events.LayerApp:
		return string(events.LayerApp)
	}
	return ""
}

// Window is one window's main rollups.
type Window struct {
	Start    time.Time
	Seconds  int
	Tokens   []events.TokenRollup
	GPUs     []events.GPURollup
	Engines  []events.EngineRollup
	Feedback []events.FeedbackRollup
}

// End returns when the window ends.
func (w *Window) End() time.Time { return w.Start.Add(time.Duration(w.Seconds) * time.Second) }

// Counts are what the engine did, for the service's metrics.
type Counts struct {
	Windows         uint64
	Series          uint64 // series evaluated
	Hosts           uint64 // hosts evaluated for efficiency
	Engines         uint64 // engine × model evaluations
	Dynamic         uint64 // metric checks by a dynamic rule
	StaticFallback  uint64 // metric checks by a static rule because the dynamic one was not eligible
	SkippedRows     uint64 // rows that were not window rollups
	HostsWithoutGPU uint64 // instances with traffic but no GPU rollup in the window
	Scenes          uint64 // env × scene business evaluations
	BaselineSeries  int
	BaselineHosts   int
	BaselineEngines int
	BaselineScenes  int
	BaselineRefused uint64 // new series whose history was not kept, past ALERTER_MAX_SERIES
	Firing, Pending int
}

// Engine evaluates windows. It is not safe for concurrent use: one goroutine feeds it.
type Engine struct {
	rules   *rules.Set
	series  *baseline.Store[SeriesKey]
	hosts   *baseline.Store[string]
	engines *baseline.Store[EngineKey]
	biz     *baseline.Store[SceneKey]
	life    *lifecycle.Tracker

	// Windows starting at or before learnedThrough are in the baselines already (loaded
	// from ClickHouse): evaluating them again must not count them twice.
	learnedThrough time.Time
	counts         Counts

	mu   sync.Mutex // guards snap, which metrics read from other goroutines
	snap Counts

	agg     map[SeriesKey]*seriesAgg
	hostAgg map[string]*hostAgg
	bizAgg  map[SceneKey]*bizAgg
	digest  *tdigest.TDigest

	engAgg      map[EngineKey]*engineAgg
	downAgg     map[downKey]*downAgg
	hostEngines map[string][]EngineKey // the window's engine keys that answered, by host
	recent      map[EngineKey]*recentRing
	scratch     []float64
	// ttftBreached is set while a series is checked when one of its TTFT rules breaches;
	// breachedHosts are the instances of such series in the window, whose engines' windows
	// are kept out of the hint's recent reference.
	ttftBreached  bool
	breachedHosts map[string]bool
}

// New returns an engine with empty baselines.
func New(rs *rules.Set, opts baseline.Options, resend time.Duration) (*Engine, error) {
	series, err := baseline.New[SeriesKey](opts, rules.NumSeriesMetrics)
	if err != nil {
		return nil, err
	}
	hosts, err := baseline.New[string](opts, rules.NumHostMetrics)
	if err != nil {
		return nil, err
	}
	engines, err := baseline.New[EngineKey](opts, engMetrics)
	if err != nil {
		return nil, err
	}
	biz, err := baseline.New[SceneKey](opts, rules.NumBusinessMetrics)
	if err != nil {
		return nil, err
	}
	return &Engine{
		rules:       rs,
		series:      series,
		hosts:       hosts,
		engines:     engines,
		biz:         biz,
		life:        lifecycle.New(resend),
		agg:         make(map[SeriesKey]*seriesAgg),
		hostAgg:     make(map[string]*hostAgg),
		bizAgg:      make(map[SceneKey]*bizAgg),
		digest:      tdigest.NewWithCompression(100),
		engAgg:      make(map[EngineKey]*engineAgg),
		downAgg:     make(map[downKey]*downAgg),
		hostEngines: make(map[string][]EngineKey),
		recent:      make(map[EngineKey]*recentRing),

		breachedHosts: make(map[string]bool),
	}, nil
}

// Counts returns the engine's counters and sizes; only the goroutine that evaluates may
// call it.
func (e *Engine) Counts() Counts {
	c := e.counts
	c.BaselineSeries, c.BaselineHosts, c.BaselineEngines, c.BaselineScenes = e.series.Len(), e.hosts.Len(), e.engines.Len(), e.biz.Len()
	c.BaselineRefused = e.series.Refused() + e.hosts.Refused() + e.engines.Refused() + e.biz.Refused()
	c.Firing, c.Pending = e.life.Count()
	return c
}

// Restore brings back the alerts that were firing before a restart, so they are not fired
// again, each resolving after its scene's keep_firing_for (host and engine alerts: the
// defaults').
func (e *Engine) Restore(alerts []events.Alert) {
	for _, a := range alerts {
		e.life.Restore(a, e.rules.For(a.Labels["scene"]).KeepFiringFor, highIsBad(a.Rule), breachesAtThreshold(a.Rule))
	}
}

// highIsBad reports a rule's bad direction: low for the dynamic rules of metrics where low
// is bad, high for every other rule (static SLAs, saturation, engine levels).
func highIsBad(rule string) bool {
	for m := range rules.Metric(rules.NumMetrics) {
		if rules.DynamicName(m) == rule {
			return m.HighIsBad()
		}
	}
	return true
}

// MergeSeries adds a baseline cell loaded from elsewhere (ClickHouse): n windows of metric
// m in the step holding t, with their mean, population variance and a sample of values.
func (e *Engine) MergeSeries(key SeriesKey, t time.Time, m rules.Metric, n uint64, mean, variance float64, sample []float64) {
	e.series.Merge(e.series.Series(key), e.series.StepOf(t), int(m), n, mean, variance, sample)
}

// MergeHost is MergeSeries for a host's efficiency metrics.
func (e *Engine) MergeHost(host string, t time.Time, m rules.Metric, n uint64, mean, variance float64, sample []float64) {
	e.hosts.Merge(e.hosts.Series(host), e.hosts.StepOf(t), int(m)-rules.NumSeriesMetrics, n, mean, variance, sample)
}

// EngineValue names a value of an engine's baseline for MergeEngine.
type EngineValue int

// The values of an engine's baseline.
const (
	EngineQueueDepth   EngineValue = EngineValue(rules.QueueDepth - rules.QueueDepth)
	EngineQueueTimeP95 EngineValue = EngineValue(rules.QueueTimeP95 - rules.QueueDepth)
	EnginePrefillP95   EngineValue = EngineValue(engPrefill)
)

// MergeEngine is MergeSeries for an engine's baseline values (queue depth, queue time p95
// and prefill time p95, in ms).
func (e *Engine) MergeEngine(key EngineKey, t time.Time, v EngineValue, n uint64, mean, variance float64, sample []float64) {
	e.engines.Merge(e.engines.Series(key), e.engines.StepOf(t), int(v), n, mean, variance, sample)
}

// SetLearnedThrough says the baselines already hold every window starting at or before t,
// so evaluating those windows again does not learn them twice.
func (e *Engine) SetLearnedThrough(t time.Time) { e.learnedThrough = t }

// Evaluate checks the window against the rules, learns it into the baselines, and returns
// the alert state changes, stamped with the window's end.
func (e *Engine) Evaluate(w Window) []events.Alert {
	e.counts.Windows++
	e.life.Begin(w.Start)
	e.process(w, true)
	out := e.life.End(w.End())
	c := e.Counts()
	e.mu.Lock()
	e.snap = c
	e.mu.Unlock()
	return out
}

// Snapshot returns the counts as of the latest evaluated window; it is safe to call from
// any goroutine.
func (e *Engine) Snapshot() Counts {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snap
}

// Learn adds a window to the baselines without evaluating it, as history: a replay of
// past rollups, or a simulation's first week.
func (e *Engine) Learn(w Window) { e.process(w, false) }

func (e *Engine) process(w Window, evaluate bool) {
	learn := w.Start.After(e.learnedThrough)
	if !evaluate && !learn {
		return
	}
	e.group(w)
	e.groupEngines(w)
	plan := e.series.Plan(w.Start)
	for key, a := range e.agg {
		if a.rows == 0 {
			delete(e.agg, key) // a series absent for a window is dropped from the scratch map
			continue
		}
		vals, ok := a.values(e.digest)
		if a.hist == nil {
			a.hist = e.series.Series(key)
		}
		h := a.hist
		if evaluate {
			e.checkSeries(key, a, h, plan, &vals, &ok)
		}
		if learn {
			e.series.AddAll(h, plan.Step, vals[:], ok[:])
		}
		a.reset()
	}
	e.processHosts(w, plan, evaluate, learn)
	e.processEngines(plan, evaluate, learn)
	e.processBusiness(plan, evaluate, learn)
	if evaluate && e.counts.Windows%256 == 0 {
		if e.series.Sweep(w.Start)+e.hosts.Sweep(w.Start)+e.engines.Sweep(w.Start)+e.biz.Sweep(w.Start) > 0 {
			// Histories were dropped: scratch entries may point at them.
			clear(e.agg)
			clear(e.hostAgg)
			clear(e.engAgg)
			clear(e.bizAgg)
		}
		for k, r := range e.recent {
			if int64(e.counts.Windows)-r.lastWindow > 4*recentLen {
				delete(e.recent, k) // an engine gone for a while starts its reference afresh
				delete(e.engAgg, k)
			}
		}
	}
}

// group sums the window's token rollups per series and per instance.
func (e *Engine) group(w Window) {
	for i := range w.Tokens {
		r := &w.Tokens[i]
		if r.Kind != events.KindWindow {
			e.counts.SkippedRows++
			continue
		}
		key := SeriesKey{Env: r.Env, Scene: r.Scene, Model: r.Model, Bucket: r.Bucket, Layer: SeriesLayer(r.Layer)}
		a := e.agg[key]
		if a == nil {
			a = &seriesAgg{}
			e.agg[key] = a
		}
		a.add(r)
		if r.Instance != "" && !slices.Contains(a.instances, r.Instance) {
			a.instances = append(a.instances, r.Instance)
		}
		// A host's efficiency counts the gateway's view of its requests only: the same
		// requests seen by the engine too would count twice.
		if r.Instance != "" && key.Layer == "" {
			h := e.host(r.Instance)
			h.requests += r.Requests
			h.output += r.OutputTokens
			h.seconds = max(h.seconds, r.WindowSeconds)
			h.rows = append(h.rows, r)
		}
	}
	e.groupBusiness(w)
	for i := range w.GPUs {
		g := &w.GPUs[i]
		if g.Kind != events.KindWindow {
			e.counts.SkippedRows++
			continue
		}
		h := e.host(g.Host)
		h.gpus++
		h.utilWeighted += g.UtilAvg * float64(max(g.Samples, 1))
		h.samples += float64(max(g.Samples, 1))
		h.energy += g.EnergyJ
	}
}

func (e *Engine) host(name string) *hostAgg {
	h := e.hostAgg[name]
	if h == nil {
		h = &hostAgg{}
		e.hostAgg[name] = h
	}
	return h
}

func (e *Engine) checkSeries(key SeriesKey, a *seriesAgg, h *baseline.History, plan baseline.Plan, vals *[rules.NumSeriesMetrics]float64, ok *[rules.NumSeriesMetrics]bool) {
	e.counts.Series++
	r := e.rules.For(key.Scene)
	lk := lifecycle.Key{Env: key.Env, Scene: key.Scene, Model: key.Model, Bucket: key.Bucket, Layer: key.Layer}
	e.ttftBreached = false
	defer func() {
		if e.ttftBreached {
			for _, inst := range a.instances {
				e.breachedHosts[inst] = true
			}
		}
	}()
	for m := range rules.Metric(rules.NumSeriesMetrics) {
		if !ok[m] {
			continue
		}
		var cause *events.EngineCause
		if m == rules.TTFTP95 && e.rules.Default.Engine.TTFTHint && len(a.instances) > 0 && len(e.hostEngines) > 0 {
			cause = e.ttftCause(key.Model, a.instances, plan)
		}
		eligible := e.checkDynamic(r, m, lk, h, plan, vals[m], a.requests, cause)
		st := r.Static[m]
		if !st.Enabled {
			continue
		}
		primary := !eligible || st.Always
		if primary && !eligible {
			e.counts.StaticFallback++
		}
		levels, nl := st.Levels()
		for _, lvl := range levels[:nl] {
			lk.Rule, lk.Severity = rules.StaticName(m), lvl.Severity
			o := lifecycle.Observation{
				Value:     vals[m],
				Threshold: lvl.Threshold,
				ResolveAt: lvl.Threshold * (1 - r.Hysteresis),
				HighIsBad: true,
				Method:    rules.Static,
				For:       r.For, KeepFiringFor: r.KeepFiringFor,
			}
			if cause != nil {
				o.Cause, o.Note = cause, causeNote(cause)
			}
			switch {
			case a.requests < st.MinRequests:
				e.life.Hold(lk)
			case primary:
				if e.life.Observe(lk, o) && m == rules.TTFTP95 {
					e.ttftBreached = true
				}
			default:
				e.life.Update(lk, o)
			}
		}
	}
}

// checkDynamic observes metric m's dynamic rule when it is eligible (enough baseline and
// traffic) and reports whether it was; cause, when set, is the engine's side of a TTFT breach.
func (e *Engine) checkDynamic(r *rules.Rules, m rules.Metric, lk lifecycle.Key, h *baseline.History, plan baseline.Plan, v float64, requests uint64, cause *events.EngineCause) bool {
	d := &r.Dynamic[m]
	if !d.Enabled {
		return false
	}
	lk.Rule, lk.Severity = rules.DynamicName(m), d.Severity
	if requests < d.MinRequests {
		e.life.Hold(lk)
		return false
	}
	var st baseline.Stats
	switch {
	case m.HostMetric():
		st = e.hosts.Stats(h, plan, int(m)-rules.NumSeriesMetrics, d.Method == rules.MedianMAD)
	case m.EngineMetric():
		st = e.engines.Stats(h, plan, int(m-rules.QueueDepth), d.Method == rules.MedianMAD)
	case m.BusinessMetric():
		st = e.biz.Stats(h, plan, int(m)-int(rules.Satisfaction), d.Method == rules.MedianMAD)
	default:
		st = e.series.Stats(h, plan, int(m), d.Method == rules.MedianMAD)
	}
	if st.N < d.MinPoints {
		return false
	}
	e.counts.Dynamic++
	center, spread := st.Mean, st.Std
	if d.Method == rules.MedianMAD {
		center, spread = st.Median, st.MAD
	}
	dist := max(d.K*spread, d.MinChange*math.Abs(center), d.MinDelta)
	resolveDist := dist * (1 - r.Hysteresis)
	o := lifecycle.Observation{
		Value:     v,
		HighIsBad: m.HighIsBad(),
		Method:    d.Method,
		Center:    center,
		Spread:    spread,
		For:       r.For, KeepFiringFor: r.KeepFiringFor,
	}
	if cause != nil {
		o.Cause, o.Note = cause, causeNote(cause)
	}
	if o.HighIsBad {
		o.Threshold, o.ResolveAt = center+dist, center+resolveDist
	} else {
		o.Threshold, o.ResolveAt = center-dist, center-resolveDist
	}
	if e.life.Observe(lk, o) && m == rules.TTFTP95 {
		e.ttftBreached = true
	}
	return true
}

func (e *Engine) processHosts(w Window, plan baseline.Plan, evaluate, learn bool) {
	r := &e.rules.Default
	for name, ha := range e.hostAgg {
		if ha.gpus == 0 && len(ha.rows) == 0 {
			delete(e.hostAgg, name)
			continue
		}
		if ha.gpus == 0 || ha.seconds == 0 {
			if len(ha.rows) > 0 && evaluate {
				e.counts.HostsWithoutGPU++
			}
			ha.reset()
			continue
		}
		util := ha.utilWeighted / ha.samples
		tps := float64(ha.output) / float64(ha.seconds)
		var vals [2]float64
		var ok [2]bool
		if util > 0 {
			vals[0], ok[0] = tps/util, true
		}
		if ha.energy > 0 {
			vals[1], ok[1] = float64(ha.output)/ha.energy, true
		}
		h := e.hosts.Series(name)
		if evaluate {
			e.counts.Hosts++
			lk := lifecycle.Key{Instance: name}
			for i, m := range []rules.Metric{rules.GPUEfficiency, rules.TokensPerJoule} {
				if ok[i] {
					e.checkDynamic(r, m, lk, h, plan, vals[i], ha.requests, nil)
				}
			}
			e.checkSaturation(r, name, ha, util)
		}
		if learn && ha.requests > 0 {
			e.hosts.AddAll(h, plan.Step, vals[:], ok[:])
		}
		ha.reset()
	}
}

// checkSaturation fires for a host near 100 % busy while a series it serves breaks its
// TTFT p95 SLA.
func (e *Engine) checkSaturation(r *rules.Rules, host string, ha *hostAgg, util float64) {
	sat := r.Saturation
	if !sat.Enabled {
		return
	}
	o := lifecycle.Observation{
		Value: util, Threshold: sat.UtilPct, ResolveAt: sat.UtilPct, HighIsBad: true,
		Method: rules.Static, For: r.For, KeepFiringFor: r.KeepFiringFor,
	}
	lk := lifecycle.Key{Rule: rules.SaturationName, Severity: sat.Severity, Instance: host}
	if util >= sat.UtilPct {
		breaking := false
		for _, row := range ha.rows {
			sla := e.rules.For(row.Scene).Static[rules.TTFTP95]
			if sla.Warning > 0 && row.TTFT.Count > 0 && row.TTFT.P95 > sla.Warning {
				o.Note = fmt.Sprintf("TTFT p95 %.0f ms over its %.0f ms SLA on %s/%s/%s/%s", row.TTFT.P95, sla.Warning, row.Env, row.Scene, row.Model, row.Bucket)
				breaking = true
				break
			}
		}
		if !breaking { // busy but within SLA: normal, and a firing alert says why it resolves
			o.Normal = events.ResolvedWithinSLA
		}
	}
	e.life.Observe(lk, o)
}
