package engine

import (
	"github.com/influxdata/tdigest"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// seriesAgg sums one series' rows of a window (one per instance, or one without).
type seriesAgg struct {
	hist                               *baseline.History // the series' history, looked up once
	instances                          []string          // the window's instances of the series
	rows                               int
	requests, errors, timeouts, output uint64
	seconds                            int
	ttft, tpot, total                  latencyAgg
}

// latencyAgg merges one latency digest over rows: a single row's percentile is used as
// written; several rows merge their centroids.
type latencyAgg struct {
	count   uint64
	rows    []*events.Latency
	noCents bool
}

func (l *latencyAgg) add(x *events.Latency) {
	if x.Count == 0 {
		return
	}
	l.count += x.Count
	l.rows = append(l.rows, x)
	if len(x.Means) == 0 || len(x.Means) != len(x.Weights) {
		l.noCents = true
	}
}

// quantile returns the merged q quantile; pick reads the written percentile of one row.
// Rows without centroids cannot be merged: the highest of their percentiles stands in, an
// upper bound that never averages percentiles.
func (l *latencyAgg) quantile(td *tdigest.TDigest, q float64, pick func(*events.Latency) float64) float64 {
	if len(l.rows) == 1 {
		return pick(l.rows[0])
	}
	if l.noCents {
		v := 0.0
		for _, r := range l.rows {
			v = max(v, pick(r))
		}
		return v
	}
	td.Reset()
	for _, r := range l.rows {
		for i, m := range r.Means {
			td.Add(m, float64(r.Weights[i]))
		}
	}
	return td.Quantile(q)
}

func (l *latencyAgg) reset() {
	l.count = 0
	clear(l.rows)
	l.rows = l.rows[:0]
	l.noCents = false
}

func (a *seriesAgg) add(r *events.TokenRollup) {
	a.rows++
	a.requests += r.Requests
	a.errors += r.Errors
	a.timeouts += r.Timeouts
	a.output += r.OutputTokens
	a.seconds = max(a.seconds, r.WindowSeconds)
	a.ttft.add(&r.TTFT)
	a.tpot.add(&r.TPOT)
	a.total.add(&r.Total)
}

func (a *seriesAgg) reset() {
	a.rows, a.requests, a.errors, a.timeouts, a.output, a.seconds = 0, 0, 0, 0, 0, 0
	clear(a.instances)
	a.instances = a.instances[:0]
	a.ttft.reset()
	a.tpot.reset()
	a.total.reset()
}

// values computes the series metrics; ok is false where a metric is undefined (no
// requests, no latency samples).
func (a *seriesAgg) values(td *tdigest.TDigest) (v [rules.NumSeriesMetrics]float64, ok [rules.NumSeriesMetrics]bool) {
	if a.ttft.count > 0 {
		v[rules.TTFTP95], ok[rules.TTFTP95] = a.ttft.quantile(td, 0.95, func(l *events.Latency) float64 { return l.P95 }), true
	}
	if a.tpot.count > 0 {
		v[rules.TPOTP95], ok[rules.TPOTP95] = a.tpot.quantile(td, 0.95, func(l *events.Latency) float64 { return l.P95 }), true
	}
	if a.total.count > 0 {
		v[rules.TotalP99], ok[rules.TotalP99] = a.total.quantile(td, 0.99, func(l *events.Latency) float64 { return l.P99 }), true
	}
	if a.requests > 0 {
		n := float64(a.requests)
		v[rules.ErrorRate], ok[rules.ErrorRate] = float64(a.errors)/n, true
		v[rules.TimeoutRate], ok[rules.TimeoutRate] = float64(a.timeouts)/n, true
		if a.seconds > 0 {
			v[rules.OutputTPS], ok[rules.OutputTPS] = float64(a.output)/float64(a.seconds), true
		}
	}
	return v, ok
}

// hostAgg joins one instance's token rows with its host's GPU rows.
type hostAgg struct {
	requests, output uint64
	seconds          int
	rows             []*events.TokenRollup
	gpus             int
	utilWeighted     float64
	samples          float64
	energy           float64
}

func (h *hostAgg) reset() {
	rows := h.rows
	clear(rows)
	*h = hostAgg{rows: rows[:0]}
}
