package baseline

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Options shape the baseline.
type Options struct {
	Step          time.Duration  // width of a history cell; divides 24 h
	Slot          time.Duration  // the baseline spans time of day ± Slot
	Days          int            // days of history
	Location      *time.Location // where "time of day" and "weekend" are read
	SplitWeekends bool           // compare weekdays with weekdays, weekends with weekends
	// MaxSeries bounds the series a store keeps a history of (0: no bound). Past it a new
	// series is refused: its history is not kept (the caller may hold it while the series
	// stays in every window), so its dynamic rules lack a baseline and fall back to the
	// static ones, until old series are swept.
	MaxSeries int
}

// Validate checks the options; names are the alerter's environment variables.
func (o Options) Validate() error {
	switch {
	case o.Step < time.Minute || o.Step > time.Hour || (24*time.Hour)%o.Step != 0 || o.Step%time.Second != 0:
		return fmt.Errorf("ALERTER_BASELINE_STEP=%s must be whole seconds from 1m to 1h that divide 24h", o.Step)
	case o.Slot < 0 || o.Slot > 6*time.Hour:
		return fmt.Errorf("ALERTER_SLOT=%s must be from 0 to 6h", o.Slot)
	case o.Days < 1 || o.Days > 28:
		return fmt.Errorf("ALERTER_BASELINE_DAYS=%d must be 1 to 28", o.Days)
	case o.Location == nil:
		return errors.New("ALERTER_TIMEZONE is not set")
	case o.MaxSeries < 0:
		return fmt.Errorf("ALERTER_MAX_SERIES=%d must not be negative (0: no bound)", o.MaxSeries)
	}
	return nil
}

// Stats is a baseline: how many windows it holds and their center and spread.
type Stats struct {
	N      int
	Mean   float64
	Std    float64 // population standard deviation
	Median float64
	MAD    float64 // median absolute deviation × 1.4826, an estimate of σ robust to outliers
}

// reservoir is how many values a cell keeps for the robust statistics.
const reservoir = 3

type cell struct {
	n        uint32
	mean, m2 float32
	sample   [reservoir]float32
}

// blockSize is how many consecutive steps share one allocation.
const blockSize = 16

type block struct {
	idx   int64 // absolute step / blockSize
	cells []cell
}

// History is one series' cells, all its metrics side by side.
type History struct {
	ring    []*block
	last    int64 // latest step written
	cacheAt int64 // the step the cache was computed for, -1 when invalid
	cache   []Stats
	cached  []uint8 // per metric: 0 none, 1 mean/σ, 2 both
}

// Store holds the histories of series keyed by K, each with metrics values per window.
type Store[K comparable] struct {
	opts      Options
	metrics   int
	spd       int64 // steps per day
	stepSec   int64
	slotSteps int64
	ringLen   int64
	series    map[K]*History
	refused   uint64
	scratch   []float64
}

// maxMetrics bounds the metrics of one series, so a baseline pass needs no allocation.
const maxMetrics = 16

// New returns an empty store for series with the given number of metrics (1 to 16).
func New[K comparable](opts Options, metrics int) (*Store[K], error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if metrics < 1 || metrics > maxMetrics {
		return nil, fmt.Errorf("cannot keep %d metrics per series: 1 to %d", metrics, maxMetrics)
	}
	stepSec := int64(opts.Step / time.Second)
	spd := 86400 / stepSec
	slotSteps := int64(opts.Slot / opts.Step)
	span := int64(opts.Days)*spd + slotSteps + 1
	return &Store[K]{
		opts:      opts,
		metrics:   metrics,
		spd:       spd,
		stepSec:   stepSec,
		slotSteps: slotSteps,
		ringLen:   (span+blockSize-1)/blockSize + 1,
		series:    make(map[K]*History),
	}, nil
}

// Options returns the store's options.
func (s *Store[K]) Options() Options { return s.opts }

// Len returns how many series the store holds.
func (s *Store[K]) Len() int { return len(s.series) }

// StepOf returns the absolute step of t: local days since 1970 × steps per day + the step
// of the local time of day.
func (s *Store[K]) StepOf(t time.Time) int64 {
	lt := t.In(s.opts.Location)
	y, m, d := lt.Date()
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
	sod := int64(lt.Hour()*3600 + lt.Minute()*60 + lt.Second())
	return day*s.spd + sod/s.stepSec
}

func weekend(day int64) bool {
	wd := (day%7 + 7 + 4) % 7 // 1970-01-01 was a Thursday; 0 is Sunday
	return wd == 0 || wd == 6
}

// Plan is the cells a window's baseline reads.
type Plan struct {
	Step  int64
	cells []int64
}

