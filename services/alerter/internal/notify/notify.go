package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// publisher is the part of bus.Publisher the notifier uses.
type publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// rowWriter stores alerts; *Store is the ClickHouse one.
type rowWriter interface {
	Write(ctx context.Context, alerts []events.Alert) error
}

// Notifier sends each alert state change to every configured destination.
type Notifier struct {
	pub    publisher
	store  rowWriter
	am     *Alertmanager // nil without ALERTER_ALERTMANAGER_URL
	logger *slog.Logger

	sent        *prometheus.CounterVec
	storeErrors prometheus.Counter
	storeFailed bool
}

// New returns a notifier; am may be nil. Its metrics are registered on reg.
func New(pub publisher, store rowWriter, am *Alertmanager, reg prometheus.Registerer, logger *slog.Logger) *Notifier {
	n := &Notifier{
		pub: pub, store: store, am: am, logger: logger.With("component", "notify"),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alerts_sent_total",
			Help: "Alert state changes sent, by state (firing includes re-sends) and severity.",
		}, []string{"state", "severity"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alert_store_errors_total",
			Help: "Batches of alert rows ClickHouse did not take (the alerts were still published).",
		}),
	}
	for _, st := range []string{events.AlertFiring, events.AlertResolved} {
		for _, sev := range []string{events.SeverityWarning, events.SeverityCritical} {
			n.sent.WithLabelValues(st, sev)
		}
	}
	reg.MustRegister(n.sent, n.storeErrors)
	return n
}

// MsgID is an alert message's Nats-Msg-Id: the same state change always has the same id.
func MsgID(a *events.Alert) string {
	return a.Fingerprint + "-" + a.State + "-" + strconv.FormatInt(a.At.UnixMilli(), 10)
}

// Send publishes the alerts, writes their rows and queues them for Alertmanager. Only the
// row write can fail (publishing buffers and retries on its own); its error is returned
// for the caller to log, and the alerts are out on NATS regardless.
func (n *Notifier) Send(ctx context.Context, alerts []events.Alert) error {
	if len(alerts) == 0 {
		return nil
	}
	for i := range alerts {
		a := &alerts[i]
		data, err := json.Marshal(a)
		if err != nil {
			return fmt.Errorf("cannot encode alert %s: %w", a.Fingerprint, err)
		}
		n.pub.Publish(events.AlertSubject(a.Severity, a.Rule), MsgID(a), data)
		n.sent.WithLabelValues(a.State, a.Severity).Inc()
	}
	if n.am != nil {
		n.am.Enqueue(alerts)
	}
	if err := n.store.Write(ctx, alerts); err != nil {
		n.storeErrors.Inc()
		if !n.storeFailed {
			n.logger.Warn("cannot store alerts in ClickHouse; they are still published", "err", err)
			n.storeFailed = true
		}
		return err
	}
	if n.storeFailed {
		n.logger.Info("storing alerts in ClickHouse again")
		n.storeFailed = false
	}
	return nil
}
