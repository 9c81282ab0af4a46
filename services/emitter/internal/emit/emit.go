package emit

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

// ErrDropped is returned when the publish buffer is full: NATS has been away too long.
var ErrDropped = errors.New("publish buffer full")

// Publisher takes an encoded message without blocking and reports whether it was buffered;
// bus.Publisher is one.
type Publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// Emitter fits, validates, encodes and publishes request events.
type Emitter struct {
	pub      Publisher
	subjects *subject.Limit
	emitted  prometheus.Counter
	invalid  *prometheus.CounterVec
	dropped  prometheus.Counter
	fit      *prometheus.CounterVec
}

// fittedFields are the labels Emit fits (events.FitLabel) rather than lose the event over.
var fittedFields = []string{"model", "scene", "env", "instance", "tenant", "provider", "error_code", "conversation_id"}

// New returns an emitter publishing through pub, on subjects bounded by subjects (nil: every
// env and scene gets its own subject), and counting in reg (nil for none).
func New(pub Publisher, subjects *subject.Limit, reg prometheus.Registerer) *Emitter {
	e := &Emitter{
		pub: pub, subjects: subjects,
		emitted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Name: "events_emitted_total",
			Help: "Request events validated and handed to the publisher."}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Name: "events_invalid_total",
			Help: "Request events that failed validation, by reason."}, []string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Name: "events_dropped_total",
			Help: "Valid request events dropped because the publish buffer was full."}),
		fit: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Name: "labels_fitted_total",
			Help: "Labels of request events cut to the contract's length (too_long) or mended (not_utf8) rather than lose the event, by field."}, []string{"field", "reason"}),
	}
	for _, r := range events.Reasons() {
		e.invalid.WithLabelValues(r)
	}
	for _, f := range fittedFields {
		e.fit.WithLabelValues(f, "too_long")
		e.fit.WithLabelValues(f, "not_utf8")
	}
	if reg != nil {
		reg.MustRegister(e.emitted, e.invalid, e.dropped, e.fit)
	}
	return e
}

// Emit fits ev's labels, validates it as of now and publishes it on llm.req.<env>.<scene>
// (bounded by the subject limit) with its event id as Nats-Msg-Id. A label too long for the
// contract, or not UTF-8, is fitted (events.FitLabel) and counted, not a reason to lose a
// measured request. It returns the validation error (wrapping events.ErrInvalidEvent) or
// ErrDropped; either way the caller carries on.
func (e *Emitter) Emit(ev *events.RequestEvent, now time.Time) error {
	for _, l := range [...]struct {
		name  string
		v     *string
		limit int
	}{
		{"model", &ev.Model, events.MaxLabelLen}, {"scene", &ev.Scene, events.MaxLabelLen}, {"env", &ev.Env, events.MaxLabelLen},
		{"instance", &ev.Instance, events.MaxLabelLen}, {"tenant", &ev.Tenant, events.MaxLabelLen},
		{"provider", &ev.Provider, events.MaxLabelLen}, {"error_code", &ev.ErrorCode, events.MaxLabelLen},
		{"conversation_id", &ev.ConversationID, events.MaxIDLen},
	} {
		if v := events.FitLabel(*l.v, l.limit); v != *l.v {
			reason := "too_long"
			if !utf8.ValidString(*l.v) {
				reason = "not_utf8"
			}
			e.fit.WithLabelValues(l.name, reason).Inc()
			*l.v = v
		}
	}
	if err := ev.ValidateAt(now); err != nil {
		e.invalid.WithLabelValues(events.Reason(err)).Inc()
		return err
	}
	var subj string
	if e.subjects != nil {
		subj = e.subjects.Request(ev.Env, ev.Scene, now)
	} else {
		subj = events.RequestSubject(ev.Env, ev.Scene)
	}
	data := events.AppendRequest(make([]byte, 0, 512), ev)
	if !e.pub.Publish(subj, ev.EventID, data) {
		e.dropped.Inc()
		return fmt.Errorf("cannot publish event %s: %w", ev.EventID, ErrDropped)
	}
	e.emitted.Inc()
	return nil
}

// EmitFeedback validates fb as of now and publishes it on llm.feedback.<env>.<scene>, under
// the same subject bound as the request events, with its event id as Nats-Msg-Id. It is not
// counted in the request events' metrics.
func (e *Emitter) EmitFeedback(fb *events.FeedbackEvent, now time.Time) error {
	if err := fb.ValidateAt(now); err != nil {
		return err
	}
	subj := events.FeedbackSubject(fb.Env, fb.Scene)
	if e.subjects != nil {
		subj = "llm.feedback." + strings.TrimPrefix(e.subjects.Request(fb.Env, fb.Scene, now), "llm.req.")
	}
	if !e.pub.Publish(subj, fb.EventID, events.AppendFeedback(make([]byte, 0, 256), fb)) {
		return fmt.Errorf("cannot publish feedback %s: %w", fb.EventID, ErrDropped)
	}
	return nil
}
