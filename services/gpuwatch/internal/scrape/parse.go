package scrape

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
)

// families reads a text exposition with Prometheus's own streaming parser (model/textparse,
// what the Prometheus server scrapes with) and returns the families of byName only, in the
// shape expfmt gives: one dto family per name, histograms assembled from their _bucket,
// _count and _sum series. Every other series is parsed and let go without being kept, which
// is where the time goes in an engine's exposition: expfmt builds every family it meets.
// What the labels of each series kept say is remembered in c for the next scrape of the
// same endpoint. A series exposed twice (the same name and labels, in any order) is read
// once, as its first copy (what Prometheus stores of a scrape that repeats a series); c.dups
// counts the copies left out. The series of creation-time families (mapping.isCreated) are
// not made families: their values go to c.created, beside their entries.
func families(body []byte, byName map[string]mapping, c *seriesCache) (map[string]*dto.MetricFamily, error) {
	p := textparse.NewPromParser(body, labels.NewSymbolTable(), false)
	types := map[string]dto.MetricType{}
	fams := map[string]*dto.MetricFamily{}
	hists := map[string]*histogram{} // family and labels but le → the histogram being assembled
	var lset labels.Labels
	var slab []bucket
	var mtype model.MetricType // of the last TYPE line, as textparse reads the labels under it
	c.gen++
	c.dups, c.over = 0, 0
	c.overIn = [numSlots]bool{}
	c.created = c.created[:0]
	c.share(byName)
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			c.sweep()
			if c.over > 0 {
				dropShort(fams, hists, &c.overIn)
			}
			return fams, nil
		}
		if err != nil {
			// The series this scrape added are forgotten, and those it did not reach kept: an
			// engine that keeps sending malformed expositions grows nothing, and the series
			// held stay those of the last good scrape, whatever a flood the break cut short.
			c.unwind()
			return nil, err
		}
		switch entry {
		case textparse.EntryType:
			name, typ := p.Type()
			mtype = typ
			if _, ok := byName[string(name)]; ok {
				types[string(name)] = dtoType(typ)
			}
			continue
		case textparse.EntrySeries:
		default:
			continue
		}
		series, _, v := p.Series()
		slot, ok := slotOf(series, byName, types)
		if !ok {
			continue // building the labels of a series is most of its cost: only for those read
		}
		e := c.entries[string(series)] // no allocation for the lookup
		if e == nil && slot >= 0 && !c.admits(slot) {
			c.over++ // a series the last scrapes did not have, past the limit: those read before keep their place
			c.overIn[slot] = true
			continue
		}
		if e == nil || e.mtype != mtype {
			p.Labels(&lset)
			if slot < 0 { // a name in quotes: its family is known from its labels only
				slot = slotOfName(lset.Get(model.MetricNameLabel), byName)
				if e == nil && !c.admits(slot) {
					c.over++
					c.overIn[slot] = true
					continue
				}
			}
			born := c.gen
			if e != nil {
				born = e.born // the same text under another type: the same series held
			} else {
				c.hold(slot)
			}
			e = c.newEntry(lset, mtype)
			e.slot, e.born = slot, born
			c.entries[string(series)] = e
		}
		e.gen = c.gen
		if e.same.gen == c.gen {
			// a copy of a series this exposition already had, written alike or with its
			// labels in another order: added, it would count twice
			c.dups++
			continue
		}
		e.same.gen = c.gen
		if mp, ok := byName[e.name]; ok && mp.isCreated {
			c.created = append(c.created, createdSeries{e: e, v: v})
			continue
		}
		if _, ok := byName[e.name]; ok {
			typ, typed := types[e.name]
			if !typed {
				typ = dto.MetricType_UNTYPED
			}
			if typ == dto.MetricType_HISTOGRAM {
				continue // a histogram's samples are its _bucket, _count and _sum series
			}
			if typ != dto.MetricType_COUNTER && typ != dto.MetricType_GAUGE && typ != dto.MetricType_UNTYPED {
				continue // a summary, or a type no field reads
			}
			sv := &scalar{v: v}
			m := &sv.m
			m.Label = e.pairs
			switch typ {
			case dto.MetricType_COUNTER:
				sv.c.Value, m.Counter = &sv.v, &sv.c
			case dto.MetricType_GAUGE:
				sv.g.Value, m.Gauge = &sv.v, &sv.g
			default:
				sv.u.Value, m.Untyped = &sv.v, &sv.u
			}
			f := family(fams, e.name, typ)
			f.Metric = append(f.Metric, m)
			continue
		}
		if e.part == "" || types[e.base] != dto.MetricType_HISTOGRAM {
			continue
		}
		hv := hists[e.key]
		if hv == nil {
			hv = &histogram{slot: e.slot}
			hv.h.Bucket = make([]*dto.Bucket, 0, 16)
			m := &hv.m
			m.Label, m.Histogram = e.histPairs, &hv.h
			hists[e.key] = hv
			f := family(fams, e.base, dto.MetricType_HISTOGRAM)
			f.Metric = append(f.Metric, m)
		}
		h := &hv.h
		switch e.part {
		case "_count":
			hv.count = v
			h.SampleCountFloat = &hv.count
		case "_sum":
			hv.sum = v
			h.SampleSum = &hv.sum
		case "_bucket":
			if !e.leOK {
				c.unwind() // malformed like an exposition the parser refuses
				return nil, errors.New("histogram bucket " + strconv.Quote(e.name) + " without a numeric le")
			}
			if len(slab) == cap(slab) {
				slab = make([]bucket, 0, 64) // the buckets of several histograms in one allocation
			}
			slab = append(slab, bucket{le: e.le, n: v})
			bb := &slab[len(slab)-1]
			bb.b.UpperBound, bb.b.CumulativeCountFloat = &bb.le, &bb.n
			h.Bucket = append(h.Bucket, &bb.b)
		}
	}
}