// Plan returns the baseline cells for a window at t: time of day ± Slot on each of the
// previous Days days (of the same kind, when weekends are split).
func (s *Store[K]) Plan(t time.Time) Plan {
	step := s.StepOf(t)
	today := step / s.spd
	p := Plan{Step: step, cells: make([]int64, 0, s.opts.Days*int(2*s.slotSteps+1))}
	for d := int64(1); d <= int64(s.opts.Days); d++ {
		if s.opts.SplitWeekends && weekend(today-d) != weekend(today) {
			continue
		}
		center := step - d*s.spd
		for c := center - s.slotSteps; c <= center+s.slotSteps; c++ {
			p.cells = append(p.cells, c)
		}
	}
	return p
}

// Series returns the history of key, creating it. Past MaxSeries a new key's history is
// returned without being kept, and counted as refused.
func (s *Store[K]) Series(key K) *History {
	h, ok := s.series[key]
	if !ok {
		h = &History{
			ring:    make([]*block, s.ringLen),
			last:    math.MinInt64,
			cacheAt: -1,
			cache:   make([]Stats, s.metrics),
			cached:  make([]uint8, s.metrics),
		}
		if s.opts.MaxSeries > 0 && len(s.series) >= s.opts.MaxSeries {
			s.refused++
			return h
		}
		s.series[key] = h
	}
	return h
}

// Refused returns how many times a new series' history was not kept, past MaxSeries.
func (s *Store[K]) Refused() uint64 { return s.refused }

// Lookup returns the history of key, or nil.
func (s *Store[K]) Lookup(key K) *History { return s.series[key] }

// Sweep drops series with nothing written within the history's span before t, and returns
// how many it dropped.
func (s *Store[K]) Sweep(t time.Time) int {
	oldest := s.StepOf(t) - int64(s.opts.Days+1)*s.spd
	n := 0
	for k, h := range s.series {
		if h.last < oldest {
			delete(s.series, k)
			n++
		}
	}
	return n
}

func (s *Store[K]) cellAt(h *History, step int64, create bool) []cell {
	idx := floorDiv(step, blockSize)
	slot := ((idx % s.ringLen) + s.ringLen) % s.ringLen
	b := h.ring[slot]
	if b == nil || b.idx != idx {
		if !create {
			return nil
		}
		if b == nil {
			b = &block{cells: make([]cell, blockSize*s.metrics)}
			h.ring[slot] = b
		} else {
			clear(b.cells)
		}
		b.idx = idx
	}
	off := int(step-idx*blockSize) * s.metrics
	return b.cells[off : off+s.metrics]
}

// maxValue bounds the values a cell learns. A cell keeps float32 sums: a value finite as
// a float64 but past float32's range, or whose square is (beyond about 1e19), would make
// the cell's mean or σ infinite, and every baseline it is part of (that time of day, for
// the whole history) NaN or infinite, a threshold nothing breaches. No watched figure
// comes near it: 1e12 ms is thirty years.
const maxValue = 1e12

// learnable reports whether v is a value a cell can learn.
func learnable(v float64) bool { return v >= -maxValue && v <= maxValue }

// Add records one window's value of metric m at step; a value beyond ±1e12 (or NaN) is
// not learned.
func (s *Store[K]) Add(h *History, step int64, m int, v float64) {
	if !learnable(v) {
		return
	}
	addCell(&s.cellAt(h, step, true)[m], v, uint64(step)*31+uint64(m))
	s.touch(h, step)
}

// AddAll records one window's value of every metric whose ok is true, at step.
func (s *Store[K]) AddAll(h *History, step int64, vals []float64, ok []bool) {
	cs := s.cellAt(h, step, true)
	for m := range cs {
		if m >= len(vals) || !ok[m] || !learnable(vals[m]) {
			continue
		}
		addCell(&cs[m], vals[m], uint64(step)*31+uint64(m))
	}
	s.touch(h, step)
}

func addCell(c *cell, v float64, seed uint64) {
	c.n++
	delta := v - float64(c.mean)
	mean := float64(c.mean) + delta/float64(c.n)
	c.m2 += float32(delta * (v - mean))
	c.mean = float32(mean)
	if c.n <= reservoir {
		c.sample[c.n-1] = float32(v)
	} else if j := mix(seed, uint64(c.n)) % uint64(c.n); j < reservoir {
		c.sample[j] = float32(v)
	}
}

// Merge records a cell aggregated elsewhere (loaded from ClickHouse): n windows with this
// mean, population variance and a sample of their values. A cell whose mean, spread or
// sample is beyond what Add learns is left out whole.
func (s *Store[K]) Merge(h *History, step int64, m int, n uint64, mean, variance float64, sample []float64) {
	if n == 0 || !learnable(mean) || !(math.Abs(variance) <= maxValue*maxValue) || slices.ContainsFunc(sample, func(v float64) bool { return !learnable(v) }) {
		return
	}
	c := &s.cellAt(h, step, true)[m]
	na, nb := float64(c.n), float64(n)
	tot := na + nb
	delta := mean - float64(c.mean)
	c.mean = float32(float64(c.mean) + delta*nb/tot)
	c.m2 = float32(float64(c.m2) + variance*nb + delta*delta*na*nb/tot)
	for i, v := range sample {
		pos := uint64(c.n) + uint64(i)
		if pos < reservoir {
			c.sample[pos] = float32(v)
		} else if j := mix(uint64(step)*31+uint64(m), pos+1) % (pos + 1); j < reservoir {
			c.sample[j] = float32(v)
		}
	}
	c.n += uint32(n)
	s.touch(h, step)
}

