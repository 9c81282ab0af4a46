package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// publisher is the part of jetstream.JetStream the notifier uses.
type publisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// publishTimeout bounds the wait for JetStream's acknowledgement of one alert.
const publishTimeout = 5 * time.Second

// Notifier sends each alert state change to every configured destination.
type Notifier struct {
	js     publisher
	am     *Alertmanager // nil without ALERTER_ALERTMANAGER_URL
	logger *slog.Logger

	sent          *prometheus.CounterVec
	duplicates    prometheus.Counter
	publishErrors prometheus.Counter
	encodeErrors  prometheus.Counter
	publishFailed bool
	// taken holds the Nats-Msg-Ids JetStream acknowledged in a Publish that then failed:
	// its retry skips them, instead of relying on the stream's duplicate window, which an
	// outage can outlast. Cleared once a Publish succeeds.
	taken map[string]struct{}
}

// New returns a notifier publishing on js; am may be nil. Its metrics are registered on reg.
func New(js publisher, am *Alertmanager, reg prometheus.Registerer, logger *slog.Logger) *Notifier {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "alerter", Name: name, Help: help})
	}
	n := &Notifier{
		js: js, am: am, logger: logger.With("component", "notify"),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alerts_sent_total",
			Help: "Alert state changes JetStream took into the ALERTS stream, by state (firing includes re-sends) and severity.",
		}, []string{"state", "severity"}),
		duplicates:    counter("alerts_published_duplicate_total", "Alert publishes JetStream dropped as duplicates of an earlier Nats-Msg-Id (a retry or a window evaluated again)."),
		publishErrors: counter("alert_publish_errors_total", "Alert publishes JetStream did not acknowledge; the window's rollups stay unacknowledged and the publish is retried."),
		encodeErrors:  counter("alert_encode_errors_total", "Alerts that could not be encoded as JSON and were not published."),
	}
	for _, st := range []string{events.AlertFiring, events.AlertResolved} {
		for _, sev := range []string{events.SeverityWarning, events.SeverityCritical} {
			n.sent.WithLabelValues(st, sev)
		}
	}
	reg.MustRegister(n.sent, n.duplicates, n.publishErrors, n.encodeErrors)
	return n
}

// MsgID is an alert message's Nats-Msg-Id: fingerprint, transition (state) and the end of
// the window that caused it, so the same state change always has the same id and a second
// publish of it, by a retry or after a redelivery, is dropped by JetStream.
func MsgID(a *events.Alert) string {
	return a.Fingerprint + "-" + a.State + "-" + strconv.FormatInt(a.At.UnixMilli(), 10)
}

// Publish publishes the alerts to the ALERTS stream one by one, waiting (up to 5 s each)
// for JetStream to acknowledge each, and then queues them for Alertmanager. It returns an
// error, and counts it, when one was not acknowledged; the caller retries with the same
// alerts, and the ones JetStream acknowledged already are not published again (a copy
// published anyway, after a restart, is dropped as a duplicate by its Nats-Msg-Id within
// the stream's duplicate window).
func (n *Notifier) Publish(ctx context.Context, alerts []events.Alert) error {
	for i := range alerts {
		a := &alerts[i]
		data, err := encode(a)
		if err != nil {
			// Retrying cannot help: drop this one, count it, and send the others.
			n.encodeErrors.Inc()
			n.logger.Warn("cannot encode alert; it is not published", "fingerprint", a.Fingerprint, "err", err)
			continue
		}
		id := MsgID(a)
		if _, ok := n.taken[id]; ok {
			continue
		}
		m := &nats.Msg{Subject: events.AlertSubject(a.Severity, a.Rule), Data: data, Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, id)
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		ack, err := n.js.PublishMsg(pctx, m, jetstream.WithExpectStream(events.StreamAlerts))
		cancel()
		if err != nil {
			n.publishErrors.Inc()
			if !n.publishFailed {
				n.logger.Warn("cannot publish alerts; holding their rollups unacknowledged and retrying", "err", err)
				n.publishFailed = true
			}
			return fmt.Errorf("cannot publish alert %s on %s: %w", a.Fingerprint, m.Subject, err)
		}
		if n.taken == nil {
			n.taken = make(map[string]struct{})
		}
		n.taken[id] = struct{}{}
		if ack.Duplicate {
			n.duplicates.Inc()
			continue
		}
		n.sent.WithLabelValues(a.State, a.Severity).Inc()
	}
	clear(n.taken)
	if n.publishFailed {
		n.logger.Info("publishing alerts again")
		n.publishFailed = false
	}
	if n.am != nil && len(alerts) > 0 {
		n.am.Enqueue(alerts)
	}
	return nil
}

// encode marshals an alert with non-finite numbers (which JSON cannot hold) written as 0,
// as the alerts table stores them.
func encode(a *events.Alert) ([]byte, error) {
	c := *a
	c.Value, c.Threshold = finite(c.Value), finite(c.Threshold)
	c.BaselineCenter, c.BaselineSpread = finite(c.BaselineCenter), finite(c.BaselineSpread)
	data, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("cannot encode alert %s: %w", a.Fingerprint, err)
	}
	return data, nil
}

func finite(v float64) float64 {
	if v != v || v > 1e308 || v < -1e308 {
		return 0
	}
	return v
}
