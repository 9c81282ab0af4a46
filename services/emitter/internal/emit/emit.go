package emit

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// ErrDropped is returned when the publish buffer is full: NATS has been away too long.
var ErrDropped = errors.New("publish buffer full")

// Publisher takes an encoded message without blocking and reports whether it was buffered;
// bus.Publisher is one.
type Publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// Emitter validates, encodes and publishes request events.
type Emitter struct {
	pub     Publisher
	emitted prometheus.Counter
	invalid *prometheus.CounterVec
	dropped prometheus.Counter
}

// New returns an emitter publishing through pub and counting in reg (nil for none).
func New(pub Publisher, reg prometheus.Registerer) *Emitter {
	e := &Emitter{
		pub: pub,
		emitted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Name: "events_emitted_total",
			Help: "Request events validated and handed to the publisher."}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Name: "events_invalid_total",
			Help: "Request events that failed validation, by reason."}, []string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Name: "events_dropped_total",
			Help: "Valid request events dropped because the publish buffer was full."}),
	}
	for _, r := range events.Reasons() {
		e.invalid.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(e.emitted, e.invalid, e.dropped)
	}
	return e
}

// Emit validates ev as of now and publishes it on llm.req.<env>.<scene> with its event id
// as Nats-Msg-Id. It returns the validation error (wrapping events.ErrInvalidEvent) or
// ErrDropped; either way the caller carries on.
func (e *Emitter) Emit(ev *events.RequestEvent, now time.Time) error {
	if err := ev.ValidateAt(now); err != nil {
		e.invalid.WithLabelValues(events.Reason(err)).Inc()
		return err
	}
	data := events.AppendRequest(make([]byte, 0, 512), ev)
	if !e.pub.Publish(events.RequestSubject(ev.Env, ev.Scene), ev.EventID, data) {
		e.dropped.Inc()
		return fmt.Errorf("cannot publish event %s: %w", ev.EventID, ErrDropped)
	}
	e.emitted.Inc()
	return nil
}
