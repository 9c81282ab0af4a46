package emit

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
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
			e := New(p, prometheus.NewRegistry())
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