func (s *Store[K]) touch(h *History, step int64) {
	if step > h.last {
		h.last = step
	}
	if step != h.cacheAt {
		// A past cell changed (history load, a late window): cached baselines may be stale.
		h.cacheAt = -1
	}
}

// mix is splitmix64 of a and b: a deterministic stand-in for a random reservoir index.
func mix(a, b uint64) uint64 {
	z := a*0x9e3779b97f4a7c15 + b
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Stats returns the baseline of metric m for the plan's window; robust asks for the
// median and MAD as well as the mean and σ. The first call for a window's step computes
// the mean and σ of every metric of the series in one pass over its cells; later calls in
// the same step are answered from the cache.
func (s *Store[K]) Stats(h *History, p Plan, m int, robust bool) Stats {
	if h.cacheAt != p.Step {
		s.pooled(h, p)
	}
	if robust && h.cached[m] < 2 {
		s.robust(h, p, m)
	}
	return h.cache[m]
}

// pooled computes the mean and population σ of every metric, merging the cells' Welford
// sums (Chan et al.).
func (s *Store[K]) pooled(h *History, p Plan) {
	M := s.metrics
	var acc [maxMetrics]struct{ n, mean, m2 float64 }
	lastIdx := int64(math.MinInt64)
	var b *block
	for _, step := range p.cells {
		idx := floorDiv(step, blockSize)
		if idx != lastIdx {
			lastIdx = idx
			b = h.ring[((idx%s.ringLen)+s.ringLen)%s.ringLen]
			if b != nil && b.idx != idx {
				b = nil
			}
		}
		if b == nil {
			continue
		}
		cs := b.cells[int(step-idx*blockSize)*M:][:M]
		for m := range cs {
			c := &cs[m]
			if c.n == 0 {
				continue
			}
			a := &acc[m]
			nb := float64(c.n)
			delta := float64(c.mean) - a.mean
			tot := a.n + nb
			a.mean += delta * nb / tot
			a.m2 += float64(c.m2) + delta*delta*a.n*nb/tot
			a.n = tot
		}
	}
	for m := range M {
		a := acc[m]
		st := Stats{N: int(a.n), Mean: a.mean}
		if a.n > 0 {
			st.Std = math.Sqrt(max(a.m2, 0) / a.n)
		}
		h.cache[m] = st
		h.cached[m] = 1
	}
	h.cacheAt = p.Step
}

// robust adds the median and MAD of metric m's sampled values.
func (s *Store[K]) robust(h *History, p Plan, m int) {
	samples := s.scratch[:0]
	for _, step := range p.cells {
		cs := s.cellAt(h, step, false)
		if cs == nil {
			continue
		}
		c := &cs[m]
		for i := 0; i < int(min(c.n, reservoir)); i++ {
			samples = append(samples, float64(c.sample[i]))
		}
	}
	st := &h.cache[m]
	if len(samples) > 0 {
		st.Median = median(samples)
		for i, v := range samples {
			samples[i] = math.Abs(v - st.Median)
		}
		st.MAD = 1.4826 * median(samples)
	}
	s.scratch = samples
	h.cached[m] = 2
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// median returns the median of v, reordering v. It selects rather than sorts (linear time
// on average): the median is the default baseline, computed for every metric of every
// series at each new step.
func median(v []float64) float64 {
	k := len(v) / 2
	selectNth(v, k)
	if len(v)%2 == 1 {
		return v[k]
	}
	return (slices.Max(v[:k]) + v[k]) / 2
}

// selectNth reorders v so that v[k] is the value a sort would put there, with no greater
// value before it and no smaller one after it (Hoare's selection, median-of-three pivots).
func selectNth(v []float64, k int) {
	lo, hi := 0, len(v)-1
	for hi > lo {
		mid := lo + (hi-lo)/2
		if v[mid] < v[lo] {
			v[mid], v[lo] = v[lo], v[mid]
		}
		if v[hi] < v[lo] {
			v[hi], v[lo] = v[lo], v[hi]
		}
		if v[hi] < v[mid] {
			v[hi], v[mid] = v[mid], v[hi]
		}
		pivot := v[mid]
		i, j := lo, hi
		for i <= j {
			for v[i] < pivot {
				i++
			}
			for v[j] > pivot {
				j--
			}
			if i <= j {
				v[i], v[j] = v[j], v[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return // v[j+1 : i] all equal the pivot, k among them
		}
	}
}