// DefaultMaxSeries is the default bound on the series of the families read that an
// endpoint's scrapes hold (each histogram bucket is one; GPUWATCH_ENGINE_MAX_SERIES): a vLLM
// or SGLang model exposes some 150, and as many again per value of a label of its own (an
// SGLang tenant). The state kept for a series costs some twenty times its text, so a flood
// of label values (a tenant label, an exporter's bug) is bounded by this, not only by
// GPUWATCH_ENGINE_MAX_BYTES. A series already held (read at the last scrape) is always
// read; a new one only while the limit has room for it (see seriesCache.admits), so a
// flood that begins while a model is read cannot push the model's series out, wherever in
// the exposition they are, and what is read does not move from scrape to scrape with the
// exposition's order. New series past it are left out and counted.
const DefaultMaxSeries = 20_000

// SeriesPerModel is about how many series of the families read one model of vLLM or SGLang
// exposes: a limit on series below SeriesPerModel times the limit on models cannot hold
// the models it lets through.
const SeriesPerModel = 150

// numSlots are the families a limit's share is kept for: one per field and kind (its
// series, its creation times; a family and its older name share one), and one more for
// the series of names in quotes that no field reads.
const numSlots = 2*int(numFields) + 1

const otherSlot = numSlots - 1

// seriesCache keeps what the labels of each series say, keyed by the series' text as
// exposed (its name and labels), from one scrape of an endpoint to the next: an engine
// exposes the same series at every scrape with new values, and building the labels is most
// of a series' cost (Prometheus's scrape loop keeps the same cache). It holds the series of
// the last scrape only, so it is bounded by the largest exposition read.
type seriesCache struct {
	entries map[string]*seriesEntry
	// the series by their canonical labels (labelsKey): the texts of one series, however
	// its labels are ordered or spaced, share one
	byLabels map[string]*sameSeries
	gen      uint64
	dups     int             // series of the last scrape left out as copies of one before them
	over     int             // series of the last scrape left out, new past the limit
	overIn   [numSlots]bool  // the slots the last scrape left series out of
	created  []createdSeries // the last scrape's series of creation-time families

	// The limit: of max series, quota are kept for each family read (slot) however many
	// the others hold, and the rest, pool, is taken by the families past their quota, in
	// the exposition's order. A flood in the first family an engine exposes therefore
	// leaves every later family its quota: the model's own series of it are read.
	max, quota, pool int
	byName           map[string]mapping // whose families quota was shared out among
	held             [numSlots]int      // series held per slot
	pooled           int                // series held past their slot's quota
}

// createdSeries is one series of a creation-time family and its value.
type createdSeries struct {
	e *seriesEntry
	v float64
}

// sameSeries is one series (one name and label set), whatever text it was exposed as.
type sameSeries struct {
	key  string // labelsKey of its labels
	gen  uint64 // the last scrape that read it
	born uint64 // the scrape that first read it
}

// newSeriesCache returns a cache that holds at most maxSeries series (DefaultMaxSeries
// where it is 0 or less).
func newSeriesCache(maxSeries int) *seriesCache {
	if maxSeries <= 0 {
		maxSeries = DefaultMaxSeries
	}
	return &seriesCache{entries: map[string]*seriesEntry{}, byLabels: map[string]*sameSeries{}, max: maxSeries}
}

