package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
)

// publisher queues a message without blocking; bus.Publisher is one.
type publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// Options configure a Scraper.
type Options struct {
	Host      string
	Interval  time.Duration
	Timeout   time.Duration // per scrape; below Interval
	MaxBytes  int64         // largest exposition read; a larger one fails the scrape
	MaxModels int           // models per engine; more are left out and counted
}

// Scraper scrapes every target once per tick, concurrently, and publishes one sample per
// engine × model (one up=false sample for an engine that could not be read).
type Scraper struct {
	targets  []*target
	pub      publisher
	opts     Options
	subject  string
	client   *http.Client
	m        *metrics
	logger   *slog.Logger
	lastTick atomic.Int64
}

// target is one endpoint and what its previous scrape left, to subtract from the next.
type target struct {
	Target
	body    bytes.Buffer
	cache   *seriesCache
	models  map[string]*state
	lastErr string
	out     []events.EngineSample
}

// state is one model's totals at one scrape: the counters and cumulative histograms.
type state struct {
	ts       time.Time
	has      [numFields]bool
	counters [numFields]float64
	hists    [numFields]*cumHist
	// how many series each field adds up: a delta is taken only between two scrapes that
	// add as many, for a series gone (a core's value refused, a core gone) makes the sum
	// fall without any restart
	series [numFields]int
	// while reading: which name set each field (0 none, 1 legacy, 2 current) and the
	// fields dropped for a conflict this scrape
	from     [numFields]uint8
	conflict [numFields]bool
}

// cumHist is a histogram as exposed: finite upper bounds, cumulative counts at each, and
// the total count (the +Inf bucket) and sum.
type cumHist struct {
	le    []float64
	cum   []float64
	count float64
	sum   float64
}

// New returns a Scraper of targets that publishes through pub.
func New(targets []Target, pub publisher, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Scraper {
	s := &Scraper{
		pub: pub, opts: opts,
		subject: events.EngineSampleSubject(opts.Host),
		m:       newMetrics(reg, targets),
		logger:  logger,
		client: &http.Client{
			Timeout: opts.Timeout,
			Transport: &http.Transport{
				Proxy:               nil, // engines are on this host; never through a proxy
				DialContext:         (&net.Dialer{Timeout: opts.Timeout}).DialContext,
				MaxIdleConnsPerHost: 2,
				IdleConnTimeout:     max(3*opts.Interval, 30*time.Second),
				DisableCompression:  false,
			},
		},
	}
	for _, t := range targets {
		s.targets = append(s.targets, &target{
			Target: t,
			models: map[string]*state{},
			cache:  newSeriesCache(),
		})
	}
	return s
}

// Run scrapes on wall-clock multiples of the interval, the ticks the GPU sampler takes,
// until ctx ends.
func (s *Scraper) Run(ctx context.Context) error {
	next := time.Now().Truncate(s.opts.Interval).Add(s.opts.Interval)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		s.Tick(ctx, next)
		next = time.Now().Truncate(s.opts.Interval).Add(s.opts.Interval)
		timer.Reset(time.Until(next))
	}
}

// LastTick returns when the last tick finished, or the zero time before the first.
func (s *Scraper) LastTick() time.Time {
	if ns := s.lastTick.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Tick scrapes every target at now and queues the samples.
func (s *Scraper) Tick(ctx context.Context, now time.Time) {
	now = now.UTC().Truncate(time.Millisecond)
	var wg sync.WaitGroup
	for _, t := range s.targets {
		wg.Go(func() { s.scrapeTarget(ctx, t, now) })
	}
	wg.Wait()
	for _, t := range s.targets {
		for i := range t.out {
			s.publish(&t.out[i], now)
		}
	}
	s.lastTick.Store(time.Now().UnixNano())
}

func (s *Scraper) publish(smp *events.EngineSample, now time.Time) {
	// A reading the contract refuses is left out, not the sample with the rest.
	dropped, err := events.DropBadReadings(smp, now)
	if len(dropped) > 0 {
		s.m.dropped.WithLabelValues(smp.Name, "invalid_reading").Add(float64(len(dropped)))
	}
	if err != nil {
		s.m.invalid.WithLabelValues(events.Reason(err)).Inc()
		return
	}
	data, err := events.MarshalEngineSample(smp)
	if err != nil {
		s.m.invalid.WithLabelValues("other").Inc()
		return
	}
	if s.pub.Publish(s.subject, msgID(smp), data) {
		s.m.samples.Inc()
	}
}

// msgID is host/name/model/ts, the model hashed: one sample of one engine's model at
// one tick, whatever bytes the model name holds.
func msgID(s *events.EngineSample) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.Model))
	b := make([]byte, 0, 96)
	b = append(b, s.Host...)
	b = append(b, '/')
	b = append(b, s.Name...)
	b = append(b, '/')
	b = strconv.AppendUint(b, h.Sum64(), 16)
	b = append(b, '/')
	return string(events.AppendTime(b, s.TS))
}

