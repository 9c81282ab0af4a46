package scrape

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// FuzzExposition reads two arbitrary expositions one tick apart, as each engine kind: it
// must never panic, and every sample it makes must pass the contract (hostile values are
// left out before a sample is made, never published as an invalid one).
func FuzzExposition(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.prom")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, b)
	}
	f.Add([]byte(small(10, 1, 2, 1)), []byte(small(5, 2, 2, 3)))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		for _, kind := range []string{events.EngineVLLM, events.EngineSGLang, events.EngineTGI} {
			s, _ := newScraper(t, []Target{{Engine: kind, Name: kind, URL: "http://127.0.0.1:1/"}}, nil, 8)
			tg := s.targets[0]
			for i, body := range [][]byte{a, b} {
				now := t0.Add(time.Duration(i) * time.Second)
				fams, err := families(body, names[kind], tg.cache)
				checkHeld(t, tg.cache)
				if err != nil {
					continue
				}
				cur := s.read(tg, fams, now)
				if len(cur) > 8 {
					t.Fatalf("%d models over the limit of 8", len(cur))
				}
				for mdl, st := range cur {
					st.ts = now
					smp := events.EngineSample{V: events.Version, TS: now, Host: "h", Engine: kind, Name: kind, Model: mdl, Up: true}
					s.fill(&smp, st, tg.models[mdl])
					if err := smp.ValidateAt(now); err != nil && events.Reason(err) != "too_long" && events.Reason(err) != "not_utf8" {
						t.Fatalf("%s: sample breaks the contract: %v\n%s", kind, err, jsonOf(smp))
					}
				}
				tg.models = cur
			}
		}
	})
}

// FuzzFamilies checks the families read with textparse against expfmt, the reference
// parser of the same format: for an exposition both accept, every family gpuwatch reads
// holds the same series with the same values, histograms the same buckets, count and sum.
func FuzzFamilies(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.prom")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(small(10, 1, 2, 1)))
	f.Fuzz(func(t *testing.T, body []byte) {
		// expfmt reads "#TYPE" and a type word in any case; textparse only "# TYPE" and
		// lower case, what every writer emits. Otherwise the family is untyped to gpuwatch:
		// a gauge or counter reads the same, a histogram is not read.
		for line := range strings.Lines(string(body)) {
			w := strings.Fields(strings.TrimPrefix(line, "#"))
			if strings.HasPrefix(line, "#") && len(w) >= 3 && w[0] == "TYPE" && (w[2] != strings.ToLower(w[2]) || !strings.HasPrefix(line, "# TYPE ")) {
				return
			}
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		want, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			return
		}
		for _, kind := range []string{events.EngineVLLM, events.EngineSGLang, events.EngineTGI} {
			// twice: labels built, then read from the series cache
			c := newSeriesCache(0)
			for _, pass := range []string{"cold", "cached"} {
				got, err := families(body, names[kind], c)
				if err != nil {
					return // textparse is stricter in places (e.g. a TYPE line after its samples)
				}
				if c.dups > 0 {
					return // a series repeated is read once (TestDuplicateSeries); expfmt keeps every copy
				}
				for name, mp := range names[kind] {
					if mp.isCreated {
						continue // creation times are set aside for the deltas, not made families
					}
					g, w := canonical(got[name]), canonical(want[name])
					if g != w {
						t.Fatalf("%s %s (%s): textparse\n%s\nexpfmt\n%s", kind, name, pass, g, w)
					}
				}
			}
		}
	})
}

// canonical writes a family's series sorted, values as float64 bits where NaN is one value.
func canonical(f *dto.MetricFamily) string {
	if f == nil || len(f.GetMetric()) == 0 {
		return ""
	}
	num := func(v float64) string {
		if math.IsNaN(v) {
			return "NaN"
		}
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	var lines []string
	for _, m := range f.GetMetric() {
		var b strings.Builder
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+strconv.Quote(l.GetValue()))
		}
		slices.Sort(ls)
		b.WriteString(strings.Join(ls, ","))
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			h := m.GetHistogram()
			fmt.Fprintf(&b, " count=%s sum=%s", num(float64(h.GetSampleCount())+h.GetSampleCountFloat()), num(h.GetSampleSum()))
			var bs []string
			for _, bk := range h.GetBucket() {
				bs = append(bs, num(bk.GetUpperBound())+":"+num(float64(bk.GetCumulativeCount())+bk.GetCumulativeCountFloat()))
			}
			slices.Sort(bs)
			b.WriteString(" " + strings.Join(bs, " "))
		case dto.MetricType_COUNTER:
			b.WriteString(" " + num(m.GetCounter().GetValue()))
		case dto.MetricType_GAUGE:
			b.WriteString(" " + num(m.GetGauge().GetValue()))
		case dto.MetricType_UNTYPED:
			b.WriteString(" " + num(m.GetUntyped().GetValue()))
		default:
			return "type " + f.GetType().String()
		}
		lines = append(lines, b.String())
	}
	slices.Sort(lines)
	return f.GetType().String() + "\n" + strings.Join(lines, "\n")
}

// checkHeld fails t unless c's counts of the series held per family are those of its
// entries, within the limit.
func checkHeld(t *testing.T, c *seriesCache) {
	t.Helper()
	var held [numSlots]int
	for _, e := range c.entries {
		held[e.slot]++
	}
	pooled := held[otherSlot]
	for k := range otherSlot {
		pooled += max(0, held[k]-c.quota)
	}
	if held != c.held || pooled != c.pooled || pooled > c.pool || len(c.entries) > c.max {
		t.Fatalf("series held per family %v, pooled %d (pool %d), %d entries; counted %v, pooled %d", held, pooled, c.pool, len(c.entries), c.held, c.pooled)
	}
}