// share sets each family's quota for the families of byName: a quarter of the limit,
// shared equally among them.
func (c *seriesCache) share(byName map[string]mapping) {
	if c.byName != nil {
		return // an endpoint's families never change
	}
	c.byName = byName
	var used [numSlots]bool
	n := 0
	for _, mp := range byName {
		if k := slotOfMapping(mp); !used[k] {
			used[k] = true
			n++
		}
	}
	c.quota = c.max / (4 * max(n, 1))
	c.pool = c.max - n*c.quota
}

// admits reports whether a series new to the cache, of slot, is held: its family has not
// its quota yet, or the pool has room.
func (c *seriesCache) admits(slot int) bool {
	return (slot != otherSlot && c.held[slot] < c.quota) || c.pooled < c.pool
}

// hold counts a series admitted to slot.
func (c *seriesCache) hold(slot int) {
	if slot == otherSlot || c.held[slot] >= c.quota {
		c.pooled++
	}
	c.held[slot]++
}

// forget removes the entry of text k.
func (c *seriesCache) forget(k string, e *seriesEntry) {
	delete(c.entries, k)
	c.held[e.slot]--
	if e.slot == otherSlot || c.held[e.slot] >= c.quota {
		c.pooled--
	}
}

// newEntry returns the entry of a series text not cached (or cached under another type).
func (c *seriesCache) newEntry(lset labels.Labels, mtype model.MetricType) *seriesEntry {
	e := newSeriesEntry(lset, mtype)
	key := string(labelsKey(nil, lset, ""))
	e.same = c.byLabels[key]
	if e.same == nil {
		e.same = &sameSeries{key: key, born: c.gen}
		c.byLabels[key] = e.same
	}
	return e
}

// sweep forgets the series the last scrape did not have.
func (c *seriesCache) sweep() {
	for k, e := range c.entries {
		if e.gen != c.gen {
			c.forget(k, e)
		}
	}
	for k, s := range c.byLabels {
		if s.gen != c.gen {
			delete(c.byLabels, k)
		}
	}
}

// unwind forgets the series the last scrape added, and keeps the others: what a scrape
// that failed read says nothing of the series the engine has.
func (c *seriesCache) unwind() {
	for k, e := range c.entries {
		if e.born == c.gen {
			c.forget(k, e)
		}
	}
	for k, s := range c.byLabels {
		if s.born == c.gen {
			delete(c.byLabels, k)
		}
	}
}

// seriesEntry is what one series' labels say. dto values in it are shared by the families
// of every scrape that has the series, and never written after it is made.
type seriesEntry struct {
	mtype      model.MetricType // textparse writes le by the type it reads the series under
	gen        uint64           // the last scrape that had this text
	born       uint64           // the scrape that first had it
	slot       int              // its family's share of the limit (slotOf)
	same       *sameSeries      // the series, shared with the other texts of it
	name       string
	pairs      []*dto.LabelPair // the labels but the name
	base, part string           // a histogram series' family and suffix, or "" and ""
	key        string           // family and labels but le: which histogram the series is of
	histPairs  []*dto.LabelPair // the labels but the name and le
	le         float64
	leOK       bool
}

func newSeriesEntry(lset labels.Labels, mtype model.MetricType) *seriesEntry {
	e := &seriesEntry{mtype: mtype, name: lset.Get(model.MetricNameLabel), pairs: labelPairs(lset, "")}
	e.base, e.part = histogramPart(e.name)
	if e.part == "" {
		return e
	}
	key := labelsKey(appendString(nil, e.base), lset, model.BucketLabel)
	e.key, e.histPairs = string(key), labelPairs(lset, model.BucketLabel)
	le, err := strconv.ParseFloat(lset.Get(model.BucketLabel), 64)
	e.le, e.leOK = le, err == nil
	return e
}

