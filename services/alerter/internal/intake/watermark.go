package intake

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// An aggregator's watermark (rollup.watermark.<consumer>) says every window ending at or
// before its through is closed and its rollups are ahead of it on ROLLUPS. With partitioned
// aggregators a window is evaluated only once every aggregator the intake waits for has
// passed it, so a partition that lags (restarted, replaying) does not have its rollups
// counted late. The wait is bounded by WatermarkTimeout past the settle time; an aggregator
// that makes a window time out is no longer waited for until its watermark moves again.

const (
	// maxAggregators bounds the watermarks kept; more consumer names are refused.
	maxAggregators = 1024
	// forgetAfter drops an aggregator whose watermark has not moved for this long.
	forgetAfter = time.Hour
)

// aggregator is what the intake knows of one aggregator's progress.
type aggregator struct {
	through time.Time // the latest watermark: windows ending at or before it are in
	moved   time.Time // when it last moved forward
	lagging bool      // a window timed out on it: not waited for until it moves again
}

type watermarkMetrics struct {
	received prometheus.Counter
	timeouts prometheus.Counter
	known    prometheus.Gauge
	lagging  prometheus.Gauge
}

func newWatermarkMetrics() watermarkMetrics {
	return watermarkMetrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "alerter", Name: "watermarks_received_total",
			Help: "Aggregator watermarks read from rollup.watermark.<consumer>."}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "alerter", Name: "watermark_timeouts_total",
			Help: "Windows evaluated after waiting ALERTER_WATERMARK_TIMEOUT for an aggregator whose watermark had not passed them (its later rollups of them count as late)."}),
		known: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "alerter", Name: "aggregators",
			Help: "Aggregators whose watermark the alerter has read (forgotten after an hour without progress)."}),
		lagging: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "alerter", Name: "aggregators_lagging",
			Help: "Aggregators not waited for since a window timed out on them, until their watermark moves."}),
	}
}

func (m watermarkMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.received, m.timeouts, m.known, m.lagging}
}

// addWatermark takes an aggregator's watermark message that arrived at now. It is
// acknowledged at once: a later watermark supersedes it.
func (in *Intake) addWatermark(m jetstream.Msg, now time.Time) {
	in.received.WithLabelValues("watermark").Inc()
	var w events.Watermark
	if err := decode(m.Data(), &w); err != nil {
		in.reject(m, reasonMalformed, fmt.Errorf("cannot decode watermark: %w", err))
		return
	}
	if err := checkWatermark(&w); err != nil {
		in.reject(m, reasonInvalid, err)
		return
	}
	if ahead := w.Through.Sub(now); ahead > maxAhead {
		// Taken, it would stand for its aggregator for good: a watermark never goes back.
		in.reject(m, reasonInvalid, fmt.Errorf("%w: watermark through %s is %s ahead of the clock (at most %s)",
			errInvalidRollup, w.Through.UTC().Format(time.RFC3339), ahead.Round(time.Second), maxAhead))
		return
	}
	in.wm.received.Inc()
	a := in.aggregators[w.Consumer]
	if a == nil {
		if len(in.aggregators) >= maxAggregators {
			in.reject(m, reasonInvalid, fmt.Errorf("%w: more than %d aggregators publish watermarks", errInvalidRollup, maxAggregators))
			return
		}
		a = &aggregator{}
		in.aggregators[w.Consumer] = a
		in.logger.Info("waiting for an aggregator's watermark before evaluating windows", "aggregator", w.Consumer, "through", w.Through)
	}
	if w.Through.After(a.through) {
		a.through, a.moved = w.Through.UTC(), now
		if a.lagging {
			a.lagging = false
			in.logger.Info("an aggregator's watermark moves again; windows wait for it", "aggregator", w.Consumer, "through", w.Through)
		}
	}
	in.observeAggregators(now)
	if err := m.Ack(); err != nil {
		in.ackErrors.Inc()
	}
}

func checkWatermark(w *events.Watermark) error {
	switch {
	case w.V != 1:
		return fmt.Errorf("%w: watermark v=%d, want 1", errInvalidRollup, w.V)
	case w.Consumer == "" || len(w.Consumer) > 256:
		return fmt.Errorf("%w: watermark consumer must be 1 to 256 bytes", errInvalidRollup)
	case w.Through.IsZero() || w.Through.Unix() <= 0:
		return fmt.Errorf("%w: watermark through is missing", errInvalidRollup)
	}
	return nil
}

// behind returns the aggregators waited for whose watermark has not reached end.
func (in *Intake) behind(end time.Time) []string {
	var out []string
	for name, a := range in.aggregators {
		if !a.lagging && a.through.Before(end) {
			out = append(out, name)
		}
	}
	return out
}

// waitForWatermarks reports whether window p, settled at now, must wait for a lagging
// aggregator. Past WatermarkTimeout after settling it stops waiting: the aggregators it
// waited for are no longer waited for (logged once each, counted) until they move.
func (in *Intake) waitForWatermarks(p *pendingWindow, now time.Time) bool {
	if in.opts.WatermarkTimeout <= 0 || len(in.aggregators) == 0 {
		return false
	}
	end := p.w.Start.Add(time.Duration(p.w.Seconds) * time.Second)
	lag := in.behind(end)
	if len(lag) == 0 {
		return false
	}
	if now.Sub(p.arrived) < in.opts.Settle+in.opts.WatermarkTimeout {
		return true
	}
	in.wm.timeouts.Inc()
	for _, name := range lag {
		a := in.aggregators[name]
		a.lagging = true
		in.logger.Warn("evaluating a window without an aggregator's watermark; its later rollups of it are late, and windows no longer wait for it until its watermark moves",
			"aggregator", name, "window_start", p.w.Start, "watermark", a.through, "waited", in.opts.Settle+in.opts.WatermarkTimeout)
	}
	in.observeAggregators(now)
	return false
}

// observeAggregators forgets aggregators silent for long and updates the gauges.
func (in *Intake) observeAggregators(now time.Time) {
	lagging := 0
	for name, a := range in.aggregators {
		if now.Sub(a.moved) > forgetAfter {
			delete(in.aggregators, name)
			in.logger.Info("forgetting an aggregator whose watermark has not moved", "aggregator", name, "through", a.through)
			continue
		}
		if a.lagging {
			lagging++
		}
	}
	in.wm.known.Set(float64(len(in.aggregators)))
	in.wm.lagging.Set(float64(lagging))
}

func isWatermark(subject string) bool { return strings.HasPrefix(subject, "rollup.watermark.") }
