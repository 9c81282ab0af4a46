package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// metrics of one pipeline, labelled by which stream it consumes ("tokens" or "gpu").
type metrics struct {
	added, late, skipped, redelivered, duplicate                             prometheus.Counter
	consumeErrors, flushErrors, ackErrors, deadLetterErrors, rowsWritten     prometheus.Counter
	invalid                                                                  *prometheus.CounterVec
	flushDuration, writeDelay                                                prometheus.Observer
	paused, ackFloor, buffered, openWindows, activeKeys, watermarkDelay, lag prometheus.Gauge
	folded, restarts, republished                                            prometheus.Counter
	writeStalled, publishStalled, watermarkHeld                              prometheus.Gauge
}

// Metrics are shared by the pipelines of one aggregator.
type Metrics struct {
	events, invalid                                              *prometheus.CounterVec
	consumeErrors, flushErrors, ackErrors, deadLetterErrors      *prometheus.CounterVec
	rowsWritten                                                  *prometheus.CounterVec
	flushDuration, writeDelay                                    *prometheus.HistogramVec
	paused, ackFloor, buffered, openWindows, activeKeys, wmDelay *prometheus.GaugeVec
	lag                                                          *prometheus.GaugeVec
	folded, restarts, republished                                *prometheus.CounterVec
	writeStalled, publishStalled, watermarkHeld                  *prometheus.GaugeVec
}

// NewMetrics registers the aggregator's pipeline metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "aggregator"
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, append([]string{"stream"}, labels...))
	}
	gv := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help}, []string{"stream"})
	}
	m := &Metrics{
		events:           cv("events_total", "Messages consumed, by what became of them: added to an open window, late (into a correction), skipped (already stored before a restart), redelivered (already held), duplicate (a feedback event_id already counted).", "result"),
		invalid:          cv("invalid_total", "Messages dead-lettered on llm.invalid, by reason.", "reason"),
		consumeErrors:    cv("consume_errors_total", "Errors pulling from JetStream."),
		flushErrors:      cv("flush_errors_total", "Failed attempts to write a flush to ClickHouse (each is retried)."),
		ackErrors:        cv("ack_errors_total", "Replay floors not saved (the next flush saves a later one)."),
		deadLetterErrors: cv("dead_letter_errors_total", "Dead letters that could not be published."),
		rowsWritten:      cv("rows_written_total", "Rows written to ClickHouse (rollups and requests)."),
		flushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "flush_duration_seconds",
			Help: "Time to write one flush to ClickHouse.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"stream"}),
		writeDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "window_write_delay_seconds",
			Help: "From a window's end to its rollups being in ClickHouse (freshness).", Buckets: prometheus.LinearBuckets(5, 5, 20)}, []string{"stream"}),
		paused:         gv("paused", "1 while pulling is paused because the memory bound is reached (ClickHouse away)."),
		ackFloor:       gv("ack_floor", "Replay floor saved: the stream sequence stored through."),
		buffered:       gv("buffered", "Request events and rows held in memory, not yet written."),
		openWindows:    gv("open_windows", "Windows and corrections held open."),
		activeKeys:     gv("active_keys", "Series × bucket keys held in open windows."),
		wmDelay:        gv("watermark_delay_seconds", "How far the watermark is behind the clock."),
		lag:            gv("consumer_lag_messages", "Messages in the stream not yet delivered to the aggregator (read every 10 s)."),
		folded:         cv("series_folded_total", "Events whose series was folded into \"other\" by AGG_MAX_SERIES."),
		writeStalled:   gv("write_stalled_seconds", "How long the flush being written has waited to be stored so far; 0 when none is. Past 10 s (or 3 flush intervals) it is logged and /readyz fails."),
		publishStalled: gv("publish_stalled_seconds", "How long the stored flush being published has waited for JetStream to acknowledge all its rollups so far; 0 when none is. Past 10 s (or 3 flush intervals) it is logged and /readyz fails."),
		republished:    cv("rollups_republished_total", "Rollups published again at start from rollup_outbox: stored by the last process, not acknowledged by JetStream when it stopped."),
		watermarkHeld:  gv("watermark_held", "1 while the pipeline holds the published watermark: it publishes again, at start, rollups stored before the last stop, or reads the messages its stream held past its floor at start."),
		restarts:       cv("consumer_restarts_total", "Times delivery started again from the last message processed: after a gap in the delivery sequence, a missed heartbeat or a reconnect to NATS."),
	}
	reg.MustRegister(m.events, m.invalid, m.consumeErrors, m.flushErrors, m.ackErrors, m.deadLetterErrors, m.rowsWritten,
		m.flushDuration, m.writeDelay, m.paused, m.ackFloor, m.buffered, m.openWindows, m.activeKeys, m.wmDelay, m.lag, m.folded, m.restarts, m.writeStalled, m.publishStalled, m.republished, m.watermarkHeld)
	return m
}

func (m *Metrics) forStream(stream string) *metrics {
	for _, r := range []string{"added", "late", "skipped", "redelivered", "duplicate"} {
		m.events.WithLabelValues(stream, r)
	}
	for _, r := range append(events.Reasons(), "no_metadata") {
		m.invalid.WithLabelValues(stream, r)
	}
	return &metrics{
		added:            m.events.WithLabelValues(stream, "added"),
		late:             m.events.WithLabelValues(stream, "late"),
		skipped:          m.events.WithLabelValues(stream, "skipped"),
		redelivered:      m.events.WithLabelValues(stream, "redelivered"),
		duplicate:        m.events.WithLabelValues(stream, "duplicate"),
		invalid:          m.invalid.MustCurryWith(prometheus.Labels{"stream": stream}),
		consumeErrors:    m.consumeErrors.WithLabelValues(stream),
		flushErrors:      m.flushErrors.WithLabelValues(stream),
		ackErrors:        m.ackErrors.WithLabelValues(stream),
		deadLetterErrors: m.deadLetterErrors.WithLabelValues(stream),
		rowsWritten:      m.rowsWritten.WithLabelValues(stream),
		flushDuration:    m.flushDuration.WithLabelValues(stream),
		writeDelay:       m.writeDelay.WithLabelValues(stream),
		paused:           m.paused.WithLabelValues(stream),
		ackFloor:         m.ackFloor.WithLabelValues(stream),
		buffered:         m.buffered.WithLabelValues(stream),
		openWindows:      m.openWindows.WithLabelValues(stream),
		activeKeys:       m.activeKeys.WithLabelValues(stream),
		watermarkDelay:   m.wmDelay.WithLabelValues(stream),
		lag:              m.lag.WithLabelValues(stream),
		folded:           m.folded.WithLabelValues(stream),
		restarts:         m.restarts.WithLabelValues(stream),
		republished:      m.republished.WithLabelValues(stream),
		writeStalled:     m.writeStalled.WithLabelValues(stream),
		publishStalled:   m.publishStalled.WithLabelValues(stream),
		watermarkHeld:    m.watermarkHeld.WithLabelValues(stream),
	}
}