// labelsKey appends the series' labels but its name and skip to key, each name and value
// length-prefixed: one key per label set, whatever bytes the values hold. lset is sorted by
// name (textparse sorts the labels it gives), so the order the series was written in does
// not change the key. With skip "" the name is in the key too (as the label __name__).
func labelsKey(key []byte, lset labels.Labels, skip string) []byte {
	lset.Range(func(l labels.Label) {
		if l.Name == skip || (skip != "" && l.Name == model.MetricNameLabel) {
			return
		}
		key = appendString(appendString(key, l.Name), l.Value)
	})
	return key
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// slotOf reports whether series (as textparse gives it: the name, then the labels) is of
// a family in byName or a histogram series of one, from its name alone, and the slot of
// the limit it counts in. A name in quotes (the UTF-8 form, inside the braces) is left to
// the labels to tell: it is reported wanted, in slot -1.
func slotOf(series []byte, byName map[string]mapping, types map[string]dto.MetricType) (int, bool) {
	name := series
	if i := bytes.IndexByte(series, '{'); i >= 0 {
		name = series[:i]
	}
	name = bytes.TrimRight(name, " \t")
	if len(name) == 0 || bytes.IndexByte(name, '"') >= 0 {
		return -1, true
	}
	if mp, ok := byName[string(name)]; ok { // no allocation for the lookup
		return slotOfMapping(mp), true
	}
	for _, suffix := range [...]string{"_bucket", "_count", "_sum"} {
		if base, ok := bytes.CutSuffix(name, []byte(suffix)); ok {
			if types[string(base)] != dto.MetricType_HISTOGRAM {
				return 0, false
			}
			return slotOfMapping(byName[string(base)]), true
		}
	}
	return 0, false
}

// slotOfName is the slot of a series named name, read from its labels.
func slotOfName(name string, byName map[string]mapping) int {
	if mp, ok := byName[name]; ok {
		return slotOfMapping(mp)
	}
	if base, part := histogramPart(name); part != "" {
		if mp, ok := byName[base]; ok {
			return slotOfMapping(mp)
		}
	}
	return otherSlot
}

func slotOfMapping(mp mapping) int {
	k := 2 * int(mp.f)
	if mp.isCreated {
		k++
	}
	return k
}

// scalar holds a gauge's, counter's or untyped series' dto.Metric and the values it points
// to, in one allocation.
type scalar struct {
	m dto.Metric
	c dto.Counter
	g dto.Gauge
	u dto.Untyped
	v float64
}

// histogram holds a histogram's dto.Metric and the count and sum it points to, in one
// allocation.
type histogram struct {
	m          dto.Metric
	h          dto.Histogram
	count, sum float64
	slot       int // its family's share of the limit
}

// dropShort takes out of fams the histograms the limit cut short: without their count or
// sum where their family had series left out (overIn). The parts held of one are read
// alike at every scrape the limit is full, so a sum left out would be read as 0 until the
// flood that took its place ends; the histogram is left out with it instead.
func dropShort(fams map[string]*dto.MetricFamily, hists map[string]*histogram, overIn *[numSlots]bool) {
	var short map[*dto.Metric]bool
	for _, hv := range hists {
		if overIn[hv.slot] && (hv.h.SampleCountFloat == nil || hv.h.SampleSum == nil) {
			if short == nil {
				short = map[*dto.Metric]bool{}
			}
			short[&hv.m] = true
		}
	}
	if short == nil {
		return
	}
	for name, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		f.Metric = slices.DeleteFunc(f.Metric, func(m *dto.Metric) bool { return short[m] })
		if len(f.Metric) == 0 {
			delete(fams, name)
		}
	}
}

// bucket holds a dto.Bucket and the values it points to, in one allocation.
type bucket struct {
	b     dto.Bucket
	le, n float64
}

func family(fams map[string]*dto.MetricFamily, name string, typ dto.MetricType) *dto.MetricFamily {
	f := fams[name]
	if f == nil {
		f = &dto.MetricFamily{Name: &name, Type: &typ}
		fams[name] = f
	}
	return f
}

// histogramPart splits a histogram series name into its family and suffix.
func histogramPart(name string) (base, part string) {
	for _, suffix := range [...]string{"_bucket", "_count", "_sum"} {
		if b, ok := strings.CutSuffix(name, suffix); ok {
			return b, suffix
		}
	}
	return "", ""
}

// labelPairs returns the series' labels but its name and skip.
func labelPairs(lset labels.Labels, skip string) []*dto.LabelPair {
	type pair struct {
		p           dto.LabelPair
		name, value string
	}
	pairs := make([]pair, 0, lset.Len()) // the pairs and the strings they point to, in one allocation
	lset.Range(func(l labels.Label) {
		if l.Name != model.MetricNameLabel && l.Name != skip {
			pairs = append(pairs, pair{name: l.Name, value: l.Value})
			p := &pairs[len(pairs)-1]
			p.p.Name, p.p.Value = &p.name, &p.value
		}
	})
	out := make([]*dto.LabelPair, len(pairs))
	for i := range pairs {
		out[i] = &pairs[i].p
	}
	return out
}

func dtoType(t model.MetricType) dto.MetricType {
	switch t {
	case model.MetricTypeCounter:
		return dto.MetricType_COUNTER
	case model.MetricTypeGauge:
		return dto.MetricType_GAUGE
	case model.MetricTypeHistogram:
		return dto.MetricType_HISTOGRAM
	case model.MetricTypeUnknown:
		return dto.MetricType_UNTYPED
	}
	return dto.MetricType_SUMMARY // summaries and the OpenMetrics types: no field reads them
}
