package notify

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

var at = time.Date(2026, 3, 3, 12, 2, 0, 0, time.UTC)

func alert(state string) events.Alert {
	a := events.Alert{
		V: 1, Fingerprint: "0123456789abcdef", Rule: "ttft_p95_dynamic", State: state, Severity: "warning",
		Labels: map[string]string{"alertname": "ttft_p95_dynamic", "severity": "warning", "scene": "chat.v2"},
		Value:  900, Threshold: 600, BaselineMethod: "mean_sigma", BaselineCenter: 400, BaselineSpread: 100,
		WindowStart: at.Add(-time.Minute), StartsAt: at, At: at,
	}
	if state == events.AlertResolved {
		a.At = at.Add(10 * time.Minute)
		a.EndsAt = a.At
	}
	return a
}

type fakePub struct{ subjects, ids []string }

func (p *fakePub) Publish(subject, id string, data []byte) bool {
	p.subjects = append(p.subjects, subject)
	p.ids = append(p.ids, id)
	return true
}

type fakeStore struct{ err error }

func (s *fakeStore) Write(context.Context, []events.Alert) error { return s.err }

func TestSendPublishesOnSubjects(t *testing.T) {
	pub := &fakePub{}
	store := &fakeStore{}
	reg := prometheus.NewRegistry()
	n := New(pub, store, nil, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := n.Send(context.Background(), []events.Alert{alert(events.AlertFiring), alert(events.AlertResolved)}); err != nil {
		t.Fatal(err)
	}
	if pub.subjects[0] != "alerts.warning.ttft_p95_dynamic" || len(pub.subjects) != 2 {
		t.Errorf("subjects %v", pub.subjects)
	}
	if pub.ids[0] == pub.ids[1] || pub.ids[0] != "0123456789abcdef-firing-"+itoa(at.UnixMilli()) {
		t.Errorf("msg ids %v: want fingerprint-state-millis, distinct per change", pub.ids)
	}
	store.err = errors.New("ClickHouse away")
	if err := n.Send(context.Background(), []events.Alert{alert(events.AlertFiring)}); err == nil {
		t.Error("a failed row write must be reported")
	}
	if len(pub.subjects) != 3 {
		t.Error("alerts must be published even when ClickHouse fails")
	}
	if got := testutil.ToFloat64(n.storeErrors); got != 1 {
		t.Errorf("store errors %v, want 1", got)
	}
}

func itoa(v int64) string { b, _ := json.Marshal(v); return string(b) }

func TestAlertmanager(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]map[string]any
	fail := 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v2/alerts" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if fail > 0 { // the first post fails: it must be retried
			fail--
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		var body []map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		bodies = append(bodies, body)
	}))
	defer srv.Close()
	am := NewAlertmanager(srv.URL+"/", 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- am.Run(ctx) }()
	am.Enqueue([]events.Alert{alert(events.AlertFiring)})
	am.Enqueue([]events.Alert{alert(events.AlertResolved)})
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(bodies)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Alertmanager got %d posts, want 2", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	firing, resolved := bodies[0][0], bodies[1][0]
	if firing["endsAt"] != at.Add(4*time.Hour).Format(time.RFC3339) || firing["startsAt"] != at.Format(time.RFC3339) {
		t.Errorf("firing startsAt %v endsAt %v, want endsAt 4 × resend ahead", firing["startsAt"], firing["endsAt"])
	}
	if resolved["endsAt"] != at.Add(10*time.Minute).Format(time.RFC3339) {
		t.Errorf("resolved endsAt %v", resolved["endsAt"])
	}
	labels := firing["labels"].(map[string]any)
	ann := firing["annotations"].(map[string]any)
	if labels["scene"] != "chat.v2" || ann["baseline_center"] != "400" || ann["threshold"] != "600" || ann["value"] != "900" {
		t.Errorf("labels %v annotations %v", labels, ann)
	}
	if got := testutil.ToFloat64(am.failed); got != 1 {
		t.Errorf("failed posts %v, want 1", got)
	}
}