// scrapeTarget fills t.out with this tick's samples of t.
func (s *Scraper) scrapeTarget(ctx context.Context, t *target, now time.Time) {
	began := time.Now()
	t.out = t.out[:0]
	reason, err := s.fetch(ctx, t)
	if err != nil && ctx.Err() != nil {
		// gpuwatch is stopping: a scrape it cut short says nothing of the engine, and an
		// up=false sample would report every engine down at each restart.
		return
	}
	s.m.scrapes.WithLabelValues(t.Name).Inc()
	var fams map[string]*dto.MetricFamily
	if err == nil {
		fams, err = families(t.body.Bytes(), names[t.Engine], t.cache)
		if err != nil {
			reason = "malformed"
		} else if t.cache.dups > 0 {
			s.m.dropped.WithLabelValues(t.Name, "duplicate_series").Add(float64(t.cache.dups))
		}
	}
	if err != nil {
		s.m.failed.WithLabelValues(t.Name, reason).Inc()
		s.m.up.WithLabelValues(t.Name).Set(0)
		// Logged when the failure changes, not at every tick: the error's text also holds
		// what differs between two attempts of one failure (the local port of a connection
		// the engine reset, the line a malformed exposition broke at), so the reason is
		// what is compared, and the status of an engine that answers with another.
		key := reason
		if reason == "http_status" {
			key += ": " + err.Error()
		}
		if key != t.lastErr {
			s.logger.Warn("cannot scrape engine; reported down", "engine", t.Name, "url", ops.RedactURL(t.URL), "reason", reason, "err", err)
			t.lastErr = key
		}
		t.out = append(t.out, events.EngineSample{V: events.Version, TS: now, Host: s.opts.Host,
			Engine: t.Engine, Name: t.Name, Up: false, Error: reason})
		return
	}
	if t.lastErr != "" {
		s.logger.Info("engine scraped again", "engine", t.Name)
		t.lastErr = ""
	}
	s.m.up.WithLabelValues(t.Name).Set(1)
	cur := s.read(t, fams)
	s.m.models.WithLabelValues(t.Name).Set(float64(len(cur)))
	for mdl, st := range cur {
		st.ts = now
		smp := events.EngineSample{V: events.Version, TS: now, Host: s.opts.Host,
			Engine: t.Engine, Name: t.Name, Model: mdl, Up: true}
		s.fill(t, &smp, st, t.models[mdl])
		t.out = append(t.out, smp)
	}
	// Only what this scrape saw is kept: a model the engine unloaded leaves no state.
	t.models = cur
	slices.SortFunc(t.out, func(a, b events.EngineSample) int {
		switch {
		case a.Model < b.Model:
			return -1
		case a.Model > b.Model:
			return 1
		}
		return 0
	})
	s.m.duration.WithLabelValues(t.Name).Observe(time.Since(began).Seconds())
}

