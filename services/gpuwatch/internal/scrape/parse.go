package scrape

import (
	"errors"
	"io"
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
func families(body []byte, byName map[string]mapping) (map[string]*dto.MetricFamily, error) {
	p := textparse.NewPromParser(body, labels.NewSymbolTable(), false)
	types := map[string]dto.MetricType{}
	fams := map[string]*dto.MetricFamily{}
	hists := map[string]*dto.Metric{} // family and labels but le → the histogram being assembled
	var lset labels.Labels
	var key []byte
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			return fams, nil
		}
		if err != nil {
			return nil, err
		}
		switch entry {
		case textparse.EntryType:
			name, typ := p.Type()
			if _, ok := byName[string(name)]; ok {
				types[string(name)] = dtoType(typ)
			}
			continue
		case textparse.EntrySeries:
		default:
			continue
		}
		_, _, v := p.Series()
		p.Labels(&lset)
		name := lset.Get(model.MetricNameLabel)
		if _, ok := byName[name]; ok {
			typ, typed := types[name]
			if !typed {
				typ = dto.MetricType_UNTYPED
			}
			if typ == dto.MetricType_HISTOGRAM {
				continue // a histogram's samples are its _bucket, _count and _sum series
			}
			m := &dto.Metric{Label: labelPairs(lset, "")}
			switch typ {
			case dto.MetricType_COUNTER:
				m.Counter = &dto.Counter{Value: &v}
			case dto.MetricType_GAUGE:
				m.Gauge = &dto.Gauge{Value: &v}
			case dto.MetricType_UNTYPED:
				m.Untyped = &dto.Untyped{Value: &v}
			default:
				continue // a summary, or a type no field reads
			}
			f := family(fams, name, typ)
			f.Metric = append(f.Metric, m)
			continue
		}
		base, part := histogramPart(name)
		if part == "" || types[base] != dto.MetricType_HISTOGRAM {
			continue
		}
		key = append(key[:0], base...)
		lset.Range(func(l labels.Label) {
			if l.Name != model.BucketLabel && l.Name != model.MetricNameLabel {
				key = append(append(append(append(key, 0), l.Name...), 0), l.Value...)
			}
		})
		m := hists[string(key)] // no allocation for the lookup
		if m == nil {
			m = &dto.Metric{Label: labelPairs(lset, model.BucketLabel), Histogram: &dto.Histogram{}}
			hists[string(key)] = m
			f := family(fams, base, dto.MetricType_HISTOGRAM)
			f.Metric = append(f.Metric, m)
		}
		h := m.Histogram
		switch part {
		case "_count":
			h.SampleCountFloat = &v
		case "_sum":
			h.SampleSum = &v
		case "_bucket":
			le, err := strconv.ParseFloat(lset.Get(model.BucketLabel), 64)
			if err != nil {
				return nil, errors.New("histogram bucket " + strconv.Quote(name) + " without a numeric le")
			}
			bb := &bucket{le: le, n: v}
			bb.b.UpperBound, bb.b.CumulativeCountFloat = &bb.le, &bb.n
			h.Bucket = append(h.Bucket, &bb.b)
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
	pairs := make([]dto.LabelPair, 0, lset.Len())
	lset.Range(func(l labels.Label) {
		if l.Name != model.MetricNameLabel && l.Name != skip {
			pairs = append(pairs, dto.LabelPair{})
			p := &pairs[len(pairs)-1]
			p.Name, p.Value = new(l.Name), new(l.Value)
		}
	})
	out := make([]*dto.LabelPair, len(pairs))
	for i := range pairs {
		out[i] = &pairs[i]
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
