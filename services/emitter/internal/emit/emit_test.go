package emit

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

type pub struct {
	full    bool
	subject string
	id      string
	data    []byte
}

func (p *pub) Publish(subject, id string, data []byte) bool {
	if p.full {
		return false
	}
	p.subject, p.id, p.data = subject, id, data
	return true
}

func TestEmit(t *testing.T) {
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	valid := func() *events.RequestEvent {
		return &events.RequestEvent{V: 1, EventID: "id-1", TS: now.Add(-time.Second), Model: "m", Scene: "chat.support", Env: "prod",
			InputTokens: 3, OutputTokens: 2, TTFTMs: 10, TotalMs: 20, Status: events.StatusOK}
	}
	tests := []struct {
		name    string
		mutate  func(*events.RequestEvent)
		full    bool
		wantErr error
	}{
		{"valid", func(*events.RequestEvent) {}, false, nil},
		{"ttft above total", func(e *events.RequestEvent) { e.TTFTMs = 30 }, false, events.ErrTTFTAboveTotal},
		{"no model", func(e *events.RequestEvent) { e.Model = "" }, false, events.ErrMissingField},
		{"buffer full", func(*events.RequestEvent) {}, true, ErrDropped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &pub{full: tt.full}
			e := New(p, nil, prometheus.NewRegistry())
			ev := valid()
			tt.mutate(ev)
			err := e.Emit(ev, now)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			// The scene's dot must not change the subject's shape; the payload keeps it.
			if p.subject != "llm.req.prod.chat_support" || p.id != "id-1" {
				t.Fatalf("published on %s with id %s", p.subject, p.id)
			}
			var back events.RequestEvent
			if err := events.UnmarshalRequest(p.data, &back); err != nil || back.Scene != "chat.support" {
				t.Fatalf("payload %s: %v", p.data, err)
			}
			if got := testutil.ToFloat64(e.emitted); got != 1 {
				t.Fatalf("emitted_total %v", got)
			}
		})
	}
}

// TestEmitFitsLabels: a 1 KB scene header or a 300-byte model name does not lose the
// measured request: the event is published with the label fitted, and the fit is counted.
func TestEmitFitsLabels(t *testing.T) {
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	scene := strings.Repeat("s", 1024)
	model := strings.Repeat("m", 300)
	p := &pub{}
	e := New(p, subject.New(10, time.Hour, nil), prometheus.NewRegistry())
	ev := &events.RequestEvent{V: 1, EventID: "id-1", TS: now.Add(-time.Second), Model: model, Scene: scene, Env: "prod\xff",
		ConversationID: strings.Repeat("c", 200), InputTokens: 3, OutputTokens: 2, TTFTMs: 10, TotalMs: 20, Status: events.StatusOK}
	if err := e.Emit(ev, now); err != nil {
		t.Fatalf("Emit: %v", err)
	}
	var back events.RequestEvent
	if err := events.UnmarshalRequest(p.data, &back); err != nil {
		t.Fatalf("payload %s: %v", p.data, err)
	}
	if back.Scene != events.FitLabel(scene, events.MaxLabelLen) || len(back.Scene) != events.MaxLabelLen ||
		back.Model != events.FitLabel(model, events.MaxLabelLen) || back.Env != "prod\uFFFD" ||
		len(back.ConversationID) != events.MaxIDLen {
		t.Fatalf("published %+v", back)
	}
	if p.subject != "llm.req.prod_."+strings.Repeat("s", events.MaxTokenLen) {
		t.Fatalf("subject %s", p.subject)
	}
	for _, c := range []struct {
		field, reason string
	}{{"scene", "too_long"}, {"model", "too_long"}, {"env", "not_utf8"}, {"conversation_id", "too_long"}} {
		if got := testutil.ToFloat64(e.fit.WithLabelValues(c.field, c.reason)); got != 1 {
			t.Errorf("labels_fitted_total{field=%q,reason=%q} = %v", c.field, c.reason, got)
		}
	}
	if got := testutil.ToFloat64(e.invalid.WithLabelValues("too_long")); got != 0 {
		t.Fatalf("counted invalid: %v", got)
	}
}