// fetch reads t's exposition into t.body.
func (s *Scraper) fetch(ctx context.Context, t *target) (reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return "connect", withoutURL(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		return netReason(ctx, err), withoutURL(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		return "http_status", fmt.Errorf("engine answered %s", resp.Status)
	}
	t.body.Reset()
	if _, err := t.body.ReadFrom(io.LimitReader(resp.Body, s.opts.MaxBytes+1)); err != nil {
		return netReason(ctx, err), fmt.Errorf("cannot read the exposition: %w", err)
	}
	if int64(t.body.Len()) > s.opts.MaxBytes {
		return "too_large", fmt.Errorf("exposition over %d bytes", s.opts.MaxBytes)
	}
	return "", nil
}

// withoutURL returns err without the URL net/http puts in it, which shows the query (where
// a token may be): the log line names the target's URL redacted.
func withoutURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

func netReason(ctx context.Context, err error) string {
	if ne, ok := errors.AsType[net.Error](err); (ok && ne.Timeout()) || ctx.Err() != nil {
		return "timeout"
	}
	return "connect"
}

// read sums what the families say per model: across the other labels (vLLM's engine
// core index under data parallelism, SGLang's dp_rank) additive readings add and usage
// ratios take the highest. SGLang labels each scheduler's series with its ranks: a
// data-parallel rank (dp_rank) is a scheduler of its own, with its own queue, while the
// other ranks of one (tp_rank, pp_rank, moe_ep_rank) repeat its figures when every
// scheduler exports. So only the lowest ranks of each model and dp_rank are read, or the
// same requests would be counted once per rank. The lowest, not 0: under DP attention
// the scheduler of dp_rank 3 is tp_rank 3 (and moe_ep_rank 3 with expert parallelism).
func (s *Scraper) read(t *target, fams map[string]*dto.MetricFamily) map[string]*state {
	cur := map[string]*state{}
	byName := names[t.Engine]
	label := modelLabel(t.Engine)
	if label == "" {
		label = "\x00" // no label has this name: TGI's samples have no model
	}
	leaders, models := survey(fams, byName, label)
	kept := s.keep(t, models) // nil: every model is read
	overLimit := false
	for name, fam := range fams {
		mp, ok := byName[name]
		if !ok {
			continue
		}
		prio := uint8(2)
		if mp.legacy {
			prio = 1
		}
		for _, m := range fam.GetMetric() {
			mdl, group, r := seriesRanks(m, label)
			if r.has && r != leaders[group] {
				continue // another rank's copy of the same scheduler's figures
			}
			st := cur[mdl]
			if st == nil {
				if kept != nil && !kept[mdl] {
					overLimit = true
					continue
				}
				st = &state{}
				cur[mdl] = st
			}
			f := mp.f
			if st.from[f] > prio || st.conflict[f] {
				continue
			}
			if st.from[f] < prio { // a current name replaces a legacy one
				st.has[f], st.counters[f], st.hists[f], st.series[f] = false, 0, nil, 0
				st.from[f] = prio
			}
			if f >= firstHistogram {
				s.addHist(t, st, f, m.GetHistogram())
				continue
			}
			v, ok := value(fam.GetType(), m, f >= firstCounter)
			if !ok || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (maxed(f) && v > 1) {
				s.m.dropped.WithLabelValues(t.Name, "bad_value").Inc()
				continue
			}
			switch {
			case !st.has[f]:
				st.counters[f] = v
			case maxed(f):
				st.counters[f] = max(st.counters[f], v)
			default:
				st.counters[f] += v
			}
			st.has[f] = true
			st.series[f]++
		}
	}
	if overLimit {
		s.m.dropped.WithLabelValues(t.Name, "models_over_limit").Inc()
	}
	if len(cur) == 0 {
		cur[""] = &state{} // up, and exporting nothing tokenscope reads
	}
	return cur
}

// ranks are the parallel ranks of the SGLang scheduler a series is from, below its
// data-parallel rank.
type ranks struct {
	has           bool // the series carries at least one of them
	pp, tp, moeEP string
}

// less orders ranks by pp_rank, then tp_rank, then moe_ep_rank, each as a number (a
// shorter decimal is the smaller), a missing one first.
func (r ranks) less(o ranks) bool {
	for _, p := range [...][2]string{{r.pp, o.pp}, {r.tp, o.tp}, {r.moeEP, o.moeEP}} {
		a, b := p[0], p[1]
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		if a != b {
			return a < b
		}
	}
	return false
}

// seriesRanks returns the series' model, the scheduler group it belongs to (model and
// dp_rank; only made when it has ranks) and its ranks in that group.
func seriesRanks(m *dto.Metric, label string) (mdl, group string, r ranks) {
	dp := ""
	for _, lp := range m.GetLabel() {
		switch lp.GetName() {
		case label:
			mdl = lp.GetValue()
		case "dp_rank":
			dp = lp.GetValue()
		case "pp_rank":
			r.pp, r.has = lp.GetValue(), true
		case "tp_rank":
			r.tp, r.has = lp.GetValue(), true
		case "moe_ep_rank":
			r.moeEP, r.has = lp.GetValue(), true
		}
	}
	if r.has {
		group = mdl + "\x00" + dp
	}
	return mdl, group, r
}

// survey returns, per model and dp_rank, the lowest ranks any series read has (the
// scheduler whose series are read), and per model how many of the families read name it.
func survey(fams map[string]*dto.MetricFamily, byName map[string]mapping, label string) (leaders map[string]ranks, models map[string]named) {
	models = map[string]named{}
	for name, fam := range fams {
		if _, ok := byName[name]; !ok {
			continue
		}
		for _, m := range fam.GetMetric() {
			mdl, group, r := seriesRanks(m, label)
			if n := models[mdl]; n.last != fam {
				models[mdl] = named{families: n.families + 1, last: fam}
			}
			if !r.has {
				continue
			}
			if leaders == nil {
				leaders = map[string]ranks{}
			}
			if l, ok := leaders[group]; !ok || r.less(l) {
				leaders[group] = r
			}
		}
	}
	return leaders, models
}

// named is how many families name a model, and the last of them.
type named struct {
	families int
	last     *dto.MetricFamily
}

// keep returns the models read when the families name more than MaxModels, or nil when
// every model fits. Those kept are the ones the most families name (an engine's model is
// in every family it exports; a value flooding the model label of one family is in one),
// then the ones read at the previous scrape, then by name: the same models from one scrape
// to the next, whatever order the families come in.
func (s *Scraper) keep(t *target, models map[string]named) map[string]bool {
	if len(models) <= s.opts.MaxModels {
		return nil
	}
	type candidate struct {
		model    string
		families int
		known    bool // read at the previous scrape
	}
	all := make([]candidate, 0, len(models))
	for mdl, n := range models {
		_, known := t.models[mdl]
		all = append(all, candidate{mdl, n.families, known})
	}
	slices.SortFunc(all, func(a, b candidate) int {
		switch {
		case a.families != b.families:
			return b.families - a.families
		case a.known != b.known:
			if a.known {
				return -1
			}
			return 1
		}
		return strings.Compare(a.model, b.model)
	})
	kept := make(map[string]bool, s.opts.MaxModels)
	for _, c := range all[:s.opts.MaxModels] {
		kept[c.model] = true
	}
	return kept
}

// value is a gauge's or counter's value; untyped families count as either.
func value(typ dto.MetricType, m *dto.Metric, isCounter bool) (float64, bool) {
	switch {
	case typ == dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue(), m.Untyped != nil
	case isCounter && typ == dto.MetricType_COUNTER:
		return m.GetCounter().GetValue(), m.Counter != nil
	case !isCounter && typ == dto.MetricType_GAUGE:
		return m.GetGauge().GetValue(), m.Gauge != nil
	}
	return 0, false
}

// addHist adds one exposed histogram to st's field f.
func (s *Scraper) addHist(t *target, st *state, f field, h *dto.Histogram) {
	if h == nil {
		s.m.dropped.WithLabelValues(t.Name, "histogram_malformed").Inc()
		return
	}
	bs := h.GetBucket()
	byBound := func(a, b *dto.Bucket) int {
		switch {
		case a.GetUpperBound() < b.GetUpperBound():
			return -1
		case a.GetUpperBound() > b.GetUpperBound():
			return 1
		}
		return 0
	}
	if !slices.IsSortedFunc(bs, byBound) { // engines write them in order
		bs = slices.Clone(bs)
		slices.SortFunc(bs, byBound)
	}
	bounds := make([]float64, 2*len(bs)) // le and cum in one allocation
	ch := &cumHist{count: float64(h.GetSampleCount()) + h.GetSampleCountFloat(), sum: h.GetSampleSum(),
		le: bounds[:0:len(bs)], cum: bounds[len(bs):len(bs)]}
	for _, b := range bs {
		ub := b.GetUpperBound()
		if math.IsInf(ub, +1) {
			continue
		}
		c := float64(b.GetCumulativeCount()) + b.GetCumulativeCountFloat()
		n := len(ch.le)
		if math.IsNaN(ub) || math.IsInf(ub, 0) || (n > 0 && ub == ch.le[n-1]) || (n > 0 && c < ch.cum[n-1]) || c > ch.count {
			s.m.dropped.WithLabelValues(t.Name, "histogram_malformed").Inc()
			return
		}
		ch.le = append(ch.le, ub)
		ch.cum = append(ch.cum, c)
	}
	if math.IsNaN(ch.count) || math.IsInf(ch.count, 0) || math.IsNaN(ch.sum) || math.IsInf(ch.sum, 0) {
		s.m.dropped.WithLabelValues(t.Name, "histogram_malformed").Inc()
		return
	}
	if len(ch.le) > events.MaxEngineBuckets {
		s.m.dropped.WithLabelValues(t.Name, "histogram_too_many_buckets").Inc()
		return
	}
	old := st.hists[f]
	switch {
	case old == nil:
		st.hists[f] = ch
		st.series[f]++
	case slices.Equal(old.le, ch.le):
		for i := range old.cum {
			old.cum[i] += ch.cum[i]
		}
		old.count += ch.count
		old.sum += ch.sum
		st.series[f]++
	default:
		s.m.dropped.WithLabelValues(t.Name, "histogram_bounds_mismatch").Inc()
		st.hists[f], st.conflict[f] = nil, true
	}
}

// fill writes st's gauges and its deltas from prev (the model's previous scrape, or nil)
// into smp. A counter below its previous value means the engine restarted: the delta is
// the new value, counted from zero. A field that adds up another number of series than
// at prev has no delta: its sum may have fallen or jumped by a series alone.
func (s *Scraper) fill(t *target, smp *events.EngineSample, st, prev *state) {
	for f := range firstCounter {
		if st.has[f] {
			set(smp, f, st.counters[f])
		}
	}
	if prev == nil {
		return
	}
	d := st.ts.Sub(prev.ts).Seconds()
	smp.DeltaSeconds = &d
	for f := firstCounter; f < firstHistogram; f++ {
		if st.has[f] && prev.has[f] && st.series[f] == prev.series[f] {
			cur, old := st.counters[f], prev.counters[f]
			if cur < old {
				old = 0
			}
			set(smp, f, cur-old)
		}
	}
	for f := firstHistogram; f < numFields; f++ {
		h, old := st.hists[f], prev.hists[f]
		if h == nil || old == nil || !slices.Equal(h.le, old.le) || st.series[f] != prev.series[f] {
			continue
		}
		if dh, ok := histDelta(h, old); ok {
			setHist(smp, f, dh)
		} else {
			s.m.dropped.WithLabelValues(t.Name, "histogram_malformed").Inc()
		}
	}
}

// histDelta returns the per-bucket observations between old and h (same bounds); when
// any count fell, the engine restarted and h counts from zero.
func histDelta(h, old *cumHist) (*events.HistogramDelta, bool) {
	reset := h.count < old.count
	for i := range h.cum {
		reset = reset || h.cum[i] < old.cum[i]
	}
	base := func(i int) float64 {
		if reset {
			return 0
		}
		return old.cum[i]
	}
	d := &events.HistogramDelta{Le: append([]float64{}, h.le...), Counts: make([]float64, len(h.le)+1)}
	prevCum := 0.0
	for i := range h.cum {
		c := h.cum[i] - base(i)
		d.Counts[i] = c - prevCum
		prevCum = c
	}
	d.Count, d.Sum = h.count, h.sum
	if !reset {
		d.Count -= old.count
		d.Sum -= old.sum
	}
	d.Counts[len(h.le)] = d.Count - prevCum
	for _, c := range d.Counts {
		if c < 0 {
			return nil, false
		}
	}
	return d, true
}
